"""``RateLimitMiddleware``: the app-wide ``MODERATO['RATE']``, and the headers of every limit.

::

    MIDDLEWARE = [
        ...,
        "moderato.django.RateLimitMiddleware",
        ...,
    ]
    MODERATO = {"RATE": "1000/hour", "EXEMPT_PATHS": ["/healthz", "/static/*"]}

Each request (but those of ``EXEMPT_PATHS``, matched below SCRIPT_NAME as
web/paths.py says) is charged against ``RATE`` per ``MODERATO['KEY']``
(the client address unless set), in one quota named ``app``, before the
rest of the stack runs: a refused request gets 429 (or 503 when Redis cannot
decide) and reaches no view. Without ``RATE`` it limits nothing and only
reports. On the way out it writes the quota headers of every decision taken
for the request: its own, the views' ``limit()``, the REST framework
throttles': the most restrictive policy, as the ASGI middleware does.

The app-wide limit and the ``limit()`` decorators of the view the URL
resolves to are decided as one (together.py): admitted only if every one
admits, each charged on its own counter, none charged when one refuses; the
decorators then find the decision taken. Place the middleware after
AuthenticationMiddleware when ``KEY`` is ``"user"`` or ``"user_or_ip"``.

It serves sync and async stacks alike (Django picks): under ASGI it decides
on the event loop with the asyncio limiter, under WSGI in the worker's
thread with the blocking one.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from ..errors import BackendError, RateLimitCallbackError, RateLimitExceeded
from .conf import Settings
from .decisions import answered, mark_middleware
from .limiters import get_settings
from .responses import aanswer, add_quota_headers, answer
from .rule import LimitRule
from .together import Limit, adecide, decide, resolved_view_rules, view_limits

APP_SCOPE = "app"
"""The bucket of the app-wide limit, shared by every path."""

_ANSWERED_ERRORS = (RateLimitExceeded, BackendError, RateLimitCallbackError)


class RateLimitMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
        # Django builds its middleware chain before serving: bad settings stop start-up here.
        get_settings()

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        settings = get_settings()
        mark_middleware(request)
        rule = _app_rule(settings, request)
        if rule is not None:
            try:
                decide(request, settings, _limits(rule, request))
            except _ANSWERED_ERRORS as error:
                return answer(request, error, settings)
        response = self.get_response(request)
        return _reported(request, response, settings)

    async def __acall__(self, request: HttpRequest) -> Any:
        settings = get_settings()
        mark_middleware(request)
        rule = _app_rule(settings, request)
        if rule is not None:
            try:
                await adecide(request, settings, _limits(rule, request))
            except _ANSWERED_ERRORS as error:
                return await aanswer(request, error, settings)
        response = await self.get_response(request)
        return _reported(request, response, settings)


def _limits(rule: LimitRule, request: HttpRequest) -> list[Limit]:
    """The app-wide limit and those of the view the request will reach, to decide as one."""
    return [Limit(rule, APP_SCOPE), *view_limits(resolved_view_rules(request), request)]


def _app_rule(settings: Settings, request: HttpRequest) -> Optional[LimitRule]:
    """The app-wide rule if it applies to this request (a RATE, and a path not exempt)."""
    rate = settings.rate
    if rate is None or settings.exempt_paths.match(request.path_info):
        return None
    rule = _rules.get(rate)
    if rule is None:
        rule = _rules[rate] = LimitRule(rate)
    return rule


_rules: dict[str, LimitRule] = {}
"""The app-wide rule of each RATE met (one, unless settings are overridden in tests)."""


def _reported(request: HttpRequest, response: HttpResponseBase, settings: Settings) -> Any:
    if not answered(request):  # a moderato 429/422/503 carries its own headers
        add_quota_headers(request, response, settings.headers)
    return response
