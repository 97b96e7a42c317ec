"""Several checks decided as one (moderato/together.py, lua/together.lua), exactly.

``RateLimiter._check_together`` admits only if every check admits, then
charges each on its own keys; when one refuses, nothing is written. Checks of
one algorithm and cost share a script call; others become parts of one
composite call. Each case runs on a real redis-server, through moderato's own
client and a user's redis-py client, and on memory:// with a frozen clock.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry
from redis_servers import PATIENT_TIMEOUT_S, RedisServer

from moderato import BackendError, RateLimitConfigError, RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.together import Check

FROZEN_MS = 1_800_000_030_000
DAY = 86_400


@pytest.fixture(params=["memory", "built-in", "redis-py"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        limiter = RateLimiter("memory://", key_prefix="tg")
        limiter.backend.clock = lambda: FROZEN_MS  # type: ignore[attr-defined]
        async with limiter:
            yield limiter
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    server.command("FLUSHALL")
    if request.param == "built-in":
        async with RateLimiter(
            server.url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="tg"
        ) as limiter:
            yield limiter
        return
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(server.url)
    try:
        async with RateLimiter(client, key_prefix="tg") as limiter:
            yield limiter
    finally:
        await client.aclose()


async def current(limiter: RateLimiter, check: Check) -> int:
    usage = await limiter.get_usage(
        check.key, check.rate, scope=check.scope, algorithm=check.algorithm
    )
    used: int = usage["current"]
    return used


async def admitted(limiter: RateLimiter, checks: list[Check], attempts: int) -> list[bool]:
    return [(await limiter._check_together(checks)).allowed for _ in range(attempts)]


# Day windows: no refill, leak or rollover shows within a test.
PAIRS = [(first, second) for first, second in itertools.product(ALGORITHMS, repeat=2)]


@pytest.mark.parametrize(("first", "second"), PAIRS)
async def test_every_pair_of_algorithms_is_all_or_nothing(
    limiter: RateLimiter, first: str, second: str
) -> None:
    # 5/day at cost 2 admits two requests; 3/day at cost 1 would admit three alone.
    wide = Check("user", "3/day", "wide", cost=1, algorithm=first)
    costly = Check("user", "5/day", "costly", cost=2, algorithm=second)
    assert await admitted(limiter, [wide, costly], 4) == [True, True, False, False]
    assert (await current(limiter, wide), await current(limiter, costly)) == (2, 4)
    # The refusals charged nothing: the first limit still has its third request.
    assert await admitted(limiter, [wide], 2) == [True, False]


async def test_a_refused_request_writes_nothing(redis_server: RedisServer) -> None:
    redis_server.command("FLUSHALL")
    async with RateLimiter(redis_server.url, key_prefix="tg") as limiter:
        checks = [Check("user", "2/day", "a", algorithm=name) for name in ALGORITHMS] + [
            Check("user", "1/day", "last", cost=1, algorithm="token_bucket")
        ]
        assert (await limiter._check_together(checks)).allowed
        before = _dump(redis_server)
        refused = await limiter._check_together(checks)
        assert not refused.allowed
        assert _dump(redis_server) == before


def _dump(server: RedisServer) -> dict[bytes, bytes]:
    keys = re.findall(rb"\$\d+\r\n([^\r]+)\r\n", server.command("KEYS", "*"))
    return {key: server.command("DUMP", key.decode()) for key in sorted(keys)}


async def test_the_deciding_check_waits_longest_or_has_fewest_left(
    limiter: RateLimiter,
) -> None:
    minute = Check("user", "2/minute", "minute")
    day = Check("user", "5/day", "day")
    first = await limiter._check_together([day, minute])
    assert (first.allowed, first.deciding) == (True, 1)  # 1 left of 2, 4 of 5
    assert [r.remaining for r in first.results if r is not None] == [4, 1]
    await limiter._check_together([day, minute])
    refused = await limiter._check_together([day, minute])
    assert (refused.allowed, refused.deciding) == (False, 1)
    day_result, minute_result = refused.results
    assert day_result is not None and minute_result is not None
    # The day limit fits (3 left, uncharged); the minute one refused.
    assert (day_result.allowed, day_result.remaining, day_result.retry_after) == (True, 3, 0)
    assert (minute_result.allowed, minute_result.remaining) == (False, 0)
    assert minute_result.retry_after is not None and minute_result.retry_after >= 1
    # A cost no quota can hold is permanent: it decides, whatever waits the others have.
    permanent = await limiter._check_together([minute, Check("user", "3/day", "big", cost=4)])
    assert (permanent.allowed, permanent.deciding) == (False, 1)
    big = permanent.results[1]
    assert big is not None and big.retry_after is None and big.status_code == 422


async def test_a_part_that_fit_reports_its_quota_uncharged(limiter: RateLimiter) -> None:
    # Different algorithms: one part was only peeked when the other refused.
    roomy = Check("user", "10/day", "roomy", algorithm="sliding_log")
    tight = Check("user", "1/day", "tight", algorithm="gcra")
    assert (await limiter._check_together([roomy, tight])).allowed
    refused = await limiter._check_together([roomy, tight])
    roomy_result = refused.results[0]
    assert not refused.allowed and roomy_result is not None
    assert (roomy_result.allowed, roomy_result.remaining) == (True, 9)
    assert await current(limiter, roomy) == 1


async def test_more_policies_than_one_call_takes(limiter: RateLimiter) -> None:
    # 17 policies of one algorithm: two script calls in one composite, still atomic.
    checks = [Check("user", f"{n + 2}/day", f"scope-{n}") for n in range(17)]
    checks.append(Check("user", "1/day", "tightest"))
    assert await admitted(limiter, checks, 2) == [True, False]
    assert [await current(limiter, check) for check in checks] == [1] * 18


async def test_checks_that_would_share_a_key_are_refused(limiter: RateLimiter) -> None:
    with pytest.raises(RateLimitConfigError, match="would count in one counter"):
        await limiter._check_together(
            [Check("user", "10/minute", "x"), Check("user", "4/minute", "x")]
        )


async def test_shadow_checks_are_decided_after_and_never_refuse(limiter: RateLimiter) -> None:
    enforced = Check("user", "3/day", "enforced")
    observed = Check("user", "1/day", "observed", shadow=True)
    decisions = [await limiter._check_together([observed, enforced]) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    second = decisions[1].results[0]
    assert second is not None and second.shadow_denied and second.allowed
    # Refused by the enforced limit: the shadow one was not decided at all.
    assert decisions[3].results[0] is None
    assert (await current(limiter, observed), await current(limiter, enforced)) == (1, 3)


async def test_fail_open_bypasses_every_check_of_a_call(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        fail_open=True,
        metrics_registry=CollectorRegistry(),
        connect_timeout_s=0.2,
    )
    own_redis_server.stop()
    decision = await limiter._check_together(
        [Check("user", "3/day", "a"), Check("user", "5/day", "b", algorithm="gcra")]
    )
    assert decision.allowed
    assert all(r is not None and r.bypassed and r.remaining is None for r in decision.results)
    # A cost no quota could hold is never bypassed.
    with pytest.raises(BackendError):
        await limiter._check_together(
            [Check("user", "3/day", "a"), Check("user", "5/day", "b", cost=6, algorithm="gcra")]
        )
    await limiter.close()


async def test_unreadable_state_in_one_part_is_a_backend_error(
    redis_server: RedisServer,
) -> None:
    redis_server.command("FLUSHALL")
    async with RateLimiter(redis_server.url, key_prefix="tg") as limiter:
        good = Check("user", "3/day", "good")
        broken = Check("user", "3/day", "broken", algorithm="token_bucket")
        assert (await limiter._check_together([good, broken])).allowed
        keys = re.findall(rb"tg:tb:[^\r]+", redis_server.command("KEYS", "tg:tb:*"))
        for key in keys:
            redis_server.command("SET", key.decode(), "not a hash")
        with pytest.raises(BackendError, match=r"MODERATO_STATE key .* cannot be read"):
            await limiter._check_together([good, broken])
        assert await current(limiter, good) == 1


async def test_one_algorithm_and_one_cost_take_one_ordinary_script_call(
    redis_server: RedisServer,
) -> None:
    redis_server.command("FLUSHALL")
    async with RateLimiter(redis_server.url, key_prefix="tg") as limiter:
        same = [Check("user", "3/day", "a"), Check("user", "10/minute;50/day", "b")]
        mixed = [Check("user", "3/day", "a"), Check("user", "5/day", "c", cost=2)]
        for checks in (same, mixed):  # the scripts are loaded (EVAL after NOSCRIPT) first
            await limiter._check_together(checks)
        redis_server.command("CONFIG", "RESETSTAT")
        await limiter._check_together(same)
        assert _script_calls(redis_server) == 1
        await limiter._check_together(mixed)
        assert _script_calls(redis_server) == 2


def _script_calls(server: RedisServer) -> int:
    stats = server.command("INFO", "commandstats")
    return sum(int(calls) for calls in re.findall(rb"cmdstat_eval(?:sha)?:calls=(\d+)", stats))


async def test_checks_in_two_cluster_slots_are_refused_before_any_call() -> None:
    # Nothing listens on the seed: the refusal comes before a connection is tried.
    limiter = RateLimiter("redis+cluster://127.0.0.1:1")
    with pytest.raises(RateLimitConfigError, match="different Redis Cluster slots"):
        await limiter._check_together(
            [Check("user", "10/minute", "app"), Check("user", "4/minute", "GET:/x")]
        )
