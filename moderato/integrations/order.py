"""Finds ``@limiter.limit`` placed above the route decorator, where it limits nothing.

``@app.get(...)`` registers the function it receives. Written above it,
``@limiter.limit(...)`` wraps a function that is already registered: the
route keeps the unwrapped one and is never limited, and nothing fails. The
decorator therefore remembers each function it wrapped; a route whose
endpoint is one of them is misplaced. The check runs at startup under
``install()`` (raising) and on the first request through either middleware
(logging an error).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable

from ..errors import RateLimitConfigError
from .scope import routed_endpoints

logger = logging.getLogger("moderato")

_wrapped: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()
"""Functions @limiter.limit wrapped -> the rates it put on them (the wrapper holds the limit)."""


def remember(original: Callable[..., Any], rate: object) -> None:
    """Record that ``original`` was wrapped; registering it as an endpoint is then a mistake."""
    try:
        rates = _wrapped.get(original)
        _wrapped[original] = f"{rates}, {rate!r}" if rates else repr(rate)
    except TypeError:  # not weak-referenceable (a callable object with __slots__): unchecked
        pass


def misplaced_limits(app: Any) -> list[str]:
    """One message per route of ``app`` (mounts included) whose endpoint is a wrapped function."""
    router = getattr(app, "router", app)
    if not isinstance(getattr(router, "routes", None), list):
        return []  # not a Starlette routing tree: nothing to check
    problems = []
    for endpoint, path in routed_endpoints(router):
        try:
            rates = _wrapped.get(endpoint)  # type: ignore[call-overload]
        except TypeError:
            continue
        if rates is not None:
            name = (
                f"{getattr(endpoint, '__module__', '?')}.{getattr(endpoint, '__qualname__', '?')}"
            )
            problems.append(
                f"route {path} ({name}) is not rate limited: @limiter.limit({rates}) is written "
                "above the route decorator, which registered the function before the limit "
                "wrapped it; put @limiter.limit(...) directly below @app.get(...)"
            )
    return problems


def check_order(app: Any) -> None:
    """Raise RateLimitConfigError naming every misplaced limit in ``app``."""
    problems = misplaced_limits(app)
    if problems:
        raise RateLimitConfigError("; ".join(problems))


def log_misplaced(app: Any) -> None:
    """Log an error per misplaced limit (a middleware's first request cannot fail startup)."""
    for problem in misplaced_limits(app):
        logger.error("moderato: %s", problem)
