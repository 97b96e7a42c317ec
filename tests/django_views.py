"""The views and URLs of the in-process Django tests (ROOT_URLCONF of django_support)."""

from __future__ import annotations

from typing import Any, Optional

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.response import Response
from rest_framework.views import APIView

from moderato.django import limit
from moderato.django.throttling import AnonRateThrottle, ScopedRateThrottle, UserRateThrottle


class User:
    is_authenticated = True
    is_anonymous = False

    def __init__(self, pk: int) -> None:
        self.pk = pk


class HeaderUser:
    """Test middleware: ``X-User: 7`` authenticates as user 7 (sync and async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        user_of(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> Any:
        user_of(request)
        return await self.get_response(request)


def user_of(request: HttpRequest) -> None:
    user_id = request.headers.get("X-User", "")
    user = User(int(user_id)) if user_id.isdigit() else AnonymousUser()
    request.user = user
    if user_id == "8":  # as Django 5's AuthenticationMiddleware also sets it (auser)

        async def auser() -> Any:
            return user

        request.auser = auser  # type: ignore[attr-defined]


class HeaderAuthentication:
    def authenticate(self, request: Any) -> Optional[tuple[User, None]]:
        user_id = request.headers.get("X-User", "")
        return (User(int(user_id)), None) if user_id.isdigit() else None


def ok(request: HttpRequest, **_: Any) -> JsonResponse:
    return JsonResponse({"ok": True})


async def ok_async(request: HttpRequest, **_: Any) -> JsonResponse:
    return JsonResponse({"ok": True})


def cost_of(request: HttpRequest) -> int:
    return int(request.GET["cost"])


def api_key_of(request: HttpRequest) -> str:
    return "key:" + request.headers.get("X-Key", "none")


async def api_key_async(request: HttpRequest) -> str:
    return "key:" + request.headers.get("X-Key", "none")


@method_decorator(limit("2/hour"), name="get")
class SyncClassView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("sync class")


@method_decorator(limit("2/hour"), name="get")
class AsyncClassView(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("async class")


class AnonApi(APIView):
    throttle_classes = (AnonRateThrottle,)
    authentication_classes = (HeaderAuthentication,)

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class UserApi(AnonApi):
    throttle_classes = (UserRateThrottle,)


class ScopedApi(AnonApi):
    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "uploads"


class UnscopedApi(AnonApi):
    throttle_classes = (ScopedRateThrottle,)


class WideThrottle(UserRateThrottle):
    scope = "wide"
    rate = "5/minute"


class NarrowThrottle(UserRateThrottle):
    scope = "narrow"
    rate = "2/minute"


class TwoThrottlesApi(AnonApi):
    throttle_classes = (WideThrottle, NarrowThrottle)


class DefaultApi(APIView):
    """DEFAULT_THROTTLE_CLASSES, as the settings are when the view runs."""

    authentication_classes = (HeaderAuthentication,)

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


@method_decorator(limit("2/minute"), name="get")
class NarrowClassView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("narrow class")


limited_sync = limit("5/hour")(ok)
limited_items = limit("3/hour")(ok)

urlpatterns = [
    path("plain/", ok),
    path("healthz", ok),
    path("sync/", limited_sync),
    path("async/", limit("5/hour")(ok_async)),
    path("items/<int:pk>/", limited_items),
    path("goods/<int:pk>/", limited_items),
    path("cbv/", SyncClassView.as_view()),
    path("acbv/", AsyncClassView.as_view()),
    path("key/ip/", limit("2/hour", key="ip")(ok)),
    path("key/user/", limit("2/hour", key="user")(ok)),
    path("key/user-async/", limit("2/hour", key="user")(ok_async)),
    path("key/user_or_ip/", limit("2/hour", key="user_or_ip")(ok)),
    path("key/header/", limit("2/hour", key="header:x-api-key")(ok)),
    path("key/get/", limit("2/hour", key="get:q")(ok)),
    path("key/post/", limit("2/hour", key="post:account")(ok)),
    path("key/dotted/", limit("2/hour", key="django_views.api_key_of")(ok)),
    path("key/callable/", limit("2/hour", key=api_key_of)(ok)),
    path("key/async-callable/", limit("2/hour", key=api_key_async)(ok_async)),
    path("methods/", limit("2/hour", methods=["POST"])(ok)),
    path("costly/", limit("10/hour", cost=cost_of)(ok)),
    path("costly-async/", limit("10/hour", cost=cost_of)(ok_async)),
    path("broken/", limit("10/hour", key=lambda request: 1 / 0)(ok)),
    path("broken-async/", limit("10/hour", tenant=lambda request: 1 / 0)(ok_async)),
    path("tenant/", limit("2/hour", tenant=lambda request: request.GET.get("tier"))(ok)),
    path("rate/", limit(lambda request: request.GET.get("rate", "2/hour"))(ok)),
    path("shared-sync/", limit("4/hour", scope="shared")(ok)),
    path("shared-async/", limit("4/hour", scope="shared")(ok_async)),
    path("narrow/", limit("2/minute")(ok)),
    path("narrow-async/", limit("2/minute")(ok_async)),
    path("narrow-cbv/", NarrowClassView.as_view()),
    path("twice/", limit("10/minute")(limit("4/minute")(ok))),
    path("stacked/", limit("3/hour", scope="outer")(limit("2/hour", scope="inner")(ok))),
    path("api/anon/", AnonApi.as_view()),
    path("api/user/", UserApi.as_view()),
    path("api/scoped/", ScopedApi.as_view()),
    path("api/unscoped/", UnscopedApi.as_view()),
    path("api/default/", DefaultApi.as_view()),
    path("api/two/", TwoThrottlesApi.as_view()),
]
