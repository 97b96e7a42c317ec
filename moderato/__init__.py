"""moderato: rate limiting for async Python web apps, decided atomically in Redis."""

from .errors import (
    BackendError,
    ModeratoError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
)
from .limiter import RateLimiter
from .policy import Policy, Rate, parse_rate
from .results import CheckResult, PolicyState

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CheckResult",
    "ModeratoError",
    "Policy",
    "PolicyState",
    "Rate",
    "RateLimitCallbackError",
    "RateLimitConfigError",
    "RateLimitExceeded",
    "RateLimiter",
    "__version__",
    "parse_rate",
]
