"""Options checked by type before anything uses them: RateLimiter's numbers, the
rules' callbacks.

A wrong type is a RateLimitConfigError naming the option, the expected type
and what was given, like a wrong value: never a bare TypeError from deep
inside the client or the breaker, nor a callback that fails every request.
"""

from __future__ import annotations

import inspect
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


def request_callback_option(name: str, callback: object, returns: str) -> None:
    """A callback of the request (key, tenant, cost, rate, exempt_when) takes the
    request as its one argument.

    Checked when the rule is made: a callback that cannot take the request
    would raise on every request, and a failing callback fails closed (503).
    """
    if not callable(callback):
        return  # a value, not a callback: checked by type elsewhere
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):
        return  # no signature to read (some builtins): the first call will tell
    try:
        signature.bind(None)
    except TypeError:
        label = getattr(callback, "__name__", type(callback).__name__)
        hint = ""
        if name == "exempt_when" and not signature.parameters:
            hint = " (slowapi's exempt_when takes no argument; write lambda request: ...)"
        raise RateLimitConfigError(
            f"{name} must be a callable of the request, {name}(request) -> {returns} "
            f"(sync or async); {label} takes {signature}{hint}"
        ) from None
