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
from redis_servers import PATIENT_TIMEOUT_S, redis_server_binary
from uvicorn_helpers import Serve, serving

from moderato import RateLimiter

redis_server_binary()


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start apps under uvicorn in this event loop; stop them after the test."""
    async with serving() as start:

        async def started(app: Any) -> str:
            return f"http://127.0.0.1:{await start(app)}"

        yield started


@pytest.fixture
async def limiter(redis_url: str) -> AsyncIterator[RateLimiter]:
    """The integration tests' limiter on the session's redis-server.

    Token buckets refill continuously, so counts never jump at a window edge mid-test;
    the patient command timeout keeps a loaded machine from failing a check the test
    counts. A test module that needs another limiter defines its own fixture.
    """
    async with RateLimiter(
        redis_url,
        command_timeout_s=PATIENT_TIMEOUT_S,
        key_prefix="it",
        default_algorithm="token_bucket",
    ) as limiter:
        yield limiter
