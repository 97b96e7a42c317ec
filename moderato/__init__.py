"""moderato: rate limiting for async Python web apps, decided atomically in Redis."""

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    BackendError,
    BackendUnavailableError,
    ModeratoError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
)
from .limiter import RateLimiter
from .policy import Policy, Rate, parse_rate
from .results import CheckResult, PolicyState

if TYPE_CHECKING:
    from .integrations import (
        ClientIdentity,
        MessageLimit,
        RateLimitHeadersMiddleware,
        RateLimitMiddleware,
        install,
    )

# The HTTP integration needs Starlette (the `fastapi` extra); the core does not,
# so those names are imported on first use.
_HTTP_NAMES = (
    "ClientIdentity",
    "MessageLimit",
    "RateLimitHeadersMiddleware",
    "RateLimitMiddleware",
    "install",
)


def __getattr__(name: str) -> Any:
    if name in _HTTP_NAMES:
        from . import integrations

        return getattr(integrations, name)
    raise AttributeError(f"module 'moderato' has no attribute {name!r}")


__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "CheckResult",
    "ClientIdentity",
    "MessageLimit",
    "ModeratoError",
    "Policy",
    "PolicyState",
    "Rate",
    "RateLimitCallbackError",
    "RateLimitConfigError",
    "RateLimitExceeded",
    "RateLimitHeadersMiddleware",
    "RateLimitMiddleware",
    "RateLimiter",
    "__version__",
    "install",
    "parse_rate",
]
