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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Union

import pytest
import pytest_asyncio
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from cluster import RedisCluster, call, identities_per_shard, script_calls
from differential_calls import Scenario, run_scenario, scenarios
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lua_harness import LuaHarness, open_harness
from redis_servers import RedisServer, free_port, running

from moderato import RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.redis import RedisBackend
from moderato.backends.redis_py import RedisPyClient
from moderato.errors import BackendError, RateLimitConfigError, RedisReplyError
from moderato.scripts import load_script
from moderato.sync import RateLimiter as SyncRateLimiter

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
    yield from running(RedisCluster())


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


# -- NOSCRIPT recovery: one recovery, then EVALSHA again ------------------------------------
#
# Between bursts the scripts are flushed (as a restart or a failover to a fresh
# replica would). INFO commandstats, reset before each burst, counts what the
# server ran: the first check of a burst meets NOSCRIPT (a failed EVALSHA) and
# recovers once (EVAL for the asyncio adapter, SCRIPT LOAD then EVALSHA for the
# blocking one); every later check of the burst is a plain EVALSHA.

BURSTS = 3
CHECKS_PER_BURST = 20
CONCURRENT_CHECKS = 64
ScriptCalls = dict[str, tuple[int, int]]


def _flush_scripts(ports: Sequence[int]) -> None:
    for port in ports:
        call(port, "SCRIPT", "FLUSH")
        call(port, "CONFIG", "RESETSTAT")


def _expected_remaining(burst: int, limit: int) -> list[int]:
    first = limit - 1 - burst * CHECKS_PER_BURST
    return list(range(first, first - CHECKS_PER_BURST, -1))


async def test_asyncio_client_recovers_from_noscript_once_then_sends_evalsha(
    own_redis_server: RedisServer,
) -> None:
    port = own_redis_server.port
    pool = redis.asyncio.BlockingConnectionPool(port=port, max_connections=16, timeout=5)
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        limiter = RateLimiter(client, key_prefix="byo")
        for burst in range(BURSTS):
            _flush_scripts([port])
            results = [
                await limiter.check_with_info("seq", "100/hour") for _ in range(CHECKS_PER_BURST)
            ]
            assert [r.remaining for r in results] == _expected_remaining(burst, 100)
            # (calls, failed calls): one NOSCRIPT, one EVAL (which caches the script), and
            # the other 19 checks EVALSHA.
            assert script_calls(port) == {
                "evalsha": (CHECKS_PER_BURST, 1),
                "eval": (1, 0),
                "script|load": (0, 0),
            }
        # Concurrent checks after a flush: each one already sent meets NOSCRIPT and
        # recovers by itself; the decisions stay exact, and the next checks are EVALSHA.
        _flush_scripts([port])
        results = await asyncio.gather(
            *(limiter.check_with_info("many", "40/hour") for _ in range(CONCURRENT_CHECKS))
        )
        assert sorted(r.remaining for r in results if r.allowed) == list(range(40))
        assert sum(not r.allowed for r in results) == CONCURRENT_CHECKS - 40
        stats = script_calls(port)
        # One EVAL per check that met NOSCRIPT: a check may take a connection another
        # one freed and send its EVALSHA before any EVAL has loaded the script.
        noscript = stats["evalsha"][1]
        assert 1 <= noscript <= CONCURRENT_CHECKS
        assert stats == {
            "evalsha": (CONCURRENT_CHECKS, noscript),
            "eval": (noscript, 0),
            "script|load": (0, 0),
        }
        call(port, "CONFIG", "RESETSTAT")
        for _ in range(CHECKS_PER_BURST):
            assert not (await limiter.check_with_info("many", "40/hour")).allowed
        assert script_calls(port) == {
            "evalsha": (CHECKS_PER_BURST, 0),
            "eval": (0, 0),
            "script|load": (0, 0),
        }
    finally:
        await client.aclose()


