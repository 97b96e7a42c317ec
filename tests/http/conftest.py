"""Tests through the web integrations: ASGI apps in process and under uvicorn, Django
in process and under gunicorn and uvicorn, the examples and the migration guides, on
memory:// and on redis-server processes they start themselves.

redis-server is looked for when this folder is collected: a missing binary stops the
run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis_servers import redis_server_binary
from uvicorn_helpers import Serve, serving

redis_server_binary()


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start apps under uvicorn in this event loop; stop them after the test."""
    async with serving() as start:

        async def started(app: Any) -> str:
            return f"http://127.0.0.1:{await start(app)}"

        yield started
