from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis_servers import RedisServer, redis_server_binary


def pytest_sessionstart(session: pytest.Session) -> None:
    # Fail loudly and early: a missing binary must never turn into skipped tests.
    redis_server_binary()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; tests use distinct keys (or flush)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server for one test, free to be killed, paused or restarted."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    redis_server.command("FLUSHALL")
    yield redis_server.url
