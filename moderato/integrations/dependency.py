"""``limiter.dependency(...)``: the same rule as a FastAPI dependency.

Use it on one route (``Depends(limiter.dependency("10/minute"))``) or on a
whole router (``APIRouter(dependencies=[Depends(...)])``): each route it runs
for gets its own default scope, discovered from the route's template, exactly
as with the decorator. The dependency's value is the admitted CheckResult
(None when ``exempt_when`` skipped the rule). On a websocket route it limits
the handshake, as the decorator does. With other limits on the same request
(more dependencies, decorators, RateLimitMiddleware) it is decided together
with them, each on its own counter (stack.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from starlette.requests import HTTPConnection

from ..results import CheckResult
from ..specs import RateLimitDependency, RateSpec, RuleOptions
from . import stack
from .declared import declare
from .request_limits import RULE_ATTRIBUTE
from .rule import LimitRule, check_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..limiter import RateLimiter


def dependency(
    limiter: RateLimiter, rate: RateSpec, **options: Unpack[RuleOptions]
) -> RateLimitDependency:
    """A dependency enforcing ``rate``; configuration errors raise here, not per request."""
    check_options("dependency()", options)
    rule = LimitRule(limiter, rate, **options)
    rule.origin = "limiter.dependency"
    declare(rule)

    # HTTPConnection, not Request: FastAPI fills it on websocket routes too.
    async def rate_limit(request: HTTPConnection) -> Optional[CheckResult]:
        return await stack.enforce(rule, request)

    setattr(rate_limit, RULE_ATTRIBUTE, rule)  # found in the route's tree (request_limits.py)
    return rate_limit
