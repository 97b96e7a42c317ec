"""A user's own redis-py client (``redis.asyncio.Redis``, ``RedisCluster``) under the limiter.

The same scripts through redis-py: the differential suite's sequences against
the reference model, exact admission counts under concurrency (one server and
a cluster), NOSCRIPT recovery, and redis-py's exceptions turned into moderato's.
tests/test_limiter.py runs its ``limiter``-fixture tests over such a client too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Union

import pytest
import pytest_asyncio
import redis.asyncio
import redis.asyncio.cluster
from cluster import RedisCluster, identities_per_shard
from differential_calls import Scenario, run_scenario, scenarios
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lua_harness import LuaHarness, open_harness
from redis_servers import RedisServer, free_port

from moderato import RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.redis import RedisBackend
from moderato.backends.redis_py import RedisPyClient
from moderato.errors import BackendError, RateLimitConfigError, RedisReplyError
from moderato.scripts import load_script

DIFFERENTIAL = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class RedisPyHarness(LuaHarness):
    """The differential harness with every script call sent through a redis-py client.

    The scene (clock, state, snapshots) is still set and read with the built-in client.
    """

    def __init__(self, harness: LuaHarness, user_client: redis.asyncio.Redis) -> None:
        super().__init__(harness.client)
        self.scripts = harness.scripts
        self.adapter = RedisPyClient(user_client)

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Union[str, int]]) -> Any:
        return await self.adapter.evalsha(self.scripts[name], list(keys), list(args))


@pytest_asyncio.fixture
async def user_redis(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    # A blocking pool: redis-py's default pool refuses a 101st concurrent command.
    pool = redis.asyncio.BlockingConnectionPool(
        port=redis_server.port, socket_timeout=5, max_connections=32, timeout=5
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        yield client
    finally:
        await client.aclose()


@pytest_asyncio.fixture
async def py_lua(
    redis_server: RedisServer, user_redis: redis.asyncio.Redis
) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield RedisPyHarness(harness, user_redis)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@DIFFERENTIAL
@given(data=st.data())
async def test_redis_py_decisions_match_the_model(
    py_lua: LuaHarness, algorithm: str, data: st.DataObject
) -> None:
    scenario: Scenario = data.draw(scenarios(algorithm))
    await run_scenario(py_lua, algorithm, scenario)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_concurrent_checks_admit_exactly_the_limit(
    user_redis: redis.asyncio.Redis, redis_url: str, algorithm: str
) -> None:
    limiter = RateLimiter(user_redis, key_prefix="byo")
    results = await asyncio.gather(
        *(limiter.check_with_info("hot", "100/hour", algorithm=algorithm) for _ in range(500))
    )
    assert sum(r.allowed for r in results) == 100
    assert sorted(r.remaining for r in results if r.allowed) == list(range(100))
    # The same keys as the built-in client: it sees the quota spent.
    async with RateLimiter(redis_url, key_prefix="byo") as builtin:
        usage = await builtin.get_usage("hot", "100/hour", algorithm=algorithm)
    assert (usage["current"], usage["remaining"]) == (100, 0)


async def test_noscript_is_recovered_and_the_script_cached(
    user_redis: redis.asyncio.Redis, redis_url: str, redis_server: RedisServer
) -> None:
    limiter = RateLimiter(user_redis, key_prefix="byo")
    sha = load_script(ALGORITHMS["fixed_window"].name).sha
    redis_server.command("SCRIPT", "FLUSH")
    results = [await limiter.check_with_info("k", "10/minute") for _ in range(3)]
    assert [r.remaining for r in results] == [9, 8, 7]
    assert redis_server.command("SCRIPT", "EXISTS", sha) == b"*1\r\n:1\r\n"


async def test_reset_and_usage_through_a_decoding_client(
    redis_server: RedisServer, redis_url: str
) -> None:
    client = redis.asyncio.Redis(port=redis_server.port, decode_responses=True)
    try:
        limiter = RateLimiter(client, key_prefix="byo")
        for _ in range(4):
            await limiter.check("user:1", "10/minute")
        assert (await limiter.get_usage("user:1", "10/minute"))["remaining"] == 6
        assert await limiter.reset("user:1") == 1  # SCAN + UNLINK, replies as str
        assert (await limiter.get_usage("user:1", "10/minute"))["remaining"] == 10
        await limiter.close()
        assert await client.ping()  # the limiter leaves the user's client open
    finally:
        await client.aclose()


async def test_a_script_refusal_is_a_reply_error(user_redis: redis.asyncio.Redis) -> None:
    backend = RateLimiter(user_redis).backend
    assert isinstance(backend, RedisBackend)
    script = load_script(ALGORITHMS["fixed_window"].name)
    with pytest.raises(RedisReplyError, match=r"^MODERATO_ARG"):
        await backend.client.evalsha(script, ["k:{x}:60"], [1000, 1, 0, 60])


async def test_unreachable_and_slow_servers_are_backend_errors(
    own_redis_server: RedisServer,
) -> None:
    dead = redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.2)
    try:
        with pytest.raises(BackendError, match="redis-py Redis client at localhost:"):
            await RateLimiter(dead).check("user:1", "5/minute")
    finally:
        await dead.aclose()
    slow = redis.asyncio.Redis(port=own_redis_server.port, socket_timeout=0.1)
    try:
        limiter = RateLimiter(slow, key_prefix="byo")
        await limiter.connect()
        own_redis_server.pause()
        with pytest.raises(BackendError, match="Timeout"):
            await limiter.check("user:1", "5/minute")
        own_redis_server.resume()
        limiter_open = RateLimiter(slow, key_prefix="byo", fail_open=True)
        own_redis_server.pause()
        assert (await limiter_open.check_with_info("user:1", "5/minute")).bypassed
    finally:
        own_redis_server.resume()
        await slow.aclose()


def test_anything_else_is_refused_with_what_is_accepted() -> None:
    with pytest.raises(RateLimitConfigError, match=r"a URL string or a redis\.asyncio\.Redis"):
        RateLimiter(object())  # type: ignore[arg-type]


def test_moderato_imports_and_runs_without_redis_py() -> None:
    program = (
        "import sys; sys.modules['redis'] = None\n"
        "import asyncio, moderato\n"
        "limiter = moderato.RateLimiter('memory://')\n"
        "print(asyncio.run(limiter.check_with_info('k', '2/minute')).remaining)\n"
        "moderato.RateLimiter('redis://localhost')\n"
        "assert 'redis.asyncio' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"


# -- a redis-py RedisCluster ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    shared = RedisCluster().start()
    try:
        yield shared
    finally:
        shared.close()


async def test_redis_py_cluster_client_admits_exactly_the_limit(cluster: RedisCluster) -> None:
    shards = cluster.shards()
    # redis-py's cluster client has no blocking pool: room for every concurrent check.
    client = redis.asyncio.cluster.RedisCluster(
        host="127.0.0.1", port=shards[0].primary, max_connections=512
    )
    try:
        limiter = RateLimiter(client, key_prefix="byo-cluster")
        await limiter.connect()
        # One identity per shard: every primary decides some of them.
        identities = [ids[0] for ids in identities_per_shard(shards, 1).values()]
        results = await asyncio.gather(
            *(
                limiter.check_with_info(identity, "50/hour")
                for identity in identities
                for _ in range(120)
            )
        )
        admitted = {identity: 0 for identity in identities}
        for index, result in enumerate(results):
            admitted[identities[index // 120]] += result.allowed
        assert admitted == {identity: 50 for identity in identities}
        assert len(identities) == 3
        assert await limiter.reset(identities[0]) == 1  # SCAN routed by the hash tag
        assert (await limiter.get_usage(identities[0], "50/hour"))["remaining"] == 50
    finally:
        await client.aclose()
