"""What every tier shares: the helper modules beside this file (redis_servers.py,
cluster.py, lua_harness.py, reference_model.py...) are importable from every
folder below it (pytest puts this conftest's folder on sys.path), and the
fixtures that start servers do so only when a test asks for them.

The tests are in folders by what they need, each folder's conftest.py looking
for it (a missing binary stops the run with its install hint, before any test):
unit/ (no server), redis/, http/, cluster/ (Cluster and Sentinel), browser/
(headless Chromium); the tests at this level need redis-server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from decision_stores import BACKENDS, DecisionStore, MemoryHarness
from lua_harness import LuaHarness, open_harness
from redis_servers import RedisServer, redis_server_binary, running

TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The tests at this level (each algorithm's behaviour file, the differential test,
    # packaging) run on redis-server; each folder below checks for what it needs in
    # its own conftest.py, and tests/unit/ needs nothing. Fail loudly and before any
    # test runs: a missing binary must never turn into skipped tests.
    if any(item.path.parent == TESTS for item in items):
        redis_server_binary()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session; tests use distinct keys (or flush)."""
    yield from running(RedisServer())


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server for one test, free to be killed, paused or restarted."""
    yield from running(RedisServer())


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    redis_server.command("FLUSHALL")
    yield redis_server.url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which backend decides: the scripts on Redis, or memory://'s store."""
    return str(request.param)


@pytest_asyncio.fixture
async def store(backend: str, request: pytest.FixtureRequest) -> AsyncIterator[DecisionStore]:
    """The backend's decisions at a test clock, empty (tests/decision_stores.py)."""
    if backend == "memory":
        yield MemoryHarness()
        return
    async with open_harness(request.getfixturevalue("redis_server")) as harness:
        yield harness


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    """The clocked scripts on the session's Redis, flushed (tests/lua_harness.py)."""
    async with open_harness(redis_server) as harness:
        yield harness
