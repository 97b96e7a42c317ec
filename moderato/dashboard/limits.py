"""The limits an application declares, found where they apply, and the decisions on each.

Found three ways, each limit once:

- on the routes: every route under the application's outermost router, its
  dependencies and decorators, as stack.py decides them (with the ``#rate``
  suffix of stacked limits that would otherwise share a counter);
- in the middleware stacks of the application and of the applications
  mounted in it: each RateLimitMiddleware's app-wide limit and per-path costs;
- in the registry of declared rules (integrations/declared.py): what the
  routes do not show, such as websocket message limits.

A limit's decisions are the recorder's rows (rate, algorithm, scope, burst) that
belong to it: its explicit scope, or the scope of one of its routes
(``METHOD:<root path><template><suffix>``). Rows no declared limit claims
(manual ``check()`` calls, rates given per request) are listed on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..integrations import declared
from ..integrations.identity import ClientIdentity
from ..integrations.middleware import RateLimitMiddleware, _inner_middlewares
from ..integrations.request_limits import make_plan, route_methods
from ..integrations.rule import LimitRule
from ..integrations.scope import mounted_apps, route_templates
from ..integrations.websocket import MESSAGE_SCOPE_PREFIX
from .identities import shown_identity
from .recorder import OUTCOME_COUNT, LimitKey

if TYPE_CHECKING:
    from ..limiter import RateLimiter

MAX_ROUTES_SHOWN = 20


@dataclass
class DeclaredLimit:
    """One declared rule, where it applies and how the dashboard describes it."""

    rule: LimitRule
    kind: str
    where: list[str] = field(default_factory=list)
    bucket_scope: Optional[str] = None
    """Its fixed scope (explicit, or a middleware's); None: each route's own."""
    route_scopes: list[tuple[str, str]] = field(default_factory=list)
    """(method, template + suffix) of each route it counts on, for a route-scoped rule."""
    costs: str = ""

    def static_rate(self) -> Optional[str]:
        return self.rule.rate if isinstance(self.rule.rate, str) else None

    def algorithm(self) -> str:
        return self.rule.algorithm or self.rule.limiter.default_algorithm

    def exact_scopes(self) -> list[str]:
        if self.bucket_scope is not None:
            return [self.bucket_scope]
        return [f"{method}:{path}" for method, path in self.route_scopes]

    def claims(self, name: LimitKey, exact: bool) -> bool:
        """Whether a recorded row (rate, algorithm, scope, burst) is this limit's."""
        rate, algorithm, scope, burst = name
        static = self.static_rate()
        if (static is not None and rate != static) or algorithm != self.algorithm():
            return False
        if burst != self.rule.burst:
            return False
        if self.bucket_scope is not None:
            return scope == self.bucket_scope
        if scope in self.exact_scopes():
            return True
        if exact:
            return False
        if self.kind == MESSAGE_KIND:
            return scope.startswith(MESSAGE_SCOPE_PREFIX)
        # Under a root path or a host route: "GET:/api/items/{id}", "GET://{h}.x/items".
        return any(
            scope.startswith(f"{method}:") and scope.endswith(path)
            for method, path in self.route_scopes
        )


MESSAGE_KIND = "limiter.message_limit"


def declared_limits(limiter: RateLimiter, app: Any, router: Any) -> list[DeclaredLimit]:
    """Every limit of ``limiter`` declared in ``app`` (routed by ``router``), each once."""
    found: dict[int, DeclaredLimit] = {}

    def entry(rule: LimitRule) -> DeclaredLimit:
        known = found.get(id(rule))
        if known is None:
            known = found[id(rule)] = DeclaredLimit(rule, rule.origin)
        return known

    for middleware in _middlewares(app, router):
        if middleware.rule.limiter is not limiter:
            continue
        for path, rule in (("", middleware.rule), *middleware.path_rules.items()):
            limit = entry(rule)
            limit.bucket_scope = middleware.bucket_scope
            limit.where.append(f"requests to {path}" if path else "every request")
            if path:
                limit.costs = f"{rule.cost} on {path}"
    if router is not None:
        for template in route_templates(router):
            route = template.route
            for method in route_methods(route):
                plan = make_plan(route, getattr(route, "endpoint", None), method, "")
                for item in plan.limits:
                    rule = item.rule
                    if rule.limiter is not limiter:
                        continue
                    limit = entry(rule)
                    if len(limit.where) < MAX_ROUTES_SHOWN:
                        limit.where.append(f"{method} {template.path}")
                    if rule.scope is None:
                        limit.route_scopes.append((method, template.path + item.suffix))
                    else:
                        limit.bucket_scope = rule.scope
    # A rule made twice alike (install() builds its middleware once more to check its
    # options) is one limit: the leftovers are told apart by what they declare.
    seen = {_likeness(limit.rule) for limit in found.values()}
    for rule in declared.rules_of(limiter):
        if id(rule) in found or _likeness(rule) in seen:
            continue
        seen.add(_likeness(rule))
        limit = entry(rule)
        limit.bucket_scope = rule.scope
        limit.where.append(
            "websocket messages" if rule.origin == MESSAGE_KIND else "(not found on a route)"
        )
    return list(found.values())


def _likeness(rule: LimitRule) -> tuple[object, ...]:
    return (rule.origin, repr(rule.rate), rule.scope, rule.algorithm, repr(rule.cost))


def _middlewares(app: Any, router: Any) -> list[RateLimitMiddleware]:
    apps = [app, *(mounted_apps(router) if router is not None else ())]
    found: list[RateLimitMiddleware] = []
    for each in apps:
        stack_top = getattr(each, "middleware_stack", None) or each
        for middleware in _inner_middlewares(stack_top):
            if middleware not in found:
                found.append(middleware)
    return found


@dataclass
class LimitRow:
    """A line of the dashboard's limits table."""

    kind: str
    where: list[str]
    rate: str
    algorithm: str
    scope: str
    key: str
    tenant: str
    cost: str
    shadow: str
    burst: Optional[int] = None
    counts: list[int] = field(default_factory=lambda: [0] * OUTCOME_COUNT)
    scopes_seen: list[str] = field(default_factory=list)
    """The recorded scopes it was given (a route-scoped limit's, as the app names them)."""
    limit: Optional[DeclaredLimit] = None
    """The declared limit (None for recorded checks no declared limit claims)."""

    def as_json(self) -> dict[str, Any]:
        from .recorder import OUTCOMES

        decided = sum(self.counts)
        denied = self.counts[OUTCOMES.index("denied")] + self.counts[OUTCOMES.index("permanent")]
        return {
            "kind": self.kind,
            "where": self.where,
            "rate": self.rate,
            "burst": self.burst,
            "algorithm": self.algorithm,
            "scope": self.scope,
            "key": self.key,
            "tenant": self.tenant,
            "cost": self.cost,
            "shadow": self.shadow,
            "counts": dict(zip(OUTCOMES, self.counts)),
            "decisions": decided,
            "denial_share": denied / decided if decided else None,
        }


def limit_rows(
    limits: Iterable[DeclaredLimit], recorded: Mapping[LimitKey, list[int]], secret: Optional[bytes]
) -> list[LimitRow]:
    """Each declared limit with its decisions, then the recorded rows none of them claims."""
    limits = list(limits)
    rows = [_row(limit, secret) for limit in limits]
    unclaimed = dict(recorded)
    for exact in (True, False):  # exact scopes first, so a prefix match takes only leftovers
        for name in list(unclaimed):
            for limit, row in zip(limits, rows):
                if limit.claims(name, exact):
                    _add(row, unclaimed.pop(name))
                    row.scopes_seen.append(name[2])
                    break
    for (rate, algorithm, scope, burst), counts in sorted(unclaimed.items(), key=_sort_key):
        row = LimitRow(
            "check()", [], rate, algorithm, scope, "per call", "per call", "per call", "", burst
        )
        _add(row, counts)
        rows.append(row)
    return rows


def _sort_key(item: tuple[LimitKey, list[int]]) -> tuple[str, str, str, int]:
    rate, algorithm, scope, burst = item[0]
    return (rate, algorithm, scope, burst or 0)


def _add(row: LimitRow, counts: list[int]) -> None:
    for outcome, count in enumerate(counts):
        row.counts[outcome] += count


def _row(limit: DeclaredLimit, secret: Optional[bytes]) -> LimitRow:
    rule = limit.rule
    limiter = rule.limiter
    if limit.bucket_scope is not None:
        scope = limit.bucket_scope
    elif limit.kind == MESSAGE_KIND:
        scope = f"{MESSAGE_SCOPE_PREFIX}<route> (per route)"
    else:
        scope = "per route: " + ", ".join(sorted({f"{m}:{p}" for m, p in limit.route_scopes}))
    cost = limit.costs or _spec(rule.cost if rule.cost is not None else limiter.cost, "1")
    shadow = {None: "as the limiter" if limiter.shadow else "", True: "shadow", False: ""}[
        rule.shadow
    ]
    return LimitRow(
        kind=limit.kind,
        where=limit.where,
        rate=rule.rate if isinstance(rule.rate, str) else f"per request: {_name(rule.rate)}",
        algorithm=limit.algorithm(),
        scope=scope,
        key=describe_key(rule.key if rule.key is not None else limiter.key, secret),
        tenant=_spec(rule.tenant if rule.tenant is not None else limiter.tenant, "none"),
        cost=cost,
        shadow=shadow,
        burst=rule.burst,
        limit=limit,
    )


def describe_key(spec: object, secret: Optional[bytes]) -> str:
    """How a rule's identity is found, in words (a fixed identity in its shown form)."""
    if spec is None:
        return "client address"
    if isinstance(spec, ClientIdentity):
        words = "client address"
        if spec.trusted_proxies:
            words += f" (through {len(spec.trusted_proxies)} trusted proxy networks)"
        if spec.api_key_header:
            words = f"API key ({spec.api_key_header}), else {words}"
        return words
    if isinstance(spec, (str, bytes)):
        return f"fixed: {shown_identity(spec, secret)}"
    return f"callback {_name(spec)}"


def _spec(spec: object, default: str) -> str:
    if spec is None:
        return default
    if callable(spec):
        return f"callback {_name(spec)}"
    return str(spec)


def _name(function: object) -> str:
    return str(getattr(function, "__qualname__", None) or type(function).__qualname__)
