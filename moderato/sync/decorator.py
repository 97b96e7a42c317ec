"""``limit()``: a blocking RateLimiter's limit on the calls of a plain function.

Every call is checked first (one decision in Redis) and runs only if
admitted; a denied call raises RateLimitExceeded (``retry_after`` says
when to try again). The identity, tenant and cost of a call are values or
callables taking the call's own arguments, so ``key=lambda user_id, **_:
user_id`` gives each user a quota of their own. What can be checked before
the first call (the rate, the algorithm, a static cost) is checked at
decoration, as the HTTP rules do.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ..errors import RateLimitCallbackError, RateLimitConfigError
from ..habits import refuse_unknown
from ..policy import validate_cost
from ..specs import (
    CALL_LIMIT_OPTIONS,
    CallLimitOptions,
    CostOf,
    F,
    KeyOf,
    TenantOf,
    check_spec_types,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .limiter import RateLimiter

__all__ = ["ALL_CALLS", "CostOf", "F", "KeyOf", "TenantOf", "limit"]

ALL_CALLS = "all"
"""The identity of a limit without ``key``: one quota shared by every call."""


def limit(limiter: RateLimiter, rate: str, **options: Unpack[CallLimitOptions]) -> Callable[[F], F]:
    """The decorator of ``RateLimiter.limit()`` (its docstring tells the options)."""
    refuse_unknown("limit()", options, CALL_LIMIT_OPTIONS)
    key = options.get("key")
    key = limiter.key if key is None else key
    tenant = options.get("tenant")
    tenant = limiter.tenant if tenant is None else tenant
    cost = options.get("cost")
    cost = limiter.cost if cost is None else cost
    scope, algorithm = options.get("scope"), options.get("algorithm")
    shadow, burst = options.get("shadow"), options.get("burst")
    check_spec_types(key, tenant, cost, "the decorated function's arguments")
    if scope is not None and not isinstance(scope, str):
        raise RateLimitConfigError(f"scope must be a string, got {type(scope).__name__}")
    plan = limiter.plan_for(rate, algorithm, burst)  # a bad rate, algorithm, burst: now
    if cost is not None and not callable(cost) and cost > plan.policy.smallest_limit:
        raise RateLimitConfigError(
            f"cost {cost} exceeds capacity {plan.policy.smallest_limit} of policy "
            f"{plan.policy.described}"
        )
    identity_of = _caller("key", key if key is not None else ALL_CALLS, _identity)
    tenant_of = _caller("tenant", tenant, _tenant)
    cost_of = _caller("cost", cost if cost is not None else 1, _cost)

    def decorate(function: F) -> F:
        if inspect.iscoroutinefunction(function):
            raise RateLimitConfigError(
                f"{function.__qualname__} is a coroutine function: the blocking RateLimiter "
                "limits plain functions; await moderato.RateLimiter's check() in async code"
            )
        where = scope if scope is not None else f"{function.__module__}.{function.__qualname__}"

        @functools.wraps(function)
        def limited(*args: Any, **kwargs: Any) -> Any:
            limiter.check(
                identity_of(args, kwargs),
                rate,
                cost=cost_of(args, kwargs),
                tenant_type=tenant_of(args, kwargs),
                scope=where,
                algorithm=algorithm,
                shadow=shadow,
                burst=burst,
            )
            return function(*args, **kwargs)

        return limited  # type: ignore[return-value]

    return decorate


def _caller(
    name: str, spec: Any, checked: Callable[[str, Any], Any]
) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A function of a call's arguments giving the value ``spec`` names for it."""
    if not callable(spec):
        value = checked(name, spec)
        return lambda args, kwargs: value

    def value_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            value = spec(*args, **kwargs)
        except Exception as error:  # fails the call: never let it through unchecked
            raise RateLimitCallbackError(name, error) from error
        try:
            return checked(name, value)
        except RateLimitConfigError as error:
            raise RateLimitCallbackError(name, error) from None

    return value_of


def _identity(name: str, value: Any) -> Union[str, bytes]:
    if not isinstance(value, (str, bytes)):
        raise RateLimitConfigError(f"{name} must give a str or bytes, got {type(value).__name__}")
    return value


def _tenant(name: str, value: Any) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise RateLimitConfigError(f"{name} must give a str or None, got {type(value).__name__}")
    return value


def _cost(name: str, value: Any) -> int:
    try:
        return validate_cost(value)
    except RateLimitConfigError as error:
        raise RateLimitConfigError(f"{name}: {error}") from None
