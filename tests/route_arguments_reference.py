"""``stack.alone_arguments`` in Python: the reference csrc/fast_route.c's RouteArguments
is held to (tests/http/test_route_facts.py runs every case through both).

It is the function stack.py had before the C one, step for step.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from starlette.types import Scope

from moderato.integrations.identity import DEFAULT_IDENTITY, ClientIdentity
from moderato.integrations.request_limits import RouteFacts, learn_route
from moderato.integrations.rule import CheckArguments, LimitRule
from moderato.integrations.scope import INDEXES
from moderato.integrations.stack import DECIDED
from moderato.web.addresses import UNKNOWN_CLIENT, parsed_peer

_UNKNOWN = object()
"""A route not met yet (``RouteFacts`` to work out)."""


def alone_arguments(rule: LimitRule, scope: Scope) -> Optional[CheckArguments]:
    """``decides_alone(rule, scope)`` and then ``rule._arguments_now(request, None)``, in
    one call from what the route's first request worked out (request_limits.RouteFacts):
    the check's arguments when ``rule`` decides the request alone with nothing to await.

    None when this cannot tell (a callback to await, a route whose limits or scope
    depend on more than its router, endpoint, method and root path, a request already
    decided, an ``exempt_when``): the caller then asks ``decides_alone``. Raises only what
    ``decides_alone`` would (working the route out); never the identity's errors, which
    ``_arguments_now`` raises, converted, on the caller's path.
    """
    if rule.exempt_when is not None or DECIDED in scope:
        return None
    router = scope.get("router")
    root_path = scope.get("app_root_path")
    if root_path is None:
        root_path = scope.get("root_path", "")
    known: Any = _UNKNOWN
    entry = INDEXES.get(id(router))
    if entry is not None and entry[0]() is router and type(root_path) is str:
        known = entry[1].routes.get((scope.get("endpoint"), scope.get("method"), root_path), known)
    if known is _UNKNOWN:
        known = learn_route(scope)
    if known is None:
        return None
    facts: RouteFacts = known  # no typing.cast: a call
    alone, provider, route_scope = facts
    if alone is not rule or (
        provider is not None and getattr(provider, "dependency_overrides", None)
    ):
        return None  # several limits, or dependency overrides: route_limits reads them again
    # rule._specs(), then _arguments_now's checks and _key_now's.
    limiter = rule.limiter
    rate = rule.rate
    key_spec = rule.key if rule.key is not None else limiter.key
    tenant = rule.tenant if rule.tenant is not None else limiter.tenant
    cost = rule.cost if rule.cost is not None else limiter.cost
    if cost is None:
        cost = 1
    if type(rate) is not str or type(cost) is not int:
        return None
    if tenant is not None and type(tenant) is not str:
        return None
    if key_spec is None:
        key_spec = DEFAULT_IDENTITY
    if isinstance(key_spec, (str, bytes)):
        key: Union[str, bytes] = key_spec
    elif (
        type(key_spec) is ClientIdentity
        and key_spec.api_key_header is None
        and not key_spec.rules.trusted_proxies
    ):
        # ClientIdentity.client_ip with no proxy trusted: the peer's canonical address.
        try:
            client = scope.get("client")
            peer_text = str(client[0]) if client else ""
            key = parsed_peer(peer_text)[1] if peer_text else UNKNOWN_CLIENT
        except Exception:
            return None  # _key_now raises it, as the key callback's failure
    else:
        return None
    return key, rate, cost, tenant, rule.scope or route_scope
