"""Every limit of one Django request decided as one.

A request can meet RateLimitMiddleware's app-wide ``RATE`` and the ``limit()``
decorators of its view. They are decided together by the first of them to
run (the middleware, which finds the view the URL resolves to; else the
outermost decorator): the request is admitted only if every limit admits it,
each limit is then charged on its own counter, and when one refuses none is
charged (``RateLimiter._check_together``, on the blocking limiter in a thread
and on the asyncio one on an ASGI server's loop). The others find the
decision on the request and take it as theirs.

Counters: the limits of one view that use the view's default scope (the
route's, ``GET:/items/<int:pk>``) and have the same algorithm and a window in
common would count in one counter; each then counts under the route's scope
followed by ``#`` and its rate as written (``GET:/items#10/minute``), as the
ASGI integration does. Limits that would still share a counter (one explicit
``scope=`` and a common window) are refused when the views module is
imported (``check_stack``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest
from django.urls import Resolver404, resolve

from ..errors import RateLimitConfigError, exceeded
from ..policy import policy_for
from ..results import CheckResult
from ..sync import RateLimiter as BlockingRateLimiter
from ..together import Check, Together
from .conf import Settings
from .decisions import record
from .limiters import get_async_limiter, get_limiter
from .rule import LimitRule, route_scope, view_method

LIMITS_ATTRIBUTE = "moderato_limits"
"""The LimitRules of a decorated view, outermost last (for introspection and tests)."""

_DECIDED = "_moderato_decided"
"""On the request: what was decided, by ``id(rule)``."""


class Limit(NamedTuple):
    """One limit of a request: a rule, and where it counts."""

    rule: LimitRule
    scope: Optional[str] = None
    """A fixed scope (the middleware's ``app``); None: the rule's own, else the route's."""
    suffix: str = ""
    """Appended to the route's scope, so that a view's limits never share a counter."""


def decided(request: Any) -> Optional[dict[int, CheckResult]]:
    """The decision taken for this request so far (None: none yet)."""
    found: Optional[dict[int, CheckResult]] = _target(request).__dict__.get(_DECIDED)
    return found


def view_limits(rules: Sequence[LimitRule], request: HttpRequest) -> list[Limit]:
    """The view's rules (``LIMITS_ATTRIBUTE``'s order) that count this request's method,
    the outermost first, with their counters' suffixes."""
    applying = [rule for rule in reversed(rules) if rule.applies(request)]
    default = get_limiter().default_algorithm if len(applying) > 1 else None
    limits = []
    for rule in applying:
        suffix = ""
        if rule.scope is None and any(
            other is not rule and other.scope is None and _may_share(rule, other, default)
            for other in applying
        ):
            suffix = "#" + _rate_name(rule)
        limits.append(Limit(rule, None, suffix))
    return limits


def resolved_view_rules(request: HttpRequest) -> list[LimitRule]:
    """The ``limit()`` rules of the view the request's URL resolves to (the middleware's
    look ahead: Django resolves it only after every middleware ran); none for a URL
    that resolves to nothing. The match is kept on the request for the default scope."""
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return []
    request.resolver_match = match
    return rules_of_view(match.func, request)


def rules_of_view(view: Any, request: HttpRequest) -> list[LimitRule]:
    rules: Optional[Sequence[LimitRule]] = getattr(view, LIMITS_ATTRIBUTE, None)
    if rules is None:
        # A class-based view: limit() sits on its handler (method_decorator).
        view_class = getattr(view, "view_class", None)
        handler = getattr(view_class, view_method(request).lower(), None)
        rules = getattr(handler, LIMITS_ATTRIBUTE, ())
    return list(rules)


def check_stack(rules: Sequence[LimitRule]) -> None:
    """Refuse two limits of one view that would count in one counter whatever the
    request: the same explicit scope, algorithm and a common window."""
    for index, rule in enumerate(rules):
        for other in rules[:index]:
            if (
                rule.scope is not None
                and rule.scope == other.scope
                and _may_share(rule, other, None)
                and not _provably_apart(rule, other)
            ):
                raise RateLimitConfigError(
                    f"limit({_rate_name(other)!r}) and limit({_rate_name(rule)!r}) on one view "
                    f"would count in one counter (scope {rule.scope!r}, the same algorithm "
                    "and a common window): give one of them its own scope=, or write them "
                    "as one rate string"
                )


# -- deciding ---------------------------------------------------------------------


def decide(request: HttpRequest, settings: Settings, limits: Sequence[Limit]) -> None:
    """Decide ``limits`` as one in this thread (the blocking limiter) and record the
    decision; raise RateLimitExceeded (the limit that decided), RateLimitCallbackError
    or BackendError, with nothing charged."""
    checks = [
        _check(limit, limit.rule.arguments(request, settings, _scope(limit, request)))
        for limit in limits
    ]
    _recorded(request, limits, _decided_by(get_limiter(), checks))


async def adecide(request: HttpRequest, settings: Settings, limits: Sequence[Limit]) -> None:
    """``decide`` for an async view: its callbacks awaited, the checks awaited on an ASGI
    server's loop (under WSGI, or on memory://, by the blocking limiter, as rule.py says)."""
    checks = [
        _check(limit, await limit.rule.aarguments(request, settings, _scope(limit, request)))
        for limit in limits
    ]
    if isinstance(request, ASGIRequest) and not settings.in_process:
        limiter = get_async_limiter()
        if len(checks) == 1:
            key, rate, scope, cost, tenant, algorithm = checks[0][:6]
            result = await limiter.check_with_info(
                key, rate, cost=cost, tenant_type=tenant, scope=scope, algorithm=algorithm
            )
            together = Together(result.allowed, (result,), 0)
        else:
            together = await limiter._check_together(checks)
    else:
        together = _decided_by(get_limiter(), checks)
    _recorded(request, limits, together)


def _decided_by(limiter: BlockingRateLimiter, checks: list[Check]) -> Together:
    if len(checks) == 1:  # the one-check path
        key, rate, scope, cost, tenant, algorithm = checks[0][:6]
        result = limiter.check_with_info(
            key, rate, cost=cost, tenant_type=tenant, scope=scope, algorithm=algorithm
        )
        return Together(result.allowed, (result,), 0)
    return limiter._check_together(checks)


def _recorded(request: HttpRequest, limits: Sequence[Limit], together: Together) -> None:
    results = _target(request).__dict__.setdefault(_DECIDED, {})
    for limit, result in zip(limits, together.results):
        if result is not None:
            results[id(limit.rule)] = result
            record(request, result)
    if not together.allowed:
        deciding = together.results[together.deciding]
        assert deciding is not None
        raise exceeded(deciding)


def _check(limit: Limit, arguments: tuple[Any, str, int, Optional[str], str]) -> Check:
    identity, rate, cost, tenant, scope = arguments
    return Check(identity, rate, scope, cost, tenant, limit.rule.algorithm)


def _scope(limit: Limit, request: HttpRequest) -> str:
    if limit.scope is not None:
        return limit.scope
    return limit.rule.scope or route_scope(request) + limit.suffix


def _may_share(a: LimitRule, b: LimitRule, default: Optional[str]) -> bool:
    """Whether two rules of one scope could count in one key: the same algorithm and a
    common window (any window, for a rate given per request). ``default``: the
    limiter's default algorithm (None before settings are read: only the same
    ``algorithm=`` then counts as the same)."""
    if (a.algorithm or default) != (b.algorithm or default):
        return False
    if not isinstance(a.rate, str) or not isinstance(b.rate, str):
        return True
    return bool(set(policy_for(a.rate).windows_s) & set(policy_for(b.rate).windows_s))


def _provably_apart(a: LimitRule, b: LimitRule) -> bool:
    """Different static tenants: their keys differ whatever the request."""
    return isinstance(a.tenant, str) and isinstance(b.tenant, str) and a.tenant != b.tenant


def _rate_name(rule: LimitRule) -> str:
    rate = rule.rate
    if isinstance(rate, str):
        return rate
    return f"{getattr(rate, '__module__', '?')}.{getattr(rate, '__qualname__', repr(rate))}"


def _target(request: Any) -> Any:
    # A REST framework Request wraps Django's HttpRequest, which the middleware sees.
    return getattr(request, "_request", request)
