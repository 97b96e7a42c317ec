"""A real uvicorn server on a free loopback port, as an async context manager."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from redis_servers import free_port


@asynccontextmanager
async def running(app: Any, **options: Any) -> AsyncIterator[int]:
    """Serve ``app`` in this event loop; yields the port. ``options`` go to uvicorn.Config."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # uvicorn would otherwise rewrite the client from X-Forwarded-For itself
        # (it trusts 127.0.0.1); moderato's own identity rules are under test.
        proxy_headers=False,
        **options,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline_s = time.monotonic() + 5
    while not server.started:
        if task.done() or time.monotonic() > deadline_s:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=5)
