"""What cannot be decided as one: the limits of a request no atomic step reaches.

Refused with a RateLimitConfigError naming both limits and the fix: limits of
two RateLimiter objects (two backends); two limits that would still count in
one counter (one explicit scope and a common window, or the same rate twice
on a route's scope); on a Redis Cluster, limits whose keys lie in different
hash slots. Checked at decoration, when ``install()`` starts the app (every
route, with the app-wide limit), and before a request is decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from ..errors import RateLimitConfigError
from .request_limits import Limit, describe, make_plan, may_share, route_methods, unique
from .routing import router_of
from .rule import LimitRule
from .scope import route_templates

_CHECKED_MAX = 1024
_checked: dict[tuple[Limit, ...], str] = {}
"""Combinations already checked (their limits kept alive, so ids stay theirs): "" or the error."""


def check_combination(limits: Sequence[Limit]) -> None:
    """Raise RateLimitConfigError for limits no one atomic step can decide."""
    if len(limits) < 2:
        return
    combination = tuple(limits)
    problem = _checked.get(combination)
    if problem is None:
        problem = _problem(combination)
        if len(_checked) >= _CHECKED_MAX:
            _checked.clear()
        _checked[combination] = problem
    if problem:
        raise RateLimitConfigError(problem)


def _problem(limits: Sequence[Limit]) -> str:
    for index, limit in enumerate(limits):
        for other in limits[:index]:
            problem = _conflict(other, limit)
            if problem:
                return (
                    f"{describe(other.rule)} and {describe(limit.rule)} apply to one "
                    f"request, but {problem}"
                )
    return ""


def _conflict(first: Limit, second: Limit) -> str:
    a, b = first.rule, second.rule
    if a.limiter is not b.limiter:
        return (
            "they belong to two RateLimiter objects, which cannot decide them in one "
            "atomic step: use one RateLimiter for every limit of a request"
        )
    same_place = _counts_in(first) == _counts_in(second)
    if same_place and may_share(a, b) and not _provably_apart(a, b):
        return (
            "they would count in one counter (the same scope, algorithm and window): "
            "give one of them its own scope=, or remove one"
        )
    if a.limiter._node_of is not None and not (
        same_place and a.key is b.key and a.tenant is b.tenant
    ):
        return (
            "their keys lie in different Redis Cluster hash slots (another scope, tenant "
            "or key), which no one atomic call can reach: on a cluster the limits of one "
            "request need one scope, tenant and key (with different windows, or written "
            "as one rate string), or use a single Redis server (or Sentinel)"
        )
    return ""


def _counts_in(limit: Limit) -> tuple[Optional[str], str]:
    """Where a limit counts: a fixed scope, else the route's (None) plus its suffix."""
    return (limit.bucket_scope or limit.rule.scope, limit.suffix)


def _provably_apart(a: LimitRule, b: LimitRule) -> bool:
    """Different static identities or tenants: their keys differ whatever the request."""
    for mine, theirs in ((a.key, b.key), (a.tenant, b.tenant)):
        if isinstance(mine, (str, bytes)) and isinstance(theirs, (str, bytes)) and mine != theirs:
            return True
    return False


def check_routes(app: Any, outer: Sequence[Limit]) -> None:
    """Raise RateLimitConfigError for the first route whose limits (with ``outer``, the
    app-wide ones) no one atomic step can decide: install()'s start-up check."""
    router = router_of(app)
    if router is None:
        return
    for template in route_templates(router):
        route = template.route
        for method in route_methods(route):
            plan = make_plan(route, getattr(route, "endpoint", None), method, template.path)
            try:
                check_combination(unique([*outer, *plan.limits]))
            except RateLimitConfigError as error:
                raise RateLimitConfigError(f"route {plan.where}: {error}") from None
