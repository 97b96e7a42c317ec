"""The floor apps' shared parts: the bare app's routes plus one trivial script call.

Any exact limiter that asks Redis per request pays at least the bare app's
work plus one script round trip. The floor apps pay exactly that: their
``/allowed`` awaits one ``EVALSHA`` of a script that does nothing but return
a reply shaped like a decision's (five integers), with one key and the same
arguments a fixed-window check sends. ``/limited`` is not served: a floor has
no limited path.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI

from benchmarks.apps import BODY

# One key and the arguments of a fixed-window decision (cost, apply, limit, window).
SCRIPT_SOURCE = b"return {1, 0, 999999000, 0, 60000}"
SCRIPT_SHA = hashlib.sha1(SCRIPT_SOURCE).hexdigest()
SCRIPT_KEY = b"bench-e2e-floor:{127.0.0.1}:60"
SCRIPT_ARGS = (1000, 1, 1_000_000_000, 60)


def floor_app(
    start: Callable[[], Awaitable[Any]],
    stop: Callable[[], Awaitable[Any]],
    round_trip: Callable[[], Awaitable[Any]],
) -> FastAPI:
    """The bare app whose ``/allowed`` awaits ``round_trip()`` (the client's call itself:
    a future or a coroutine, no coroutine of the app's around it)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await start()
        yield
        await stop()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return BODY

    @app.get("/allowed")
    async def allowed() -> dict[str, Any]:
        await round_trip()
        return BODY

    return app
