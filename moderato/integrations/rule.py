"""One rate-limit rule, as a decorator, a dependency or a middleware applies it to a request.

Everything static is validated when the rule is created, before any request
and before Redis is contacted: the rate, the algorithm, the scope, and a
static cost against the capacity of the rate's smallest policy. Per-request
values come from callbacks, which fail closed.

``key``, ``tenant`` and ``cost`` left unset follow the limiter's defaults
(``RateLimiter(key=..., tenant=..., cost=...)``), read per request so that
``install(app, limiter, key=...)`` after decoration still applies; without
one, the client address, no tenant and a cost of 1. A rule applies to HTTP
requests and to websocket handshakes alike (both are ``HTTPConnection``s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional, Union, cast

from starlette.requests import HTTPConnection, Request
from starlette.types import Scope

from ..algorithms import get_algorithm
from ..errors import (
    BackendError,
    ModeratoError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
    exceeded,
)
from ..habits import refuse_unknown
from ..plans import check_burst_algorithm
from ..policy import validate_burst, validate_cost
from ..results import CheckResult
from ..specs import RULE_OPTIONS, CostSpec, ExemptWhen, KeySpec, RateSpec, TenantSpec, check_specs
from .callbacks import call_callback, callback_raised, callback_returned_unusable
from .decisions import has_middleware, record
from .http_errors import http_error
from .identity import DEFAULT_IDENTITY, ClientIdentity
from .scope import route_scope
from .websocket_errors import is_websocket, websocket_error

if TYPE_CHECKING:
    from ..limiter import RateLimiter

CheckArguments = tuple[Union[str, bytes], str, int, Optional[str], str]
"""A check's key, rate, cost, tenant and scope, as one request resolves them."""


def check_options(
    where: str, options: Mapping[str, object], accepted: frozenset[str] = RULE_OPTIONS
) -> None:
    """Refuse keywords ``where`` does not take, naming it and, for another library's
    keyword, the moderato equivalent (habits.py): before LimitRule's own TypeError
    would name LimitRule instead."""
    if not options.keys() <= accepted:
        refuse_unknown(where, options, accepted)


