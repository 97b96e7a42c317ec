"""RateLimiter's numeric options, checked by type before anything uses them.

A wrong type is a RateLimitConfigError naming the option, the expected type
and what was given, like a wrong value: never a bare TypeError from deep
inside the client or the breaker.
"""

from __future__ import annotations

import math

from .errors import RateLimitConfigError


def seconds_option(name: str, value: object) -> float:
    """A positive, finite number of seconds (int or float; not bool, not str)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RateLimitConfigError(
            f"{name} must be a number of seconds (int or float), "
            f"got {type(value).__name__} {value!r:.40}"
        )
    if not (math.isfinite(value) and value > 0):
        raise RateLimitConfigError(
            f"{name} must be a positive, finite number of seconds, got {value!r}"
        )
    return float(value)


def count_option(name: str, value: object, *, at_least: int = 1) -> int:
    """A whole number (int; not bool, not float, not str) of at least ``at_least``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RateLimitConfigError(
            f"{name} must be an int, got {type(value).__name__} {value!r:.40}"
        )
    if value < at_least:
        raise RateLimitConfigError(f"{name} must be at least {at_least}, got {value}")
    return value
