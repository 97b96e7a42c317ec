"""The responses of the Django integration: the ASGI integration's, as HttpResponses.

429 (or 422 for a cost above capacity) with ``Retry-After`` and the
``X-RateLimit-*`` headers of the policy that denied; 503 when the backend
could not decide or a callback failed: the same statuses, JSON bodies and
headers as the ASGI middlewares (web/responses.py, web/headers.py). A
``MODERATO['DENIAL_VIEW']`` renders the denials (429/422) instead, as
django-ratelimit's ``RATELIMIT_VIEW`` does: it is called as
``view(request, exception)`` with the RateLimitExceeded, and its response
gets the headers it did not set itself. Admitted responses get the quota
headers of every decision taken for the request.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.http import HttpResponse, HttpResponseBase

from ..errors import RateLimitExceeded
from ..web.headers import HeaderList, HeaderStyle, legacy_for_denial, legacy_for_one, render, report
from ..web.responses import JSON_CONTENT_TYPE, ErrorResponse, encoded_body, error_response
from .conf import Settings
from .decisions import mark_answered, recorded


def answer(request: Any, error: Exception, settings: Settings) -> HttpResponseBase:
    """The response for a moderato exception raised for ``request`` (in a thread)."""
    found = _found(error)
    view = settings.denial_view
    if view is not None and found.denial is not None:
        if iscoroutinefunction(view):
            response = async_to_sync(view)(request, found.denial)
        else:
            response = view(request, found.denial)
        return _finished(request, response, found, settings.headers)
    return _finished(request, _json(found), found, settings.headers)


async def aanswer(request: Any, error: Exception, settings: Settings) -> HttpResponseBase:
    """``answer`` on the event loop (a sync denial view runs in a thread)."""
    found = _found(error)
    view = settings.denial_view
    if view is not None and found.denial is not None:
        if iscoroutinefunction(view):
            response = await view(request, found.denial)
        else:
            response = await sync_to_async(view)(request, found.denial)
        return _finished(request, response, found, settings.headers)
    return _finished(request, _json(found), found, settings.headers)


def _found(error: Exception) -> ErrorResponse:
    found = error_response(error)
    if found is None:  # only moderato's exceptions reach here
        raise error
    return found


def _json(found: ErrorResponse) -> HttpResponse:
    return HttpResponse(
        encoded_body(found.body), status=found.status, content_type=JSON_CONTENT_TYPE
    )


def _finished(
    request: Any, response: HttpResponseBase, found: ErrorResponse, style: HeaderStyle
) -> HttpResponseBase:
    for name, value in denial_headers(request, found.denial, style):
        response.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    mark_answered(request)
    return response


def denial_headers(
    request: Any, denial: Optional[RateLimitExceeded], style: HeaderStyle
) -> HeaderList:
    """Quota headers and Retry-After for a denial (the policy that denied); none for a 503."""
    if denial is None:
        return []
    if style == "legacy":  # the default: no Report needed
        return legacy_for_denial(recorded(request), denial)
    denial_report = report(recorded(request), denial)
    return [] if denial_report is None else render(denial_report, style, time.time())


def add_quota_headers(request: Any, response: HttpResponseBase, style: HeaderStyle) -> None:
    """The quota headers of the decisions taken for ``request``, on an admitted response
    (those the application set itself are left as they are)."""
    decisions = recorded(request)
    if not decisions:
        return
    headers = legacy_for_one(decisions[0]) if style == "legacy" and len(decisions) == 1 else None
    if headers is None:
        decided = report(decisions)
        headers = [] if decided is None else render(decided, style, time.time())
    for name, value in headers:
        response.setdefault(name.decode("latin-1"), value.decode("latin-1"))
