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

import contextlib
import logging
import weakref
from typing import Any, Callable

from ..errors import RateLimitConfigError
from .scope import routed_endpoints

logger = logging.getLogger("moderato")

_wrapped: weakref.WeakKeyDictionary[Callable[..., Any], list[tuple[str, weakref.ref[Any]]]] = (
    weakref.WeakKeyDictionary()
)
"""Function @limiter.limit wrapped -> (rate, wrapper) per wrap; weak both ways, so nothing leaks."""


def remember(original: Callable[..., Any], wrapper: Callable[..., Any], rate: object) -> None:
    """Record that ``original`` was wrapped; registering it (and not its wrapper) is a mistake."""
    # A callable that cannot be weakly referenced (an object with __slots__) goes unchecked.
    with contextlib.suppress(TypeError):
        _wrapped.setdefault(original, []).append((repr(rate), weakref.ref(wrapper)))


def misplaced_limits(app: Any) -> list[str]:
    """One message per route of ``app`` (mounts included) whose endpoint is a wrapped function.

    A function routed both bare and wrapped (one route limited, another
    deliberately not) is not reported: the wrapper is routed too.
    """
    router = getattr(app, "router", app)
    if not isinstance(getattr(router, "routes", None), list):
        return []  # not a Starlette routing tree: nothing to check
    routed = routed_endpoints(router)
    routed_ids = {id(endpoint) for endpoint, _ in routed}
    problems = []
    for endpoint, path in routed:
        try:
            wraps = _wrapped.get(endpoint)  # type: ignore[call-overload]
        except TypeError:
            continue
        if not wraps or any(id(wrapper()) in routed_ids for _, wrapper in wraps):
            continue
        rates = ", ".join(rate for rate, _ in wraps)
        name = f"{getattr(endpoint, '__module__', '?')}.{getattr(endpoint, '__qualname__', '?')}"
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
