"""The denial cache (moderato/backends/denial_cache.py) against a real redis-server.

A flood from one identity reaches Redis once per remembered denial; every
decision with the cache equals the one without it (two limiters, same
traffic); a reset in another limiter or another process reaches the cache;
shadow mode and fail-open behave as without it.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

import pytest
from example_helpers import clear_of_boundary
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer

from moderato import BackendError, RateLimitConfigError, RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.denial_cache import DenialCache, DenialCachingBackend
from moderato.results import CheckResult

ROOT = Path(__file__).resolve().parents[2]

CACHED = {"denial_cache_size": 10_000}
"""The cache is opt-in: every limiter here that should remember denials asks for it."""


def evalsha_calls(server: RedisServer) -> int:
    """EVALSHA calls the server has run so far (INFO commandstats)."""
    for line in server.command("INFO", "commandstats").decode().splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def script_calls(server: RedisServer) -> int:
    """Script calls of either kind (EVALSHA, and EVAL after a NOSCRIPT) the server has run."""
    calls = 0
    for line in server.command("INFO", "commandstats").decode().splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls


def cache_or_none(limiter: RateLimiter) -> Optional[DenialCache]:
    """The limiter's denial cache: its backend wrapped in a DenialCachingBackend, or None."""
    backend = limiter.backend
    return backend.cache if isinstance(backend, DenialCachingBackend) else None


def cache_of(limiter: RateLimiter) -> DenialCache:
    denials = cache_or_none(limiter)
    assert denials is not None
    return denials