def test_blocking_client_recovers_from_noscript_once_then_sends_evalsha(
    own_redis_server: RedisServer,
) -> None:
    port = own_redis_server.port
    pool = redis.BlockingConnectionPool(port=port, max_connections=16, timeout=5)
    client = redis.Redis(connection_pool=pool)
    try:
        limiter = SyncRateLimiter(client, key_prefix="byo")
        for burst in range(BURSTS):
            _flush_scripts([port])
            results = [limiter.check_with_info("seq", "100/hour") for _ in range(CHECKS_PER_BURST)]
            assert [r.remaining for r in results] == _expected_remaining(burst, 100)
            # One NOSCRIPT, one SCRIPT LOAD, the first check's EVALSHA again, then 19 more.
            assert script_calls(port) == {
                "evalsha": (CHECKS_PER_BURST + 1, 1),
                "eval": (0, 0),
                "script|load": (1, 0),
            }
        _flush_scripts([port])
        with ThreadPoolExecutor(16) as threads:
            results = list(
                threads.map(
                    lambda _: limiter.check_with_info("many", "40/hour"), range(CONCURRENT_CHECKS)
                )
            )
        assert sorted(r.remaining for r in results if r.allowed) == list(range(40))
        stats = script_calls(port)
        loads = stats["script|load"][0]
        assert 1 <= loads == stats["evalsha"][1] <= 16  # one per thread that met NOSCRIPT
        assert stats == {
            "evalsha": (CONCURRENT_CHECKS + loads, loads),
            "eval": (0, 0),
            "script|load": (loads, 0),
        }
        call(port, "CONFIG", "RESETSTAT")
        for _ in range(CHECKS_PER_BURST):
            assert not limiter.check_with_info("many", "40/hour").allowed
        assert script_calls(port) == {
            "evalsha": (CHECKS_PER_BURST, 0),
            "eval": (0, 0),
            "script|load": (0, 0),
        }
    finally:
        client.close()


def _per_shard_bursts(cluster: RedisCluster, check: Callable[[str], int]) -> list[ScriptCalls]:
    """Bursts on one identity per shard, the scripts flushed on every primary between
    them, every decision exact: each burst's script calls per primary, in the order
    the identities were checked."""
    shards = cluster.shards()
    identities = {port: ids[0] for port, ids in identities_per_shard(shards, 1).items()}
    assert len(identities) == 3
    seen: list[ScriptCalls] = []
    for burst in range(BURSTS):
        _flush_scripts(list(identities))
        for identity in identities.values():
            remaining = [check(identity) for _ in range(CHECKS_PER_BURST)]
            assert remaining == _expected_remaining(burst, 100), (identity, burst)
        seen.append([script_calls(port) for port in identities])
    return seen


async def test_asyncio_cluster_client_recovers_from_noscript_once_per_node(
    cluster: RedisCluster,
) -> None:
    client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.shards()[0].primary)
    try:
        limiter = RateLimiter(client, key_prefix="byo-noscript")
        await limiter.connect()
        loop = asyncio.get_running_loop()

        def check(identity: str) -> int:
            # _per_shard_bursts is blocking code: it runs in a thread, each check on the loop.
            future = asyncio.run_coroutine_threadsafe(
                limiter.check_with_info(identity, "100/hour"), loop
            )
            return future.result(timeout=10).remaining

        seen = await loop.run_in_executor(None, _per_shard_bursts, cluster, check)
        # Every primary met NOSCRIPT once per burst and was sent the EVAL that loads it.
        recovered = {"evalsha": (CHECKS_PER_BURST, 1), "eval": (1, 0), "script|load": (0, 0)}
        assert seen == [[recovered] * 3] * BURSTS
    finally:
        await client.aclose()


def test_blocking_cluster_client_recovers_from_noscript_once_per_node(
    cluster: RedisCluster,
) -> None:
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.shards()[0].primary)
    try:
        limiter = SyncRateLimiter(client, key_prefix="byo-noscript-sync")
        seen = _per_shard_bursts(
            cluster, lambda identity: limiter.check_with_info(identity, "100/hour").remaining
        )
        # redis-py's blocking cluster client sends SCRIPT LOAD to every primary: after the
        # first primary's NOSCRIPT in a burst, the others already hold the script.
        first = {"evalsha": (CHECKS_PER_BURST + 1, 1), "eval": (0, 0), "script|load": (1, 0)}
        others = {"evalsha": (CHECKS_PER_BURST, 0), "eval": (0, 0), "script|load": (1, 0)}
        assert seen == [[first, others, others]] * BURSTS
    finally:
        client.close()
