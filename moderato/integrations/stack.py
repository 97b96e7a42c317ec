"""Every limit that applies to one request, decided as one.

A request can meet several limits: RateLimitMiddleware's app-wide ones, the
dependencies of its app, routers and route, and the decorators on its
endpoint (request_limits.py). They are decided together, by the first of
them to run (the outermost middleware, else the first dependency, else the
outermost decorator): the request is admitted only if every limit admits it,
each limit is then charged on its own counter, and when one refuses none is
charged (``RateLimiter._check_together``). The others find the decision in
the request's scope when they run, and take it as theirs. A middleware, which
runs before routing, first finds the route the request will reach
(routing.py). What no atomic step can decide is refused (combinations.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from starlette.requests import HTTPConnection
from starlette.types import Scope

from .. import _accel
from ..errors import (
    BackendError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
    exceeded,
)
from ..results import CheckResult
from ..together import Check, Together
from ..web.addresses import UNKNOWN_CLIENT, parsed_peer
from .combinations import check_combination
from .decisions import record
from .identity import DEFAULT_IDENTITY, ClientIdentity
from .request_limits import (
    Limit,
    any_route_limits,
    describe,
    learn_route,
    route_limits,
    unique,
)
from .routing import Opaque, resolve, router_of
from .rule import CheckArguments, LimitRule
from .scope import INDEXES

if TYPE_CHECKING:
    from ..limiter import RateLimiter

DECIDED = "moderato.decided"
"""The request's decision in its scope: a Decided."""


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


# -- entry points -----------------------------------------------------------------


async def enforce(
    rule: LimitRule, request: HTTPConnection, *, convert: bool = True
) -> Optional[CheckResult]:
    """A decorator's or a dependency's check: the request's decision, taken now with
    every other limit of its route if none was taken yet, as ``rule.enforce`` raises."""
    decided: Optional[Decided] = request.scope.get(DECIDED)
    if decided is not None:
        return decided.result_for(rule)
    limits = route_limits(request.scope, rule)
    if len(limits) == 1 and not limits[0].suffix:
        result = await rule.enforce(request, convert=convert)
        request.scope[DECIDED] = Decided((rule,), {id(rule): result}, "")
        return result
    try:
        return await decide(limits, request, request, rule)
    except (RateLimitExceeded, BackendError, RateLimitCallbackError) as error:
        converted = LimitRule._converted(error, request.scope) if convert else None
        if converted is None:
            raise
        raise converted from error.__cause__


def decides_alone(rule: LimitRule, scope: Scope) -> bool:
    """Whether ``enforce(rule, ...)`` would take its one-limit path with nothing to await
    before the check: no decision taken yet, no ``exempt_when``, and the rule the route's
    only limit (the commonest shape: one decorator). The decorator then runs that path
    itself (decorator.py): two coroutines fewer between the request and Redis's reply."""
    if rule.exempt_when is not None or DECIDED in scope:
        return False
    limits = route_limits(scope, rule)
    return len(limits) == 1 and not limits[0].suffix


alone_arguments: Callable[[LimitRule, Scope], Optional[CheckArguments]] = _accel.RouteArguments(
    decided=DECIDED,
    indexes=INDEXES,
    learn_route=learn_route,
    unknown=object(),  # a route not met yet: RouteFacts to work out
    default_identity=DEFAULT_IDENTITY,
    client_identity=ClientIdentity,
    parsed_peer=parsed_peer,
    unknown_client=UNKNOWN_CLIENT,
)
"""``decides_alone(rule, scope)`` and then ``rule._arguments_now(request, None)``, in
one C call (csrc/fast_route.c) from what the route's first request worked out
(request_limits.RouteFacts): the check's arguments when ``rule`` decides the request
alone with nothing to await.

None when this cannot tell (a callback to await, a route whose limits or scope depend
on more than its router, endpoint, method and root path, a request already decided,
an ``exempt_when``): the caller then asks ``decides_alone``. Raises only what
``decides_alone`` would (working the route out); never the identity's errors, which
``_arguments_now`` raises, converted, on the caller's path.

The steps, in order: no ``exempt_when`` and no decision in the scope; the facts from
the index of the scope's router (``INDEXES``, by ``id(router)`` with a weak reference),
by endpoint, method and root path (``app_root_path``, else ``root_path``), learnt by
``learn_route`` at the route's first request; the rule the route's only limit and no
dependency overrides set on the facts' provider; the rule's rate, cost and tenant (its
own, else the limiter's; a str, an int, a str or None) and key: a str or bytes as it
is, or for ``ClientIdentity`` with no API-key header and no proxy trusted the peer's
canonical address (``parsed_peer``; ``UNKNOWN_CLIENT`` without a peer); the rule's
scope, else the route's. tests/route_arguments_reference.py is the same in Python, and
tests/http/test_route_facts.py runs every case through both."""


def decided_alone(rule: LimitRule, scope: Scope, result: Optional[CheckResult]) -> None:
    """Record ``rule``'s decision as the request's, as ``enforce``'s one-limit path does."""
    scope[DECIDED] = Decided((rule,), {id(rule): result}, "")


LimitsInside = Callable[[Any, HTTPConnection], Awaitable[list[Limit]]]
"""The app-wide limits a mounted application's own middlewares apply to a request."""


async def decide_for_middleware(
    limits: Sequence[Limit], request: HTTPConnection, limits_inside: LimitsInside
) -> None:
    """A middleware's decision on its own limits (and those of the middlewares inside
    it) with those of the route the request will reach and of the middlewares of the
    applications mounted on its way (``limits_inside``); raises as ``rule.check`` does.
    An outer middleware's decision is taken as its own."""
    decided: Optional[Decided] = request.scope.get(DECIDED)
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
    if len(everything) == 1 and not connections and everything[0].bucket_scope is not None:
        # The app-wide limit alone (the usual case): the rule's own path, no joint step.
        rule = everything[0].rule
        result = await rule.enforce(request, scope=everything[0].bucket_scope, convert=False)
        request.scope[DECIDED] = Decided((rule,), {id(rule): result}, unseen)
    elif everything:
        await decide(
            unique(everything), request, routed, None, unseen=unseen, connections=connections
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
            key, rate, scope, cost, tenant, algorithm, shadow, burst = checks[0]
            result = await limiter.check_with_info(
                key, rate, cost=cost, tenant_type=tenant, scope=scope, algorithm=algorithm,
                shadow=shadow, burst=burst,
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
    request.scope[DECIDED] = Decided([limit.rule for limit in limits], results, unseen)
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
    return Check(key, rate, bucket_name, cost, tenant, rule.algorithm, rule.shadow, rule.burst)


def _resolve(scope: Scope, mounts: list[tuple[Any, Scope]]) -> Any:
    router = router_of(scope.get("app"))
    if router is None or not any_route_limits(scope.get("router") or router):
        return None
    return resolve(scope, router.routes, router, mounts)
