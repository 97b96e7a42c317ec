"""Loading the examples under test, choosing their backend, and timing around window boundaries."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from moderato import RateLimitConfigError, RateLimiter

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# The examples import their shared helper as examples.backend_choice, as uvicorn
# finds it from the repository's root.
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
_loaded = itertools.count()


def memory_backend_available() -> bool:
    """True once ``memory://`` is part of the package (the examples' default backend)."""
    try:
        RateLimiter("memory://")
    except RateLimitConfigError:
        return False
    return True


MEMORY_PENDING = (
    "memory:// is not in this build yet (moderato/backends/memory.py); "
    "every example case runs on it as soon as it lands"
)


def load_example(name: str, backend_url: str) -> ModuleType:
    """Import examples/<name>.py afresh, as uvicorn would, with MODERATO_REDIS_URL set.

    Each call gives a new module (and so a new limiter and app): tests never
    share quota state through a cached import.
    """
    previous = os.environ.get("MODERATO_REDIS_URL")
    os.environ["MODERATO_REDIS_URL"] = backend_url
    try:
        spec = importlib.util.spec_from_file_location(
            f"example_{name}_{next(_loaded)}", EXAMPLES / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Registered first, as an import would: dataclasses look their module up.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        if previous is None:
            del os.environ["MODERATO_REDIS_URL"]
        else:
            os.environ["MODERATO_REDIS_URL"] = previous
    return module


@asynccontextmanager
async def running(app: Any) -> AsyncIterator[Any]:
    """Run the app's lifespan (connect on startup, close on shutdown) around a test."""
    async with app.router.lifespan_context(app):
        yield app


async def clear_of_boundary(window_s: int, margin_s: float = 1.0) -> None:
    """Sleep past the next fixed-window boundary if it is closer than ``margin_s``.

    Fixed windows start at multiples of their length on the backend's clock
    (this machine's, for a local Redis or memory://), so a short sequence of
    requests then falls inside one window and its numbers are exact.
    """
    wait_s = _wait_for_boundary_s(window_s, margin_s)
    if wait_s:
        await asyncio.sleep(wait_s)


def clear_of_boundary_blocking(window_s: int, margin_s: float = 1.0) -> None:
    """:func:`clear_of_boundary` for synchronous tests: blocks the thread instead."""
    wait_s = _wait_for_boundary_s(window_s, margin_s)
    if wait_s:
        time.sleep(wait_s)


def _wait_for_boundary_s(window_s: int, margin_s: float) -> float:
    left_s = window_s - time.time() % window_s
    return left_s + 0.05 if left_s < margin_s else 0.0