class LimitRule:
    """A validated rule: what to charge whom, where, under which policy."""

    origin = "LimitRule"
    """What declared it, as errors name it: ``@limiter.limit``, ``limiter.dependency``..."""

    def __init__(
        self,
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
        endpoint: Optional[Callable[..., Any]] = None,
        burst: Optional[int] = None,
    ) -> None:
        self.limiter = limiter
        self.endpoint = endpoint
        """Names the fallback scope if the route template cannot be discovered."""
        self.rate = rate
        self.key = key
        """None follows the limiter's default key, else the client address."""
        self.algorithm = algorithm
        self.scope = scope
        self.cost = cost
        self.tenant = tenant
        self.shadow = shadow
        """None follows the limiter; True observes without denying; False always enforces."""
        self.exempt_when = exempt_when
        self.burst = burst
        """What the bucket holds, apart from the rate's limit; None: the limit."""
        self._validate()

    def _validate(self) -> None:
        if self.algorithm is not None:
            get_algorithm(self.algorithm)
        if self.scope is not None and not isinstance(self.scope, str):
            raise RateLimitConfigError(
                f"scope must be a string or None, got {type(self.scope).__name__}"
            )
        # Parses the rate and checks it against the algorithm's exact range (and the burst).
        plan = (
            self.limiter.plan_for(self.rate, self.algorithm, self.burst)
            if isinstance(self.rate, str)
            else None
        )
        if plan is None and self.burst is not None:
            # A rate given per request: the burst is checked with it, each time; its
            # algorithm and type now.
            check_burst_algorithm(get_algorithm(self.algorithm or self.limiter.default_algorithm))
            validate_burst(self.burst)
        cost = check_specs(
            rate=self.rate,
            key=self.key,
            tenant=self.tenant,
            cost=self.cost,
            exempt_when=self.exempt_when,
        )
        if cost is not None and plan is not None and cost > plan.policy.smallest_limit:
            capacity = plan.policy.smallest_limit
            raise RateLimitConfigError(
                f"cost {cost} exceeds capacity {capacity} of policy {plan.policy.described}; "
                "such a request could never be admitted"
            )

    async def enforce(
        self, request: HTTPConnection, *, scope: Optional[str] = None, convert: bool = True
    ) -> Optional[CheckResult]:
        """Decide and charge for ``request``; record the decision; raise on a denial.

        Returns None, charging nothing, when ``exempt_when`` says so. Raises
        RateLimitExceeded (429, or 422 for a cost above capacity),
        RateLimitCallbackError, or BackendError when Redis cannot decide.
        Without a moderato middleware around the request, they are raised as
        their HTTPException subclasses, which any Starlette app answers; on a
        websocket handshake, as the form that refuses it (websocket_errors.py).
        ``convert=False`` raises moderato's own exceptions in every case.
        """
        # decide() inlined: one coroutine between the endpoint and the limiter.
        try:
            if self.exempt_when is not None and await self.exempted(request):
                return None
            arguments = self._arguments_now(request, scope)
            if arguments is None:
                arguments = await self._arguments(request, scope)
            result = await self._checked(arguments)
            record(request.scope, result)
            if not result.allowed:
                raise exceeded(result)
            return result
        except (RateLimitExceeded, BackendError, RateLimitCallbackError) as error:
            converted = self._converted(error, request.scope) if convert else None
            if converted is None:
                raise
            raise converted from error.__cause__

    async def check(
        self, request: HTTPConnection, scope: Optional[str] = None
    ) -> Optional[CheckResult]:
        """``enforce`` raising moderato's own exceptions, for a caller that answers them itself."""
        return await self.enforce(request, scope=scope, convert=False)

    @staticmethod
    def _converted(error: ModeratoError, asgi_scope: Scope) -> Optional[Exception]:
        # asgi_scope: the request's ASGI scope; a bare `scope` here is the bucket's name.
        if is_websocket(asgi_scope):
            return websocket_error(error, asgi_scope)
        return None if has_middleware(asgi_scope) else http_error(error, asgi_scope)

    async def exempted(self, request: HTTPConnection) -> bool:
        """True when ``exempt_when`` skips this request; a non-bool answer is its failure."""
        if self.exempt_when is None:
            return False
        verdict = await call_callback("exempt_when", self.exempt_when, _as_request(request))
        if not isinstance(verdict, bool):
            raise callback_returned_unusable(
                "exempt_when", f"exempt_when returned {type(verdict).__name__}, not bool"
            )
        return verdict

    async def decide(self, request: HTTPConnection, scope: Optional[str] = None) -> CheckResult:
        """Decide and charge without raising: the decision, admitted or denied."""
        arguments = self._arguments_now(request, scope)
        if arguments is None:
            arguments = await self._arguments(request, scope)
        result = await self._checked(arguments)
        record(request.scope, result)
        return result

    def _arguments_now(
        self, request: HTTPConnection, scope: Optional[str]
    ) -> Optional[CheckArguments]:
        """The check's arguments without a coroutine, when every value is static or the
        default identity (known to be synchronous); None when ``_arguments`` must await.
        """
        rate = self.rate
        key_spec, tenant, cost = self._specs()
        if type(rate) is not str or type(cost) is not int:
            return None
        if tenant is not None and type(tenant) is not str:
            return None
        key = self._key_now(key_spec, _as_request(request))
        if key is None:
            return None
        return key, rate, cost, tenant, self._scope(request, scope)

    async def _arguments(self, request: HTTPConnection, scope: Optional[str]) -> CheckArguments:
        """The check's arguments, awaiting only the callbacks among them."""
        callback_request = _as_request(request)
        rate = self.rate
        if type(rate) is not str:
            rate = await self._rate(callback_request)
        key_spec, tenant, cost = self._specs()
        key = self._key_now(key_spec, callback_request)
        if key is None:
            key = await self._key(key_spec, callback_request)
        if tenant is not None and type(tenant) is not str:
            tenant = await self._tenant(tenant, callback_request)
        if type(cost) is not int:
            cost = await self._cost(cost, callback_request)
        return key, rate, cost, tenant, self._scope(request, scope)

    def _checked(self, arguments: CheckArguments) -> Awaitable[CheckResult]:
        """The limiter's check of these arguments, for the caller to await (no coroutine here)."""
        key, rate, cost, tenant, scope = arguments
        return self.limiter.check_with_info(
            key,
            rate,
            cost=cost,
            tenant_type=tenant,
            scope=scope,
            algorithm=self.algorithm,
            shadow=self.shadow,
            burst=self.burst,
        )

    def _specs(self) -> tuple[KeySpec, Optional[TenantSpec], CostSpec]:
        """The key, tenant and cost to charge: the rule's own, else the limiter's defaults
        (read per request: ``install(app, limiter, key=...)`` may set them after the rule
        was made), else the client address, no tenant and a cost of 1."""
        limiter = self.limiter
        key = self.key if self.key is not None else limiter.key
        tenant = self.tenant if self.tenant is not None else limiter.tenant
        cost = self.cost if self.cost is not None else limiter.cost
        return (
            DEFAULT_IDENTITY if key is None else key,
            tenant,
            1 if cost is None else cost,
        )

    def _scope(self, request: HTTPConnection, scope: Optional[str]) -> str:
        return scope or self.scope or route_scope(request.scope, self.endpoint)

    async def _rate(self, request: Request) -> str:
        if isinstance(self.rate, str):
            return self.rate
        rate = await call_callback("rate", self.rate, request)
        try:
            self.limiter.plan_for(rate, self.algorithm, self.burst)
        except RateLimitConfigError as error:
            raise callback_returned_unusable("rate", str(error)) from error
        return rate

    @staticmethod
    def _key_now(spec: KeySpec, request: Request) -> Union[str, bytes, None]:
        """The identity without a coroutine when it is static or a ClientIdentity (the
        default, known to be synchronous); None when ``_key`` must await a callback.
        """
        if isinstance(spec, (str, bytes)):
            return spec
        if type(spec) is not ClientIdentity:
            return None
        try:
            return spec(request)
        except Exception as error:
            raise callback_raised("key", spec, error) from error

    @staticmethod
    async def _key(spec: KeySpec, request: Request) -> Union[str, bytes]:
        if isinstance(spec, (str, bytes)):
            return spec
        key = await call_callback("key", spec, request)
        if not isinstance(key, (str, bytes)):
            raise callback_returned_unusable(
                "key", f"key callback returned {type(key).__name__}, not str or bytes"
            )
        return key

    @staticmethod
    async def _tenant(spec: TenantSpec, request: Request) -> Optional[str]:
        if isinstance(spec, str):
            return spec
        tenant = await call_callback("tenant", spec, request)
        if tenant is not None and not isinstance(tenant, str):
            raise callback_returned_unusable(
                "tenant", f"tenant callback returned {type(tenant).__name__}, not str or None"
            )
        return tenant

    @staticmethod
    async def _cost(spec: CostSpec, request: Request) -> int:
        if not callable(spec):
            return spec
        cost = await call_callback("cost", spec, request)
        try:
            return validate_cost(cost)
        except RateLimitConfigError as error:
            raise callback_returned_unusable("cost", str(error)) from error


def _as_request(connection: HTTPConnection) -> Request:
    """The connection as callbacks are typed to receive it.

    On a websocket route it is a WebSocket: like a Request, an HTTPConnection
    with ``headers``, ``client``, ``url`` and ``path_params``, which is all a
    key, tenant, cost, rate or exempt_when callback may use (there is no body).
    """
    return cast(Request, connection)
