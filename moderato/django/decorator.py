"""``limit()``: a rate limit on a Django view, sync or async, function or class-based.

::

    @limit("10/minute")                          # per client address
    def search(request): ...

    @limit("100/hour", key="user_or_ip", methods=["POST"])
    async def upload(request): ...

    @method_decorator(limit("5/minute", key="header:x-api-key"), name="post")
    class Export(View): ...

A request the limit refuses never reaches the view: it gets 429 (422 for a
cost above capacity) or 503 (responses.py). An admitted response carries the
quota headers (written by RateLimitMiddleware when it is installed, else
here). Several ``limit()`` on one view, and RateLimitMiddleware's app-wide
``RATE``, are decided as one (together.py): a request one of them refuses is
charged by none.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest

from ..errors import BackendError, RateLimitCallbackError, RateLimitConfigError, RateLimitExceeded
from .decisions import has_middleware
from .errors import ModeratoImproperlyConfigured
from .limiters import get_settings
from .responses import aanswer, add_quota_headers, answer
from .rule import LimitOptions, LimitRule, RateOption
from .together import LIMITS_ATTRIBUTE, Limit, adecide, check_stack, decide, decided, view_limits

if TYPE_CHECKING:
    from typing_extensions import Unpack

View = TypeVar("View", bound=Callable[..., Any])

_ANSWERED_ERRORS = (RateLimitExceeded, BackendError, RateLimitCallbackError)


def limit(rate: RateOption, **options: Unpack[LimitOptions]) -> Callable[[View], View]:
    """A decorator limiting a view to ``rate`` per identity.

    - ``rate``: ``"10/minute"``, ``"5/m"``, ``"100/hour;1000/day"`` (every policy
      decided at once), or a callable of the request returning one (or its dotted path);
    - ``key``: ``"ip"``, ``"user"``, ``"user_or_ip"``, ``"header:<name>"``,
      ``"get:<name>"``, ``"post:<name>"``, a dotted path to a callable of the
      request, or the callable (keys.py); default ``MODERATO['KEY']``, ``"ip"``;
    - ``algorithm``: default ``MODERATO['DEFAULT_ALGORITHM']``;
    - ``cost``: units charged per request (an int, a callable of the request, or its
      dotted path); default 1;
    - ``scope``: the bucket's name; default the method and the URL pattern that
      matched (``GET:/items/<int:pk>``), so views giving one ``scope`` share a quota;
    - ``tenant``: a tenant name, or a callable of the request returning one (or None);
    - ``methods``: the methods counted (``"POST"``, ``["GET", "POST"]``, ``UNSAFE``);
      default every method (HEAD counts as GET).

    A bad argument raises ImproperlyConfigured (a ModeratoImproperlyConfigured)
    here, when the views module is imported.
    """
    try:
        rule = LimitRule(rate, **options)
    except RateLimitConfigError as error:
        raise ModeratoImproperlyConfigured(f"limit({rate!r:.40}): {error}") from None

    def decorate(view: View) -> View:
        stack: tuple[LimitRule, ...] = (*getattr(view, LIMITS_ATTRIBUTE, ()), rule)
        try:
            check_stack(stack)
        except RateLimitConfigError as error:
            raise ModeratoImproperlyConfigured(f"limit({rate!r:.40}): {error}") from None
        limited: Callable[..., Any]
        if iscoroutinefunction(view):

            async def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
                _check_request(view, request)
                settings = get_settings()
                limits = _undecided(rule, stack, request)
                if limits:
                    try:
                        await adecide(request, settings, limits)
                    except _ANSWERED_ERRORS as error:
                        return await aanswer(request, error, settings)
                response = await view(request, *args, **kwargs)
                if not has_middleware(request):
                    add_quota_headers(request, response, settings.headers)
                return response

        else:

            def limited(request: Any, *args: Any, **kwargs: Any) -> Any:
                _check_request(view, request)
                settings = get_settings()
                limits = _undecided(rule, stack, request)
                if limits:
                    try:
                        decide(request, settings, limits)
                    except _ANSWERED_ERRORS as error:
                        return answer(request, error, settings)
                response = view(request, *args, **kwargs)
                if not has_middleware(request):
                    add_quota_headers(request, response, settings.headers)
                return response

        functools.update_wrapper(limited, view)
        setattr(limited, LIMITS_ATTRIBUTE, stack)
        return limited  # type: ignore[return-value]

    return decorate


def _undecided(rule: LimitRule, stack: Sequence[LimitRule], request: Any) -> list[Limit]:
    """What this decorator decides: nothing when its rule does not count the request or
    was decided already (by RateLimitMiddleware, or an outer ``limit()``); else the
    view's limits not decided yet (its own and those inside it), as one."""
    if not rule.applies(request):
        return []
    done = decided(request)
    if done is not None and id(rule) in done:
        return []
    limits = view_limits(stack, request)
    return [limit for limit in limits if done is None or id(limit.rule) not in done]


def _check_request(view: Callable[..., Any], request: object) -> None:
    # A REST framework Request wraps an HttpRequest.
    if not isinstance(getattr(request, "_request", request), HttpRequest):
        raise TypeError(
            f"limit() on {getattr(view, '__qualname__', view)!r} was given "
            f"{type(request).__name__}, not the request: on a method of a class-based view, "
            "apply it with django.utils.decorators.method_decorator(limit(...))"
        )
