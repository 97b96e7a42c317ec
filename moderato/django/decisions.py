"""The decisions taken for one Django request, kept on the request for the headers.

A decorator, a REST framework throttle and RateLimitMiddleware may each
decide for one request; the response's quota headers describe them all (the
most restrictive policy, as web/headers.py picks). With RateLimitMiddleware
installed, it writes the headers once, on the way out; without it, each
decorator writes them on the response of its view.
"""

from __future__ import annotations

from typing import Any

from ..results import CheckResult

_DECISIONS = "_moderato_decisions"
_MIDDLEWARE = "_moderato_middleware"
_ANSWERED = "_moderato_answered"


def _target(request: Any) -> Any:
    # A REST framework Request wraps Django's HttpRequest, which the middleware sees.
    return getattr(request, "_request", request)


def record(request: Any, result: CheckResult) -> None:
    target = _target(request)
    decisions = target.__dict__.get(_DECISIONS)
    if decisions is None:
        decisions = target.__dict__[_DECISIONS] = []
    decisions.append(result)


def recorded(request: Any) -> list[CheckResult]:
    decisions: list[CheckResult] = _target(request).__dict__.get(_DECISIONS, [])
    return decisions


def mark_middleware(request: Any) -> None:
    """RateLimitMiddleware wraps this request: it writes the quota headers."""
    _target(request).__dict__[_MIDDLEWARE] = True


def has_middleware(request: Any) -> bool:
    return bool(_target(request).__dict__.get(_MIDDLEWARE))


def mark_answered(request: Any) -> None:
    """A moderato response (429/422/503) was made for this request, with its own headers."""
    _target(request).__dict__[_ANSWERED] = True


def answered(request: Any) -> bool:
    return bool(_target(request).__dict__.get(_ANSWERED))
