"""What a rule may be given (key, tenant, cost, rate, exempt_when) and its one check.

The limiter's defaults (``RateLimiter(key=..., tenant=..., cost=...)``) and
every HTTP rule take the same specs: a value, or a callback of the request;
the blocking limiter's (``moderato.sync``) a value, or a callable of the
decorated function's arguments. All are checked here, so this module needs
no Starlette: the request type is named for type checkers only, and the core
imports this module, never the integrations.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypedDict, TypeVar, Union

from .errors import RateLimitConfigError
from .options import request_callback_option
from .policy import validate_cost
from .results import CheckResult

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection, Request
    from starlette.websockets import WebSocket

T = TypeVar("T")

# Quoted: Starlette is imported for type checkers only, and these aliases exist at run time.
RequestCallback = Callable[["Request"], Union[T, Awaitable[T]]]
"""A function of the request returning a value, or an awaitable of one."""

RateSpec = Union[str, RequestCallback[str]]
"""A rate string such as ``"100/minute"``, or a callback returning one per request."""
KeySpec = Union[str, bytes, RequestCallback[Union[str, bytes]]]
TenantSpec = Union[str, RequestCallback[Optional[str]]]
CostSpec = Union[int, RequestCallback[int]]
ExemptWhen = RequestCallback[bool]
"""A predicate of the request: True skips the rule for it (nothing is charged)."""

F = TypeVar("F", bound=Callable[..., Any])
"""An endpoint, as ``limiter.limit()`` decorates it (its signature kept)."""

KeyOf = Union[str, bytes, Callable[..., Union[str, bytes]]]
"""The blocking limiter's identity: a value, or a callable of the decorated function's
arguments returning one (``moderato.sync``; the HTTP rules take a KeySpec)."""
TenantOf = Union[str, Callable[..., Optional[str]]]
CostOf = Union[int, Callable[..., int]]

RateLimitDependency = Callable[["HTTPConnection"], Awaitable[Optional[CheckResult]]]
"""What ``limiter.dependency()`` returns: the admitted CheckResult, or None when exempt."""


class MessageChecker(Protocol):
    """What ``limiter.message_limit()`` returns (a MessageLimit)."""

    async def check(self, websocket: WebSocket) -> CheckResult:
        """Charge one message for this socket's identity; the decision, admitted or denied."""
        ...


class MessageOptions(TypedDict, total=False):
    """A limit's options besides its rate, declared once: the keywords of
    ``limiter.message_limit()`` and MessageLimit, forwarded to LimitRule,
    whose signature holds the defaults."""

    key: Optional[KeySpec]
    """The identity; default: the limiter's default key, else the client IP."""
    algorithm: Optional[str]
    """Default: the limiter's."""
    scope: Optional[str]
    """The bucket's name; default: the route's method and template."""
    cost: Optional[CostSpec]
    """Default: the limiter's default cost, else 1."""
    tenant: Optional[TenantSpec]
    shadow: Optional[bool]
    """None follows the limiter; True observes without denying; False always enforces."""
    burst: Optional[int]
    """token_bucket, gcra, leaky_bucket, a rate of one policy: the bucket holds ``burst``
    requests and refills the rate's limit per window. Default: the limit."""


class RuleOptions(MessageOptions, total=False):
    """A rule's options besides its rate, declared once: the keywords of
    ``limiter.limit()``, ``limiter.dependency()``, the decorator, the
    dependency and RateLimitMiddleware (whose ``scope`` defaults to "app"),
    forwarded to LimitRule."""

    exempt_when: Optional[ExemptWhen]
    """A predicate of the request: True skips the rule (nothing is charged)."""


class CallLimitOptions(TypedDict, total=False):
    """A function's limit's options besides its rate, declared once: the keywords of the
    blocking ``RateLimiter.limit()`` (moderato.sync), forwarded to its decorator."""

    key: Optional[KeyOf]
    """The identity, a value or a callable of the function's arguments; default: the
    limiter's default key, else one quota for every call."""
    tenant: Optional[TenantOf]
    cost: Optional[CostOf]
    """Default: the limiter's default cost, else 1."""
    scope: Optional[str]
    """The bucket's name; default: the function's module and qualified name."""
    algorithm: Optional[str]
    shadow: Optional[bool]
    burst: Optional[int]


MESSAGE_OPTIONS: frozenset[str] = frozenset(MessageOptions.__annotations__)
RULE_OPTIONS: frozenset[str] = frozenset(RuleOptions.__annotations__)
CALL_LIMIT_OPTIONS: frozenset[str] = frozenset(CallLimitOptions.__annotations__)


class _Absent:
    """``check_specs``' default for ``rate``: the limiter's defaults have none."""


_ABSENT: Any = _Absent()


def check_spec_types(key: object, tenant: object, cost: object, callables_of: str) -> Optional[int]:
    """``key``, ``tenant`` and ``cost`` are each unset, a value of its type, or a callable
    (of ``callables_of``: the request, or a decorated function's arguments).

    Both limiters check their defaults here, and every rule its own. Returns
    the static cost, validated, or None when it is unset or a callable.
    """
    if key is not None and not isinstance(key, (str, bytes)) and not callable(key):
        raise RateLimitConfigError(
            f"key must be a string or a callable of {callables_of}, got {type(key).__name__}"
        )
    if tenant is not None and not isinstance(tenant, str) and not callable(tenant):
        raise RateLimitConfigError(
            f"tenant must be a string or a callable of {callables_of}, got {type(tenant).__name__}"
        )
    if cost is None or callable(cost):
        return None
    return validate_cost(cost)


def check_specs(
    *,
    key: object,
    tenant: object,
    cost: object,
    rate: object = _ABSENT,
    exempt_when: object = None,
) -> Optional[int]:
    """Refuse request specs of the wrong type, and callbacks that cannot take the request.

    For the asyncio limiter's defaults and every HTTP rule (``rate`` and
    ``exempt_when`` are the rules' alone). A wrong value is a
    RateLimitConfigError naming the option, raised when the rule (or the
    limiter) is made: a callback that cannot take the request would fail
    every request (503). Returns the static cost, validated, or None.
    """
    if rate is not _ABSENT and not isinstance(rate, str) and not callable(rate):
        raise RateLimitConfigError(
            f"rate must be a string such as '100/minute' or a callable, got {type(rate).__name__}"
        )
    cost_now = check_spec_types(key, tenant, cost, "the request")
    if exempt_when is not None and not callable(exempt_when):
        raise RateLimitConfigError(
            "exempt_when must be a callable of the request returning bool, "
            f"got {type(exempt_when).__name__}"
        )
    if rate is not _ABSENT:
        request_callback_option("rate", rate, "str")
    request_callback_option("key", key, "str or bytes")
    request_callback_option("tenant", tenant, "str or None")
    request_callback_option("cost", cost, "int")
    request_callback_option("exempt_when", exempt_when, "bool")
    return cost_now
