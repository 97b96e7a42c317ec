"""Every limit that applies to one request, decided as one.

A request can meet several limits: RateLimitMiddleware's app-wide ones, the
dependencies of its app, routers and route, and the decorators on its
endpoint. They are decided together, by the first of them to run (the
outermost middleware, else the first dependency, else the outermost
decorator): the request is admitted only if every limit admits it, each limit
is then charged on its own counter, and when one refuses none is charged
(``RateLimiter._check_together``). The others find the decision in the
request's scope when they run, and take it as theirs.

Collecting them needs the route: after routing, the route's dependencies
(FastAPI's dependency tree, overrides applied) and decorators are read from
the routing tree once per route; a middleware, which runs before routing,
finds the route the request will reach first (routing.py).

Each limit counts on its own keys. Two limits of one route with the default
(route) scope, the same algorithm and a common window would share a counter;
each of them then counts under the route's scope followed by ``#`` and its
rate (``GET:/items#10/minute``). What no atomic step can decide is refused
with a RateLimitConfigError naming both limits, when ``install()`` starts the
app and again when such a request comes: limits of two RateLimiter objects;
two limits that would still share a counter (the same explicit scope and a
common window, or the same rate twice); on a Redis Cluster, limits whose
keys lie in different hash slots.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

from starlette.requests import HTTPConnection
from starlette.types import Scope

from ..errors import (
    BackendError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
    exceeded,
)
from ..policy import policy_for
from ..results import CheckResult
from ..together import Check, Together
from .decisions import record
from .routing import Opaque, resolve, router_of
from .rule import CheckArguments, LimitRule
from .scope import (
    has_opaque_mounts,
    mounted_apps,
    route_template,
    route_templates,
    router_derived,
    scope_method,
)

if TYPE_CHECKING:
    from ..limiter import RateLimiter

RULE_ATTRIBUTE = "__moderato_rule__"
"""Set on a dependency function (and a generator endpoint's check): the rule it enforces."""
RULES_ATTRIBUTE = "__moderato_rules__"
"""Set on a decorated endpoint: its decorators' rules, innermost first."""

_DECIDED = "moderato.decided"
"""The request's decision in its scope: a Decided."""


class Limit(NamedTuple):
    """One limit of a request: a rule, and where it counts."""

    rule: LimitRule
    bucket_scope: Optional[str] = None
    """The scope it counts in, fixed (a middleware's); None: the rule's own, else the route's.
    (In this file a bare ``scope`` is always an ASGI scope.)"""
    suffix: str = ""
    """Appended to the route's scope, so that stacked limits never share a counter."""


class Decided:
    """What was decided for a request: each limit's result (None: exempt or undecided)."""

    __slots__ = ("by", "results", "unseen")

    def __init__(
        self, by: Sequence[LimitRule], results: dict[int, Optional[CheckResult]], unseen: str
    ) -> None:
        self.by = by
        """The rules that decided (named only in an error)."""
        self.results = results
        """By ``id(rule)``."""
        self.unseen = unseen
        """Why a route limit may have been left out (an opaque mount), for the error."""

    def result_for(self, rule: LimitRule) -> Optional[CheckResult]:
        try:
            return self.results[id(rule)]
        except KeyError:
            pass
        reason = self.unseen or (
            "it was not found among the route's dependencies and decorators, or this "
            "route was added after the application started serving"
        )
        raise RateLimitConfigError(
            f"{describe(rule)} runs after this request was decided by "
            f"{', '.join(describe(decider) for decider in self.by)} without it "
            f"({reason}), so they could not be decided as one; a request refused by one "
            "would be charged by the other. Put the limit where its route declares it "
            "(a dependency or a decorator of a route the middleware's application routes), "
            "or install the middleware on the mounted application"
        )


def describe(rule: LimitRule) -> str:
    """How an error names a rule: ``@limiter.limit('4/minute')``."""
    rate = rule.rate if isinstance(rule.rate, str) else _callable_name(rule.rate)
    return f"{rule.origin}({rate!r})"


# -- entry points -----------------------------------------------------------------


async def enforce(
    rule: LimitRule, request: HTTPConnection, *, convert: bool = True
) -> Optional[CheckResult]:
    """A decorator's or a dependency's check: the request's decision, taken now with
    every other limit of its route if none was taken yet, as ``rule.enforce`` raises."""
    decided: Optional[Decided] = request.scope.get(_DECIDED)
    if decided is not None:
        return decided.result_for(rule)
    limits = route_limits(request.scope, rule)
    if len(limits) == 1 and not limits[0].suffix:
        result = await rule.enforce(request, convert=convert)
        request.scope[_DECIDED] = Decided((rule,), {id(rule): result}, "")
        return result
    try:
        return await decide(limits, request, request, rule)
    except (RateLimitExceeded, BackendError, RateLimitCallbackError) as error:
        converted = LimitRule._converted(error, request.scope) if convert else None
        if converted is None:
            raise
        raise converted from error.__cause__


LimitsInside = Callable[[Any, HTTPConnection], Awaitable[list[Limit]]]
"""The app-wide limits a mounted application's own middlewares apply to a request."""


async def decide_for_middleware(
    limits: Sequence[Limit], request: HTTPConnection, limits_inside: LimitsInside
) -> None:
    """A middleware's decision on its own limits (and those of the middlewares inside
    it) with those of the route the request will reach and of the middlewares of the
    applications mounted on its way (``limits_inside``); raises as ``rule.check`` does.
    An outer middleware's decision is taken as its own."""
    decided: Optional[Decided] = request.scope.get(_DECIDED)
    if decided is not None:
        for limit in limits:
            decided.result_for(limit.rule)
        return
    everything = list(limits)
    routed: HTTPConnection = request
    connections: dict[int, HTTPConnection] = {}
    unseen = ""
    mounts: list[tuple[Any, Scope]] = []
    found = _resolve(request.scope, mounts)
    for mounted, mounted_scope in mounts:
        entered = HTTPConnection(mounted_scope)
        for limit in await limits_inside(mounted, entered):
            connections[id(limit.rule)] = entered
            everything.append(limit)
    if isinstance(found, Opaque):
        unseen = (
            f"the middleware cannot see the routes of the application mounted at {found.mount_path}"
        )
    elif found is not None:
        routed = HTTPConnection(found)
        everything.extend(route_limits(found))
    if everything:
        await decide(
            _unique(everything), request, routed, None, unseen=unseen, connections=connections
        )


# -- deciding ---------------------------------------------------------------------


async def decide(
    limits: Sequence[Limit],
    request: HTTPConnection,
    routed: HTTPConnection,
    rule: Optional[LimitRule],
    *,
    unseen: str = "",
    connections: Optional[dict[int, HTTPConnection]] = None,
) -> Optional[CheckResult]:
    """Decide ``limits`` as one for ``request`` and record the decision; ``rule``'s result.

    ``routed`` is the connection a route limit's callbacks and default scope
    see: the request itself after routing, a resolved copy before it;
    ``connections`` gives others their own (a mounted application's middleware).
    Raises RateLimitExceeded (the limit that decided), RateLimitCallbackError
    or BackendError, with nothing charged.
    """
    check_combination(limits)
    checks: list[Check] = []
    decided_limits: list[Limit] = []
    results: dict[int, Optional[CheckResult]] = {}
    route_scopes: dict[int, str] = {}  # the route's default scope, worked out once
    for limit in limits:
        connection = request if limit.bucket_scope is not None else routed
        if connections:
            connection = connections.get(id(limit.rule), connection)
        check = await _check_of(limit, connection, route_scopes)
        if check is None:
            results[id(limit.rule)] = None
            continue
        checks.append(check)
        decided_limits.append(limit)
    if checks:
        limiter: RateLimiter = decided_limits[0].rule.limiter
        if len(checks) == 1:  # the one-check path (and its denial cache)
            key, rate, scope, cost, tenant, algorithm, shadow = checks[0]
            result = await limiter.check_with_info(
                key, rate, cost=cost, tenant_type=tenant, scope=scope, algorithm=algorithm,
                shadow=shadow,
            )  # fmt: skip
            together = Together(result.allowed, (result,), 0)
        else:
            together = await limiter._check_together(checks)
        for limit, decision in zip(decided_limits, together.results):
            results[id(limit.rule)] = decision
            if decision is not None:
                record(request.scope, decision)
        if not together.allowed:
            deciding = together.results[together.deciding]
            assert deciding is not None
            raise exceeded(deciding)
    request.scope[_DECIDED] = Decided([limit.rule for limit in limits], results, unseen)
    return None if rule is None else results.get(id(rule))


async def _check_of(
    limit: Limit, connection: HTTPConnection, route_scopes: dict[int, str]
) -> Optional[Check]:
    """The check a limit asks for this request; None when its exempt_when skips it.

    ``route_scopes`` keeps the default scope of the endpoint a rule falls back to
    (the route's), so that stacked limits work it out once."""
    rule = limit.rule
    if rule.exempt_when is not None and await rule.exempted(connection):
        return None
    bucket = limit.bucket_scope
    if bucket is None and limit.suffix:
        route = route_scopes.get(id(rule.endpoint))
        if route is None:
            route = route_scopes[id(rule.endpoint)] = rule._scope(connection, None)
        bucket = route + limit.suffix
    # Static values and the default identity need no coroutine (the usual case).
    arguments: Optional[CheckArguments] = rule._arguments_now(connection, bucket)
    if arguments is None:
        arguments = await rule._arguments(connection, bucket)
    key, rate, cost, tenant, bucket_name = arguments
    return Check(key, rate, bucket_name, cost, tenant, rule.algorithm, rule.shadow)


# -- the limits of a route --------------------------------------------------------


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
    if current is not None and all(limit.rule is not current for limit in limits):
        limits = stacked(_unique_rules([*(limit.rule for limit in limits), current]))
    return limits


def _plan(scope: Scope) -> RoutePlan:
    method = scope_method(scope)
    template = route_template(scope)
    if template is not None:
        cached = template.derived.get(method)
        if isinstance(cached, RoutePlan):
            return cached
        plan = _make_plan(template.route, scope.get("endpoint"), method, template.path)
        template.derived[method] = plan
        return plan
    # Routing the index does not know (an opaque router): the route Starlette
    # recorded, and the endpoint's own decorators.
    return _make_plan(scope.get("route"), scope.get("endpoint"), method, "")


def _make_plan(route: Any, endpoint: Any, method: str, path: str) -> RoutePlan:
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


def _unique(limits: Iterable[Limit]) -> list[Limit]:
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
            other is not rule and other.scope is None and _may_share(rule, other) for other in rules
        ):
            suffix = "#" + (rule.rate if isinstance(rule.rate, str) else _callable_name(rule.rate))
        limits.append(Limit(rule, None, suffix))
    return tuple(limits)


