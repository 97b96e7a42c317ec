"""``limiter.dependency(...)``: the same rule as a FastAPI dependency.

Use it on one route (``Depends(limiter.dependency("10/minute"))``) or on a
whole router (``APIRouter(dependencies=[Depends(...)])``): each route it runs
for gets its own default scope, discovered from the route's template, exactly
as with the decorator. The dependency's value is the admitted CheckResult
(None when ``exempt_when`` skipped the rule). On a websocket route it limits
the handshake, as the decorator does.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Callable, Optional

from starlette.requests import HTTPConnection

from ..results import CheckResult
from .rule import CostSpec, ExemptWhen, KeySpec, LimitRule, RateSpec, TenantSpec

if TYPE_CHECKING:
    from ..limiter import RateLimiter

RateLimitDependency = Callable[[HTTPConnection], Awaitable[Optional[CheckResult]]]


def dependency(
    limiter: RateLimiter,
    rate: RateSpec,
    *,
    key: Optional[KeySpec] = None,
    algorithm: Optional[str] = None,
    scope: Optional[str] = None,
    cost: Optional[CostSpec] = None,
    tenant: Optional[TenantSpec] = None,
    shadow: Optional[bool] = None,
    exempt_when: Optional[ExemptWhen] = None,
) -> RateLimitDependency:
    """A dependency enforcing ``rate``; configuration errors raise here, not per request."""
    rule = LimitRule(
        limiter,
        rate,
        key=key,
        algorithm=algorithm,
        scope=scope,
        cost=cost,
        tenant=tenant,
        shadow=shadow,
        exempt_when=exempt_when,
    )

    # HTTPConnection, not Request: FastAPI fills it on websocket routes too.
    async def rate_limit(request: HTTPConnection) -> Optional[CheckResult]:
        return await rule.enforce(request)

    return rate_limit
