"""One identity's exact usage on every limit the dashboard lists, and its reset.

Usage is read from the backend (``limiter.get_usage``: a peek, nothing is
charged) for each limit with a known rate: on each scope it was decided in
(as recorded), else on the scope its declaration gives. A limit whose rule
fixes the identity (``key="..."``) is read for that identity. The tenant is
the rule's (none, or a fixed one); the operator's is used where the rule
takes it from a callback, and for checks no declared limit claims.

A reset forgets the identity everywhere (``limiter.reset``: every scope,
algorithm and window) for each tenant those limits use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from ..errors import ModeratoError
from .identities import shown_identity
from .limits import LimitRow
from .recorder import OTHER_SCOPES

if TYPE_CHECKING:
    from ..limiter import RateLimiter

MAX_TARGETS = 200


class Target(NamedTuple):
    """One read of usage: whose, on which limit, where."""

    kind: str
    key: Union[str, bytes]
    rate: str
    algorithm: str
    scope: str
    tenant: Optional[str]
    burst: Optional[int]


def targets(
    rows: Iterable[LimitRow], identity: str, tenant: Optional[str], default_tenant: object
) -> list[Target]:
    """Every (limit, scope) whose usage an inspection reads, each once."""
    found: dict[Target, None] = {}
    for row in rows:
        limit = row.limit
        if limit is None:
            if row.scope != OTHER_SCOPES:
                target = Target(
                    row.kind, identity, row.rate, row.algorithm, row.scope, tenant, row.burst
                )
                found[target] = None
            continue
        rate = limit.static_rate()
        if rate is None:
            continue  # given per request: its recorded rows say which rates it used
        rule = limit.rule
        key = rule.key if isinstance(rule.key, (str, bytes)) else identity
        rule_tenant = rule.tenant if rule.tenant is not None else default_tenant
        # No tenant, or a fixed one, is the rule's; one from a callback is the operator's.
        if rule_tenant is None or isinstance(rule_tenant, str):
            fixed_tenant = rule_tenant
        else:
            fixed_tenant = tenant
        for scope in row.scopes_seen or limit.exact_scopes():
            target = Target(row.kind, key, rate, limit.algorithm(), scope, fixed_tenant, rule.burst)
            found[target] = None
    return list(found)[:MAX_TARGETS]


async def usage(limiter: RateLimiter, wanted: list[Target], identity: str) -> list[dict[str, Any]]:
    """Each target's usage, read concurrently; a target that fails says why."""
    secret = limiter._keyspace.identity_secret
    replies = await asyncio.gather(
        *(
            limiter.get_usage(
                target.key,
                target.rate,
                scope=target.scope,
                algorithm=target.algorithm,
                tenant_type=target.tenant,
                burst=target.burst,
            )
            for target in wanted
        ),
        return_exceptions=True,
    )
    rows = []
    for target, reply in zip(wanted, replies):
        row: dict[str, Any] = {
            "kind": target.kind,
            "rate": target.rate,
            "burst": target.burst,
            "algorithm": target.algorithm,
            "scope": target.scope,
            "tenant": target.tenant,
            # A rule's own fixed identity, shown as the dashboard shows identities.
            "fixed_key": None if target.key == identity else shown_identity(target.key, secret),
        }
        if isinstance(reply, ModeratoError):
            row["error"] = f"{type(reply).__name__}: {reply}"
        elif isinstance(reply, BaseException):
            raise reply
        else:
            row.update(
                {
                    name: reply[name]
                    for name in ("limit", "current", "remaining", "reset_at", "policies")
                }
            )
        rows.append(row)
    return rows


async def reset(limiter: RateLimiter, identity: str, tenants: Iterable[Optional[str]]) -> int:
    """Forget ``identity`` on every scope, once per tenant; the number of keys deleted."""
    deleted = 0
    for tenant in dict.fromkeys(tenants):
        deleted += await limiter.reset(identity, tenant_type=tenant)
    return deleted