# -- what cannot be decided as one ------------------------------------------------


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
    if same_place and _may_share(a, b) and not _provably_apart(a, b):
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


def _may_share(a: LimitRule, b: LimitRule) -> bool:
    """Whether two rules of one limiter and scope could count in one key: the same
    algorithm and a common window (any window, for a rate given per request)."""
    default = a.limiter.default_algorithm
    if (a.algorithm or default) != (b.algorithm or default):
        return False
    if not isinstance(a.rate, str) or not isinstance(b.rate, str):
        return True
    return bool(set(policy_for(a.rate).windows_s) & set(policy_for(b.rate).windows_s))


def _provably_apart(a: LimitRule, b: LimitRule) -> bool:
    """Different static identities or tenants: their keys differ whatever the request."""
    for mine, theirs in ((a.key, b.key), (a.tenant, b.tenant)):
        if isinstance(mine, (str, bytes)) and isinstance(theirs, (str, bytes)) and mine != theirs:
            return True
    return False


def _callable_name(function: Any) -> str:
    module = getattr(function, "__module__", None) or "?"
    return f"{module}.{getattr(function, '__qualname__', type(function).__qualname__)}"


# -- the route a middleware's request will reach ----------------------------------


def _resolve(scope: Scope, mounts: list[tuple[Any, Scope]]) -> Any:
    router = router_of(scope.get("app"))
    if router is None or not any_route_limits(scope.get("router") or router):
        return None
    return resolve(scope, router.routes, router, mounts)


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
        _endpoint_rules(endpoint, method) for method in _methods(route)
    )
    template.derived["any"] = found
    return found


def check_routes(app: Any, outer: Sequence[Limit]) -> None:
    """Raise RateLimitConfigError for the first route whose limits (with ``outer``, the
    app-wide ones) no one atomic step can decide: install()'s start-up check."""
    router = router_of(app)
    if router is None:
        return
    for template in route_templates(router):
        route = template.route
        for method in _methods(route):
            plan = _make_plan(route, getattr(route, "endpoint", None), method, template.path)
            try:
                check_combination(_unique([*outer, *plan.limits]))
            except RateLimitConfigError as error:
                raise RateLimitConfigError(f"route {plan.where}: {error}") from None


_CLASS_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _methods(route: Any) -> list[str]:
    """The methods a route answers, as scopes name them (HEAD is GET's; WS a websocket)."""
    methods = getattr(route, "methods", None)
    if methods:
        return sorted({"GET" if method == "HEAD" else method for method in methods})
    if inspect.isclass(getattr(route, "endpoint", None)):
        return list(_CLASS_METHODS)  # an HTTPEndpoint answers what it defines
    return ["WS"]
