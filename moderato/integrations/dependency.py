"""``limiter.dependency(...)``: the same rule as a FastAPI dependency.

Use it on one route (``Depends(limiter.dependency("10/minute"))``) or on a
whole router (``APIRouter(dependencies=[Depends(...)])``): each route it runs
for gets its own default scope, discovered from the route's template, exactly
as with the decorator. The dependency's value is the admitted CheckResult.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Callable, Optional

from starlette.requests import Request

from ..results import CheckResult
from .rule import CostSpec, KeySpec, LimitRule, RateSpec, TenantSpec

if TYPE_CHECKING:
    from ..limiter import RateLimiter

RateLimitDependency = Callable[[Request], Awaitable[CheckResult]]


def dependency(
    limiter: RateLimiter,
    rate: RateSpec,
    *,
    key: Optional[KeySpec] = None,
    algorithm: Optional[str] = None,
    scope: Optional[str] = None,
    cost: CostSpec = 1,
    tenant: Optional[TenantSpec] = None,
    shadow: Optional[bool] = None,
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
    )

    async def rate_limit(request: Request) -> CheckResult:
        return await rule.enforce(request)

    return rate_limit
