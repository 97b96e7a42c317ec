"""Function views (sync and async) and class-based views, limited by ``moderato.django.limit``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import URLPattern, path
from django.utils.decorators import method_decorator
from django.views import View

from moderato.algorithms import ALGORITHMS
from moderato.django import limit


def healthz(request: HttpRequest) -> JsonResponse:
    """Exempt from the app-wide RATE (MODERATO['EXEMPT_PATHS'])."""
    return JsonResponse({"status": "ok"})


@limit("10/minute")  # per client address, scope GET:/hello/
def hello(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "sync"})


@limit("10/minute")
async def hello_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"hello": "async"})


@limit("30/minute", key="user_or_ip")  # /items/1/ and /items/2/ share GET:/items/<int:pk>/
def item(request: HttpRequest, pk: int) -> JsonResponse:
    return JsonResponse({"item": pk})


@limit("5/minute", key="get:q", algorithm="token_bucket")  # one quota per search term
def search(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"q": request.GET.get("q", "")})


# A sync view and an async view with one scope: one quota between them.
@limit("10/minute", scope="shared")
def shared_sync(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"view": "sync"})


@limit("10/minute", scope="shared")
async def shared_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"view": "async"})


@method_decorator(limit("5/minute", key="header:x-api-key", methods="GET"), name="get")
class ReportView(View):
    def get(self, request: HttpRequest) -> JsonResponse:
        return JsonResponse({"report": "sync"})

    def post(self, request: HttpRequest) -> JsonResponse:  # not counted: methods="GET"
        return JsonResponse({"report": "posted"})


@method_decorator(limit("5/minute", key="user_or_ip"), name="get")
class AsyncReportView(View):
    async def get(self, request: HttpRequest) -> JsonResponse:
        return JsonResponse({"report": "async"})


def _ten(request: HttpRequest, **_: Any) -> JsonResponse:
    return JsonResponse({"admitted": True})


async def _ten_async(request: HttpRequest, **_: Any) -> JsonResponse:
    return JsonResponse({"admitted": True})


def ten_per_minute_routes() -> list[URLPattern]:
    """``/ten/<algorithm>/`` (sync) and ``/ten-async/<algorithm>/``: "10/minute" per client
    on each algorithm, for comparing them under load."""
    routes = []
    for name in ALGORITHMS:
        routes.append(path(f"ten/{name}/", limit("10/minute", algorithm=name)(_ten)))
        routes.append(path(f"ten-async/{name}/", limit("10/minute", algorithm=name)(_ten_async)))
    return routes


def ratelimited(request: HttpRequest, exception: Any) -> JsonResponse:
    """A denial view of your own (MODERATO['DENIAL_VIEW'] = "shop.views.ratelimited")."""
    return JsonResponse({"detail": "Slow down", "retry_after": exception.retry_after}, status=429)