async def until(condition: Any, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest.fixture
async def registry() -> AsyncIterator[CollectorRegistry]:
    yield CollectorRegistry()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_flood_reaches_redis_once_per_remembered_denial(
    redis_server: RedisServer, redis_url: str, registry: CollectorRegistry, algorithm: str
) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(
        redis_url, key_prefix="dc", enable_metrics=True, metrics_registry=registry, **CACHED
    ) as limiter:
        admitted = [await limiter.check_with_info("flood", "10/hour", algorithm=algorithm)]
        for _ in range(9):
            admitted.append(await limiter.check_with_info("flood", "10/hour", algorithm=algorithm))
        assert all(result.allowed for result in admitted)
        first = await limiter.check_with_info("flood", "10/hour", algorithm=algorithm)
        assert not first.allowed  # remembered only once the subscription is confirmed
        await until(lambda: cache_of(limiter).subscribed)
        before = evalsha_calls(redis_server)
        remembered = await limiter.check_with_info("flood", "10/hour", algorithm=algorithm)
        local = [
            await limiter.check_with_info("flood", "10/hour", algorithm=algorithm)
            for _ in range(200)
        ]
        assert evalsha_calls(redis_server) - before == 1
        assert len(cache_of(limiter)) == 1
    for result in [remembered, *local]:
        assert (result.allowed, result.status_code, result.limit, result.remaining) == (
            False,
            429,
            10,
            0,
        )
        assert result.reset_at == remembered.reset_at
        assert result.window_seconds == 3600
        assert result.retry_after is not None and remembered.retry_after is not None
        assert remembered.retry_after - 1 <= result.retry_after <= remembered.retry_after
    name = ALGORITHMS[algorithm].name
    assert sample(registry, "moderato_local_denials_total", algorithm=name) == 200
    # Local denials are denials: counted as such, with the same labels.
    assert sample(registry, "moderato_checks_total", algorithm=name, result="denied") == 202
    # ...but no backend call: only the 12 checks Redis answered count as operations.
    operations = sample(
        registry, "moderato_backend_operations_total", operation="decide", status="ok"
    )
    assert operations == 12
    assert sample(registry, "moderato_checks_total", algorithm=name, result="allowed") == 10
    assert sample(registry, "moderato_limit_exceeded_total", algorithm=name) == 202


async def test_an_admission_forgets_the_denial_it_contradicts(
    redis_server: RedisServer, redis_url: str
) -> None:
    # A denied cost of 3 is remembered; a cost of 1 is not answered by that entry, goes
    # to Redis, is admitted, and the admission forgets the entry: the next cost of 3 is
    # asked again. An admission with nothing remembered keeps the cache empty.
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(redis_url, key_prefix="dc-forget", **CACHED) as limiter:
        cache = cache_of(limiter)
        for _ in range(3):
            assert (await limiter.check_with_info("forget", "5/hour", cost=1)).allowed
        assert len(cache) == 0
        assert not (await limiter.check_with_info("forget", "5/hour", cost=3)).allowed
        await until(lambda: cache.subscribed)
        assert not (await limiter.check_with_info("forget", "5/hour", cost=3)).allowed
        assert len(cache) == 1
        before = evalsha_calls(redis_server)
        assert not (await limiter.check_with_info("forget", "5/hour", cost=3)).allowed
        assert evalsha_calls(redis_server) == before  # answered by the entry
        admitted = await limiter.check_with_info("forget", "5/hour", cost=1)
        assert (admitted.allowed, admitted.remaining) == (True, 1)
        assert len(cache) == 0
        assert evalsha_calls(redis_server) == before + 1
        denied = await limiter.check_with_info("forget", "5/hour", cost=3)
        assert (denied.allowed, denied.remaining) == (False, 1)
        assert evalsha_calls(redis_server) == before + 2
        await limiter.reset("forget")


async def test_a_local_denial_reads_as_redis_would_answer(redis_url: str) -> None:
    """The same fields as a check of the same request by a limiter without the cache."""
    await clear_of_boundary(60, margin_s=3.0)
    async with (
        RateLimiter(redis_url, key_prefix="dv", **CACHED) as cached,
        RateLimiter(redis_url, key_prefix="dv", denial_cache_size=0) as plain,
    ):
        rate = "5/minute;8/hour"
        for _ in range(5):
            assert (
                await cached.check_with_info("v", rate, cost=1, algorithm="token_bucket")
            ).allowed
        await cached.check_with_info("v", rate, cost=2, algorithm="token_bucket")
        await until(lambda: cache_of(cached).subscribed)
        await cached.check_with_info("v", rate, cost=2, algorithm="token_bucket")
        assert len(cache_of(cached)) == 1
        await asyncio.sleep(0.3)
        local = await cached.check_with_info("v", rate, cost=2, algorithm="token_bucket")
        fresh = await plain.check_with_info("v", rate, cost=2, algorithm="token_bucket")
    assert not local.allowed and not fresh.allowed
    assert local.retry_after is not None and fresh.retry_after is not None
    assert fresh.retry_after - 1 <= local.retry_after <= fresh.retry_after
    assert local.reset_at == fresh.reset_at
    without_retry = {"retry_after": None}
    assert _fields(local, without_retry) == _fields(fresh, without_retry)


def _fields(result: CheckResult, override: dict[str, Optional[int]]) -> dict[str, Any]:
    fields = {name: getattr(result, name) for name in result.__dataclass_fields__}
    fields["policies"] = tuple(
        (state.limit, state.window_seconds, state.remaining, state.reset_at)
        for state in result.policies
    )
    fields.update(override)
    return fields


async def _same_decisions(
    redis_url: str, rates: list[str], steps: int, seed: int, pause_s: float
) -> tuple[int, int]:
    """Random traffic through a cached and an uncached limiter (own prefixes): equal decisions.

    Returns (local denials, decisions compared).
    """
    rng = random.Random(seed)
    identities = [f"id{n}" for n in range(4)]
    algorithms = list(ALGORITHMS)
    registry = CollectorRegistry()
    async with (
        RateLimiter(
            redis_url,
            key_prefix=f"on{seed}",
            enable_metrics=True,
            metrics_registry=registry,
            **CACHED,
        ) as cached,
        RateLimiter(redis_url, key_prefix=f"off{seed}", denial_cache_size=0) as plain,
    ):
        # Warm the subscription so the run exercises the cache from the start.
        for _ in range(2):
            await cached.check_with_info("warm", "1/hour")
        await until(lambda: cache_of(cached).subscribed)
        for step in range(steps):
            identity = rng.choice(identities)
            rate = rng.choice(rates)
            algorithm = algorithms[identities.index(identity) % len(algorithms)]
            cost = rng.choice((1, 1, 1, 2, 3))
            if rng.random() < 0.02:
                for limiter in (cached, plain):
                    await limiter.reset(identity)
                continue
            on = await cached.check_with_info(identity, rate, cost=cost, algorithm=algorithm)
            off = await plain.check_with_info(identity, rate, cost=cost, algorithm=algorithm)
            where = f"step {step}: {identity} {rate} cost {cost} {algorithm}: {on} != {off}"
            assert (on.allowed, on.status_code) == (off.allowed, off.status_code), where
            if on.allowed:  # both from Redis: the whole state agrees
                assert (on.remaining, on.limit, on.window_seconds) == (
                    off.remaining,
                    off.limit,
                    off.window_seconds,
                ), where
            else:
                # Traffic on a key the entry shares (here: another rate with the
                # same window) may make Redis name another deciding policy; a
                # unit cost's remaining is 0 either way.
                assert on.remaining is not None and on.remaining < cost, where
            if pause_s and rng.random() < 0.2:
                await asyncio.sleep(rng.random() * pause_s)
    local = sum(
        sample(registry, "moderato_local_denials_total", algorithm=name) for name in ALGORITHMS
    )
    return int(local), steps


async def test_same_decisions_with_and_without_the_cache_over_long_windows(
    redis_url: str,
) -> None:
    """Windows no test run crosses: every decision and remaining must match exactly."""
    await clear_of_boundary(3600, margin_s=30)
    local, _ = await _same_decisions(
        redis_url, ["5/hour", "3/hour;7/day", "20/day"], steps=1500, seed=1, pause_s=0.0
    )
    assert local > 300


async def test_every_local_denial_is_one_redis_gives_as_time_advances(redis_url: str) -> None:
    """Second-long windows refill and roll over during the run.

    Two limiters on one prefix would race each other at every boundary, so
    here one limiter charges and a cacheless one peeks (get_usage) just
    before each check: when the peek says the cost fits, nothing happened
    in between and waiting only helps, so Redis would admit the check; a
    local denial then would be the cache denying what Redis admits.
    """
    rng = random.Random(3)
    identities = [f"id{n}" for n in range(4)]
    algorithms = list(ALGORITHMS)
    rates = ["3/second", "4/2 seconds;6/5 seconds"]
    registry = CollectorRegistry()
    peeked_admits = local_total = 0
    async with (
        # 1,500 steps: a loaded machine's stall past the default 0.5 s command
        # timeout would fail a step that is about the cache, not the timeout.
        RateLimiter(
            redis_url,
            key_prefix="adv",
            enable_metrics=True,
            metrics_registry=registry,
            command_timeout_s=5,
            **CACHED,
        ) as cached,
        RateLimiter(redis_url, key_prefix="adv", denial_cache_size=0, command_timeout_s=5) as plain,
    ):
        for _ in range(2):
            await cached.check_with_info("warm", "1/hour")
        await until(lambda: cache_of(cached).subscribed)
        for step in range(1500):
            identity = rng.choice(identities)
            rate = rng.choice(rates)
            algorithm = algorithms[identities.index(identity) % len(algorithms)]
            cost = rng.choice((1, 1, 1, 2, 3))
            usage = await plain.get_usage(identity, rate, algorithm=algorithm)
            fits = all(policy["remaining"] >= cost for policy in usage["policies"])
            before = _local_denials(registry)
            result = await cached.check_with_info(identity, rate, cost=cost, algorithm=algorithm)
            local = _local_denials(registry) - before
            local_total += local
            if fits:
                peeked_admits += 1
                assert local == 0 and result.allowed, (
                    f"step {step}: {identity} {rate} cost {cost} {algorithm}: "
                    f"the peek admits, the check said {result}"
                )
            if rng.random() < 0.2:
                await asyncio.sleep(rng.random() * 0.05)
    assert local_total > 50  # 443 in a calm run; fewer when the machine is slow
    assert peeked_admits > 50


def _local_denials(registry: CollectorRegistry) -> int:
    return int(
        sum(sample(registry, "moderato_local_denials_total", algorithm=name) for name in ALGORITHMS)
    )


async def _flood_until_remembered(limiter: RateLimiter, identity: str) -> None:
    for _ in range(3):
        await limiter.check_with_info(identity, "2/hour")
    await until(lambda: cache_of(limiter).subscribed)
    await limiter.check_with_info(identity, "2/hour")
    assert len(cache_of(limiter)) == 1
    assert not (await limiter.check_with_info(identity, "2/hour")).allowed


async def test_a_reset_by_another_limiter_reaches_the_cache(redis_url: str) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    async with (
        RateLimiter(redis_url, key_prefix="rx", **CACHED) as holder,
        RateLimiter(redis_url, key_prefix="rx", denial_cache_size=0) as admin,
    ):
        await _flood_until_remembered(holder, "r1")
        assert await admin.reset("r1", rate="2/hour", scope="global") >= 1
        await until(lambda: len(cache_of(holder)) == 0, timeout_s=1.0)
        assert (await holder.check_with_info("r1", "2/hour")).allowed
        # A reset of every scope (SCAN) announces itself the same way.
        await _flood_until_remembered(holder, "r1")
        assert await admin.reset("r1") >= 1
        await until(lambda: len(cache_of(holder)) == 0, timeout_s=1.0)
        assert (await holder.check_with_info("r1", "2/hour")).allowed


async def test_a_reset_in_another_process_reaches_the_cache(redis_url: str) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    script = (
        "import asyncio, sys\n"
        "from moderato import RateLimiter\n"
        "async def main():\n"
        "    async with RateLimiter(sys.argv[1], key_prefix='rp') as admin:\n"
        "        print(await admin.reset('p1', rate='2/hour', scope='global'))\n"
        "asyncio.run(main())\n"
    )
    async with RateLimiter(redis_url, key_prefix="rp", **CACHED) as holder:
        await _flood_until_remembered(holder, "p1")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", script, redis_url],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) >= 1
        await until(lambda: len(cache_of(holder)) == 0, timeout_s=1.0)
        assert (await holder.check_with_info("p1", "2/hour")).allowed


async def test_a_reset_empties_its_own_cache_at_once(redis_url: str) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(redis_url, key_prefix="ro", **CACHED) as limiter:
        await _flood_until_remembered(limiter, "o1")
        await limiter.reset("o1", rate="2/hour", scope="global")
        assert len(cache_of(limiter)) == 0
        assert (await limiter.check_with_info("o1", "2/hour")).allowed


async def test_shadow_mode_admits_local_denials_as_shadow_denied(
    redis_url: str, registry: CollectorRegistry
) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(
        redis_url,
        key_prefix="sh",
        shadow=True,
        enable_metrics=True,
        metrics_registry=registry,
        **CACHED,
    ) as limiter:
        results = [await limiter.check_with_info("s1", "2/hour") for _ in range(3)]
        await until(lambda: cache_of(limiter).subscribed)
        results += [await limiter.check_with_info("s1", "2/hour") for _ in range(20)]
    assert all(result.allowed for result in results)
    assert [result.shadow_denied for result in results] == [False, False] + [True] * 21
    assert (
        sample(registry, "moderato_checks_total", algorithm="fixed_window", result="shadow_denied")
        == 21
    )
    assert sample(registry, "moderato_local_denials_total", algorithm="fixed_window") == 19


async def test_fail_open_bypasses_when_redis_goes_away_despite_remembered_denials(
    own_redis_server: RedisServer,
) -> None:
    """The subscription's loss empties the cache: an outage is handled as without it."""
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(
        own_redis_server.url,
        key_prefix="fo",
        fail_open=True,
        metrics_registry=CollectorRegistry(),
        breaker_failures=100,
        **CACHED,
    ) as limiter:
        await _flood_until_remembered(limiter, "f1")
        own_redis_server.stop()
        await until(lambda: not cache_of(limiter).subscribed)
        assert len(cache_of(limiter)) == 0
        result = await limiter.check_with_info("f1", "2/hour")
        assert (result.allowed, result.bypassed) == (True, True)


async def test_the_cache_is_bounded(redis_url: str) -> None:
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(redis_url, key_prefix="bd", denial_cache_size=3) as limiter:
        await limiter.check_with_info("warm", "1/hour")
        await limiter.check_with_info("warm", "1/hour")
        await until(lambda: cache_of(limiter).subscribed)
        for n in range(6):
            for _ in range(2):
                await limiter.check_with_info(f"b{n}", "1/hour")
        assert len(cache_of(limiter)) == 3
        # The newest three are remembered, the oldest forgotten first.
        keys = [key[1] for key in cache_of(limiter)._entries]
        assert [key.split(b"{")[1].split(b"}")[0][-2:] for key in keys] == [b"b3", b"b4", b"b5"]


async def test_no_sent_check_stays_in_flight_however_it_ends(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Admitted, denied, refused by Redis, cancelled: the wrapper forgets every check it sent."""
    async with RateLimiter(redis_url, key_prefix="fl", **CACHED) as limiter:
        backend = limiter.backend
        assert isinstance(backend, DenialCachingBackend)
        results = [await limiter.check_with_info("f1", "2/hour") for _ in range(3)]
        assert [result.allowed for result in results] == [True, True, False]
        assert backend._in_flight == {}
        # A key of the wrong type: Redis answers with an error reply.
        (key,) = backend.decision_keys(limiter.plan_for("2/hour"), "f2", None, "global")
        redis_server.command("SADD", key.decode() + ":" + str(int(time.time()) // 3600), "x")
        redis_server.command("SADD", key.decode() + ":" + str(int(time.time()) // 3600 + 1), "x")
        with pytest.raises(BackendError, match="WRONGTYPE"):
            await limiter.check_with_info("f2", "2/hour")
        assert backend._in_flight == {}
        task = asyncio.ensure_future(limiter.check_with_info("f3", "2/hour"))
        await asyncio.sleep(0)  # sent, and waiting for its reply
        assert len(backend._in_flight) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert backend._in_flight == {}


async def test_only_a_single_server_limiter_that_asks_for_one_has_a_cache(redis_url: str) -> None:
    assert cache_or_none(RateLimiter(redis_url)) is None  # off unless asked for
    assert cache_or_none(RateLimiter(redis_url, denial_cache_size=0)) is None
    assert cache_or_none(RateLimiter("memory://", **CACHED)) is None
    assert cache_or_none(RateLimiter(redis_url, **CACHED)) is not None


async def test_by_default_every_denial_is_one_script_call(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Off by default: each check is one script call, so Redis decides every denial,
    and a key deleted by hand is a fresh quota at the very next check."""
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(redis_url, key_prefix="df") as limiter:
        assert (await limiter.check_with_info("d1", "1/hour")).allowed  # the script is cached
        before = script_calls(redis_server)
        denied = [await limiter.check_with_info("d1", "1/hour") for _ in range(20)]
        assert script_calls(redis_server) - before == 20
        deleted = redis_server.command(
            "EVAL", "return redis.call('DEL', unpack(redis.call('KEYS', ARGV[1])))", "0", "df:*"
        )
        assert deleted == b":1\r\n"  # by hand, as an operator would: the window's counter
        assert (await limiter.check_with_info("d1", "1/hour")).allowed
        # Nothing subscribed to the reset channel: there is no cache to keep honest.
        subscribers = redis_server.command("PUBSUB", "NUMSUB", "df:denial-cache")
        assert subscribers.endswith(b":0\r\n"), subscribers
    assert [result.allowed for result in denied] == [False] * 20


@pytest.mark.parametrize("size", [-1, 2.5, "10", True])
def test_a_bad_cache_size_is_refused(size: Any) -> None:
    with pytest.raises(RateLimitConfigError, match=r"denial_cache_size must be an int >= 0"):
        RateLimiter("memory://", denial_cache_size=size)


def test_the_cache_works_on_uvloop(redis_server: RedisServer, redis_url: str) -> None:
    """uvloop's transports are not asyncio.Transport subclasses; uvicorn runs on it."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> int:
        await clear_of_boundary(3600, margin_s=3.0)
        async with RateLimiter(redis_url, key_prefix="uv", **CACHED) as limiter:
            await _flood_until_remembered(limiter, "u1")
            before = evalsha_calls(redis_server)
            for _ in range(50):
                assert not (await limiter.check_with_info("u1", "2/hour")).allowed
            return evalsha_calls(redis_server) - before

    assert uvloop.run(scenario()) == 0


async def test_without_pubsub_permissions_there_is_no_cache_and_no_error(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The minimal ACL lacks SUBSCRIBE and PUBLISH: denials go to Redis, resets still work."""
    from test_acl import PREFIX, acl_rules, needed_commands, user_url

    own_redis_server.command("ACL", "SETUSER", "limiter", *acl_rules(needed_commands()))
    own_redis_server.command("ACL", "SETUSER", "limiter", "resetchannels")
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(user_url(own_redis_server.port), key_prefix=PREFIX, **CACHED) as limiter:
        outcomes = [(await limiter.check_with_info("a1", "2/hour")).allowed for _ in range(4)]
        await asyncio.sleep(0.2)  # the refused subscription has been answered
        before = evalsha_calls(own_redis_server)
        outcomes += [(await limiter.check_with_info("a1", "2/hour")).allowed for _ in range(5)]
        assert evalsha_calls(own_redis_server) - before == 5
        assert not cache_of(limiter).subscribed
        assert await limiter.reset("a1", rate="2/hour", scope="global") == 1
    assert outcomes == [True, True] + [False] * 7
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "the denial cache cannot subscribe" in messages
    assert "announcing it failed" in messages


async def test_with_pubsub_permissions_the_cache_works_under_an_acl(
    own_redis_server: RedisServer,
) -> None:
    from test_acl import PREFIX, acl_rules, needed_commands, user_url

    rules = [*acl_rules(needed_commands()), "resetchannels", "+subscribe", "+publish"]
    own_redis_server.command("ACL", "SETUSER", "limiter", *rules, f"&{PREFIX}:denial-cache")
    await clear_of_boundary(3600, margin_s=3.0)
    async with RateLimiter(user_url(own_redis_server.port), key_prefix=PREFIX, **CACHED) as limiter:
        await _flood_until_remembered(limiter, "a2")
        before = evalsha_calls(own_redis_server)
        for _ in range(5):
            assert not (await limiter.check_with_info("a2", "2/hour")).allowed
        assert evalsha_calls(own_redis_server) == before
        assert await limiter.reset("a2", rate="2/hour", scope="global") == 1
        assert (await limiter.check_with_info("a2", "2/hour")).allowed


# Redis's TIME and time.time() read the same clock on one host: with the
# cache's clock set to it, a local deadline and Redis's reset compare directly.
EDGE_SAMPLES = 60


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_local_deadline_never_outlives_redis_decision(
    redis_url: str, algorithm: str
) -> None:
    """In every sample the remembered deadline is at or before Redis's reset.

    Sub-second retries are where the clock-rate margin is thinnest (1 ms):
    Redis reads its clock in whole milliseconds, and the part the script
    truncated away (up to 1 ms) must not be added back to the deadline.
    """
    rng = random.Random(6)
    async with RateLimiter(redis_url, key_prefix="edge", denial_cache_size=100) as limiter:
        cache = cache_of(limiter)
        cache.clock = time.time
        for _ in range(2):
            await limiter.check_with_info("warm", "1/hour", algorithm=algorithm)
        await until(lambda: cache.subscribed)
        late = remembered = 0
        worst_ms = float("-inf")
        for sample_index in range(EDGE_SAMPLES):
            identity = f"edge{sample_index}"
            assert (
                await limiter.check_with_info(identity, "1/second", algorithm=algorithm)
            ).allowed
            cache.invalidate()
            second = await limiter.check_with_info(identity, "1/second", algorithm=algorithm)
            if second.allowed or len(cache) != 1:
                # The window rolled over between the two checks, or the denial
                # came within 2 ms of it (nothing is held then): no sample.
                continue
            remembered += 1
            (entry,) = cache._entries.values()
            reset_ms = entry.reply[4 + 3 * entry.reply[1]]
            over_ms = entry.deadline_s * 1000 - reset_ms
            worst_ms = max(worst_ms, over_ms)
            late += over_ms > 0
            await asyncio.sleep(rng.random() * 0.007)
    assert remembered >= EDGE_SAMPLES // 2
    # Without the 1 ms, fixed_window's deadlines land late in nearly every sample
    # (59 of 60, by up to 0.92 ms).
    assert late == 0, f"{late}/{remembered} deadlines after Redis's reset, worst {worst_ms:+.3f} ms"
