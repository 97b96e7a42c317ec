"""Which limits apply to a request, and where each one counts.

A route's own limits are its FastAPI dependencies (the dependency tree,
overrides applied, in the order FastAPI solves it) and its decorators; they
are read from the routing tree once per route and method. An app-wide limit
(RateLimitMiddleware) has a bucket of its own.

Each limit counts on its own keys. Two limits of one route with the route's
default scope, the same algorithm and a common window would share a counter;
each of them then counts under the route's scope followed by ``#`` and its
rate (``GET:/items#10/minute``; a rate callback is named by its
``module.qualname``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Optional

from starlette.types import Scope

from ..policy import policy_for
from .rule import LimitRule
from .scope import (
    has_opaque_mounts,
    index_of,
    mounted_apps,
    route_template,
    route_templates,
    router_derived,
    scope_method,
)

RULE_ATTRIBUTE = "__moderato_rule__"
"""Set on a dependency function (and a generator endpoint's check): the rule it enforces."""
RULES_ATTRIBUTE = "__moderato_rules__"
"""Set on a decorated endpoint: its decorators' rules, innermost first."""


class Limit(NamedTuple):
    """One limit of a request: a rule, and where it counts."""

    rule: LimitRule
    bucket_scope: Optional[str] = None
    """The scope it counts in, fixed (a middleware's); None: the rule's own, else the route's.
    (A bare ``scope`` is always an ASGI scope in this module and stack.py.)"""
    suffix: str = ""
    """Appended to the route's scope, so that stacked limits never share a counter."""


def describe(rule: LimitRule) -> str:
    """How an error names a rule: ``@limiter.limit('4/minute')``."""
    rate = rule.rate if isinstance(rule.rate, str) else _callable_name(rule.rate)
    return f"{rule.origin}({rate!r})"


class RoutePlan(NamedTuple):
    """The route-level limits of one route (for one method), worked out once."""

    limits: tuple[Limit, ...]
    dependant: Any
    """FastAPI's dependency tree of the route, re-read when overrides are set."""
    overrides_provider: Any
    endpoint_rules: tuple[LimitRule, ...]
    where: str


def route_limits(scope: Scope, current: Optional[LimitRule] = None) -> tuple[Limit, ...]:
    """The route-level limits of the routed request ``scope`` (``current`` among them)."""
    plan = _plan(scope)
    limits = plan.limits
    overrides = getattr(plan.overrides_provider, "dependency_overrides", None)
    if overrides and plan.dependant is not None:
        rules = [*_dependency_rules(plan.dependant, overrides), *plan.endpoint_rules]
        limits = stacked(_unique_rules(rules))
    if current is None or (len(limits) == 1 and limits[0].rule is current):
        return limits  # a route with one decorator: no scan, no generator
    if all(limit.rule is not current for limit in limits):
        limits = stacked(_unique_rules([*(limit.rule for limit in limits), current]))
    return limits


def _plan(scope: Scope) -> RoutePlan:
    method = scope_method(scope)
    template = route_template(scope)
    if template is not None:
        cached = template.derived.get(method)
        if isinstance(cached, RoutePlan):
            return cached
        plan = make_plan(template.route, scope.get("endpoint"), method, template.path)
        template.derived[method] = plan
        return plan
    # Routing the index does not know (an opaque router): the route Starlette
    # recorded, and the endpoint's own decorators.
    return make_plan(scope.get("route"), scope.get("endpoint"), method, "")


class RouteFacts(NamedTuple):
    """What every request of one route shares, for one method and root path: worked out
    by its first request, kept in the routing index (scope.py) and dropped with it."""

    alone: Optional[LimitRule]
    """The route's one limit, when it is a rule of its own on the route's default scope
    or its own (no suffix); None: several limits, or none."""
    overrides_provider: Any
    """Whose ``dependency_overrides``, when set, make the route's limits be read again
    (``route_limits``); None for a route without FastAPI's dependency tree."""
    scope_name: str
    """The route's default scope (``route_scope``)."""


ROUTE_FACTS_LIMIT = 1024
"""Entries one index keeps (routes x methods x root paths); past it the table starts
over, so that root paths that vary per request cannot grow it without bound."""


def learn_route(scope: Scope) -> Optional[RouteFacts]:
    """The routed request's ``RouteFacts``, worked out now and kept for the next request
    with the same router, endpoint, method and root path (stack.py reads them there).

    None, and nothing kept but the refusal, when the route's limits or its scope could
    depend on more than those: several templates reach the endpoint (chosen by path and
    host), or the template cannot be found, or the request is not plain HTTP.
    """
    method = scope.get("method")
    root_path = scope.get("app_root_path")
    if root_path is None:
        root_path = scope.get("root_path", "")
    if scope.get("type") != "http" or type(method) is not str or type(root_path) is not str:
        return None
    template = route_template(scope)
    if template is None:
        return None
    router, endpoint = scope["router"], scope["endpoint"]
    index = index_of(router)  # after route_template, which may have built it again
    templates = index.templates.get(id(endpoint))
    routes = index.routes
    if len(routes) >= ROUTE_FACTS_LIMIT:
        routes.clear()
    key = (endpoint, method, root_path)
    if templates is None or len(templates) != 1 or templates[0] is not template:
        routes[key] = None
        return None
    plan = _plan(scope)
    limits = plan.limits
    facts = RouteFacts(
        limits[0].rule if len(limits) == 1 and not limits[0].suffix else None,
        plan.overrides_provider if plan.dependant is not None else None,
        template.render(scope_method(scope), root_path),
    )
    routes[key] = facts
    return facts


def make_plan(route: Any, endpoint: Any, method: str, path: str) -> RoutePlan:
    dependant = getattr(route, "dependant", None)
    endpoint_rules = tuple(_endpoint_rules(endpoint, method))
    rules = [
        *(_dependency_rules(dependant, None) if dependant is not None else ()),
        *endpoint_rules,
    ]
    where = f"{method} {path}" if path else method
    return RoutePlan(
        stacked(_unique_rules(rules)),
        dependant,
        getattr(route, "dependency_overrides_provider", None),
        endpoint_rules,
        where,
    )


def _dependency_rules(dependant: Any, overrides: Optional[dict[Any, Any]]) -> list[LimitRule]:
    """The rules of the dependencies FastAPI solves for ``dependant``, in its order:
    each dependency's own dependencies first, then it."""
    found: list[LimitRule] = []
    for sub in getattr(dependant, "dependencies", ()):
        call = sub.call
        if overrides:
            replaced = overrides.get(call, call)
            if replaced is not call:
                rule = _rule_of(replaced)
                if rule is not None:
                    found.append(rule)
                continue
        found.extend(_dependency_rules(sub, overrides))
        rule = _rule_of(call)
        if rule is not None:
            found.append(rule)
    return found


def _endpoint_rules(endpoint: Any, method: str) -> list[LimitRule]:
    """A decorated endpoint's rules, outermost first; for a class endpoint
    (Starlette's HTTPEndpoint), those of its method for ``method``."""
    if inspect.isclass(endpoint):
        endpoint = None if method == "WS" else getattr(endpoint, method.lower(), None)
    rules = getattr(endpoint, RULES_ATTRIBUTE, ())
    return [rule for rule in reversed(rules) if isinstance(rule, LimitRule)]


def _rule_of(call: Any) -> Optional[LimitRule]:
    rule = getattr(call, RULE_ATTRIBUTE, None)
    return rule if isinstance(rule, LimitRule) else None


def _unique_rules(rules: Iterable[LimitRule]) -> list[LimitRule]:
    unique: dict[int, LimitRule] = {}
    for rule in rules:
        unique.setdefault(id(rule), rule)
    return list(unique.values())


def unique(limits: Iterable[Limit]) -> list[Limit]:
    unique: dict[int, Limit] = {}
    for limit in limits:
        unique.setdefault(id(limit.rule), limit)
    return list(unique.values())


def stacked(rules: Sequence[LimitRule]) -> tuple[Limit, ...]:
    """The route's rules as limits with counters of their own (see the module docstring)."""
    limits = []
    for rule in rules:
        suffix = ""
        if rule.scope is None and any(
            other is not rule and other.scope is None and may_share(rule, other) for other in rules
        ):
            suffix = "#" + (rule.rate if isinstance(rule.rate, str) else _callable_name(rule.rate))
        limits.append(Limit(rule, None, suffix))
    return tuple(limits)


def may_share(a: LimitRule, b: LimitRule) -> bool:
    """Whether two rules of one limiter and scope could count in one key: the same
    algorithm and a common window (any window, for a rate given per request)."""
    default = a.limiter.default_algorithm
    if (a.algorithm or default) != (b.algorithm or default):
        return False
    if not isinstance(a.rate, str) or not isinstance(b.rate, str):
        return True
    return bool(set(policy_for(a.rate).windows_s) & set(policy_for(b.rate).windows_s))


def _callable_name(function: Any) -> str:
    module = getattr(function, "__module__", None) or "?"
    return f"{module}.{getattr(function, '__qualname__', type(function).__qualname__)}"


def any_route_limits(router: Any) -> bool:
    """Whether any route under ``router`` has a limit of its own, or may have one behind
    an opaque mount (else no middleware needs to find the route of its requests)."""
    derived = router_derived(router)
    known = derived.get("any limits")
    if not isinstance(known, bool):
        known = (
            has_opaque_mounts(router)
            or any(_template_has_limits(template) for template in route_templates(router))
            or any(_limits_app_wide(app) for app in mounted_apps(router))
        )
        derived["any limits"] = known
    return known


APP_WIDE_ATTRIBUTE = "moderato_app_wide"
"""True on a middleware class whose instances apply an app-wide limit (RateLimitMiddleware)."""


def _limits_app_wide(app: Any) -> bool:
    """Whether a mounted application has a middleware applying an app-wide limit."""
    declared = getattr(app, "user_middleware", ())
    if any(getattr(getattr(entry, "cls", None), APP_WIDE_ATTRIBUTE, False) for entry in declared):
        return True
    current = app
    for _ in range(64):  # middlewares wrapping it directly, each keeping the next in .app
        if getattr(type(current), APP_WIDE_ATTRIBUTE, False):
            return True
        current = getattr(current, "app", None)
        if current is None:
            return False
    return False


def _template_has_limits(template: Any) -> bool:
    known = template.derived.get("any")
    if isinstance(known, bool):
        return known
    route = template.route
    endpoint = getattr(route, "endpoint", None)
    dependant = getattr(route, "dependant", None)
    found = bool(dependant is not None and _dependency_rules(dependant, None)) or any(
        _endpoint_rules(endpoint, method) for method in route_methods(route)
    )
    template.derived["any"] = found
    return found


_CLASS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def route_methods(route: Any) -> list[str]:
    """The methods a route answers, as scopes name them (HEAD is GET's; WS a websocket)."""
    methods = getattr(route, "methods", None)
    if methods:
        return sorted({"GET" if method == "HEAD" else method for method in methods})
    if inspect.isclass(getattr(route, "endpoint", None)):
        return list(_CLASS_METHODS)  # an HTTPEndpoint answers what it defines
    return ["WS"]
