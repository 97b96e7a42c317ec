"""One rate-limit rule, as a decorator, a dependency or a middleware applies it to a request.

Everything static is validated when the rule is created, before any request
and before Redis is contacted: the rate, the algorithm, the scope, and a
static cost against the capacity of the rate's smallest policy. Per-request
values come from callbacks, which fail closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from starlette.requests import Request

from ..algorithms import get_algorithm
from ..errors import BackendError, RateLimitCallbackError, RateLimitConfigError, RateLimitExceeded
from ..limiter import exceeded
from ..policy import policy_for, validate_cost
from ..results import CheckResult
from .callbacks import RequestCallback, call_callback, callback_failed
from .decisions import has_middleware, record
from .http_errors import http_error
from .identity import DEFAULT_IDENTITY
from .scope import route_scope

if TYPE_CHECKING:
    from ..limiter import RateLimiter

RateSpec = Union[str, RequestCallback[str]]
"""A rate string such as ``"100/minute"``, or a callback returning one per request."""
KeySpec = Union[str, bytes, RequestCallback[Union[str, bytes]]]
TenantSpec = Union[str, RequestCallback[Optional[str]]]
CostSpec = Union[int, RequestCallback[int]]


class LimitRule:
    """A validated rule: what to charge whom, where, under which policy."""

    def __init__(
        self,
        limiter: RateLimiter,
        rate: RateSpec,
        *,
        key: Optional[KeySpec] = None,
        algorithm: Optional[str] = None,
        scope: Optional[str] = None,
        cost: CostSpec = 1,
        tenant: Optional[TenantSpec] = None,
        shadow: Optional[bool] = None,
        endpoint: Optional[Callable[..., Any]] = None,
    ) -> None:
        self.limiter = limiter
        self.endpoint = endpoint
        """Names the fallback scope if the route template cannot be discovered."""
        self.rate = rate
        self.key: KeySpec = DEFAULT_IDENTITY if key is None else key
        self.algorithm = algorithm
        self.scope = scope
        self.cost = cost
        self.tenant = tenant
        self.shadow = shadow
        """None follows the limiter; True observes without denying; False always enforces."""
        self._validate()

    def _validate(self) -> None:
        if self.algorithm is not None:
            get_algorithm(self.algorithm)
        if self.scope is not None and not isinstance(self.scope, str):
            raise RateLimitConfigError(
                f"scope must be a string or None, got {type(self.scope).__name__}"
            )
        if not isinstance(self.rate, str) and not callable(self.rate):
            raise RateLimitConfigError(
                "rate must be a string such as '100/minute' or a callable, "
                f"got {type(self.rate).__name__}"
            )
        if isinstance(self.rate, str):
            # Parses the rate and checks it against the algorithm's exact range.
            self.limiter._plans.get(self.rate, self.algorithm)
        for name, value in (("key", self.key), ("tenant", self.tenant)):
            if value is not None and not isinstance(value, (str, bytes)) and not callable(value):
                raise RateLimitConfigError(
                    f"{name} must be a string or a callable of the request, "
                    f"got {type(value).__name__}"
                )
        if isinstance(self.tenant, bytes):
            raise RateLimitConfigError(
                "tenant must be a string or a callable of the request, got bytes"
            )
        if callable(self.cost):
            return
        cost = validate_cost(self.cost)
        if isinstance(self.rate, str):
            policy = policy_for(self.rate)
            capacity = policy.smallest_limit
            if cost > capacity:
                raise RateLimitConfigError(
                    f"cost {cost} exceeds capacity {capacity} of policy '{self.rate}'; "
                    "such a request could never be admitted"
                )

    async def enforce(self, request: Request, *, scope: Optional[str] = None) -> CheckResult:
        """Decide and charge for ``request``; record the decision; raise on a denial.

        Raises RateLimitExceeded (429, or 422 for a cost above capacity),
        RateLimitCallbackError, or BackendError when Redis cannot decide.
        Without a moderato middleware around the request, they are raised as
        their HTTPException subclasses, which any Starlette app answers.
        """
        try:
            result = await self._decide(request, scope)
            if not result.allowed:
                raise exceeded(result)
        except (RateLimitExceeded, BackendError, RateLimitCallbackError) as error:
            converted = None if has_middleware(request.scope) else http_error(error, request.scope)
            if converted is None:
                raise
            raise converted from error.__cause__
        return result

    async def _decide(self, request: Request, scope: Optional[str]) -> CheckResult:
        rate = await self._rate(request)
        key = await self._key(request)
        tenant = await self._tenant(request)
        cost = await self._cost(request)
        chosen_scope = scope or self.scope or route_scope(request.scope, self.endpoint)
        result = await self.limiter.check_with_info(
            key,
            rate,
            cost=cost,
            tenant_type=tenant,
            scope=chosen_scope,
            algorithm=self.algorithm,
            shadow=self.shadow,
        )
        record(request.scope, result)
        return result

    async def _rate(self, request: Request) -> str:
        if isinstance(self.rate, str):
            return self.rate
        rate = await call_callback("rate", self.rate, request)
        try:
            self.limiter._plans.get(rate, self.algorithm)
        except RateLimitConfigError as error:
            raise callback_failed("rate", str(error)) from error
        return rate

    async def _key(self, request: Request) -> Union[str, bytes]:
        if isinstance(self.key, (str, bytes)):
            return self.key
        key = await call_callback("key", self.key, request)
        if not isinstance(key, (str, bytes)):
            raise callback_failed(
                "key", f"key callback returned {type(key).__name__}, not str or bytes"
            )
        return key

    async def _tenant(self, request: Request) -> Optional[str]:
        if self.tenant is None or isinstance(self.tenant, str):
            return self.tenant
        tenant = await call_callback("tenant", self.tenant, request)
        if tenant is not None and not isinstance(tenant, str):
            raise callback_failed(
                "tenant", f"tenant callback returned {type(tenant).__name__}, not str or None"
            )
        return tenant

    async def _cost(self, request: Request) -> int:
        if not callable(self.cost):
            return self.cost
        cost = await call_callback("cost", self.cost, request)
        try:
            return validate_cost(cost)
        except RateLimitConfigError as error:
            raise callback_failed("cost", str(error)) from error
