"""Windows longer than a day: `1000/month` and `1/year`, exact on memory:// and on Redis.

Each algorithm admits the (limit, window) pairs its integer arithmetic keeps
exact (moderato/policy.py, docs/internals.md "Long windows") and refuses the
rest when the policy is planned. Inside the range the decisions are exact:
memory:// runs on a hand-driven clock, Redis runs the shipped scripts'
clocked copies (lua_harness.py) at the same instants with the arguments the
limiter's plan gives them, and the limiter itself runs on real Redis time.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Callable

import pytest
import pytest_asyncio
from lua_harness import LuaHarness, clock_origin_ms, open_harness
from redis_servers import RedisServer

from moderato import RateLimitConfigError, RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.algorithms.accrual import accrual_max_limit
from moderato.algorithms.gcra import gcra_max_limit
from moderato.backends.memory import MemoryBackend
from moderato.plans import Plan
from moderato.policy import MAX_LIMIT, policy_for

MONTH_S = 30 * 86_400
YEAR_S = 360 * 86_400
# A year boundary (so a month boundary too), in 2029.
T0_MS = 60 * YEAR_S * 1000

# How long the denied request after a full quota waits, in seconds, at T0 (every
# policy's window starts there): the window's end for the fixed window and the log
# (whose entries leave one window after T0); one unit's refill for the buckets and
# GCRA (one rate law); the sliding window's previous weight first drops below 1000
# permille one second into the next window, and for a limit of 1 must reach 0 permille:
# (W - s) * 1000 < W from s = W - W / 1000 + 1 seconds into it.
MONTH_RETRY_S = {
    "fixed_window": MONTH_S,
    "sliding_window": MONTH_S + 1,
    "sliding_log": MONTH_S,
    "token_bucket": MONTH_S // 1000,
    "leaky_bucket": MONTH_S // 1000,
    "gcra": MONTH_S // 1000,
}
YEAR_RETRY_S = {
    "fixed_window": YEAR_S,
    "sliding_window": YEAR_S + YEAR_S - YEAR_S // 1000 + 1,
    "sliding_log": YEAR_S,
    "token_bucket": YEAR_S,
    "leaky_bucket": YEAR_S,
}
# Every algorithm whose exact range admits the rate (gcra's stops short of a year).
CASES = [
    (rate, limit, algorithm, retry_s)
    for rate, limit, retries_s in [("1000/month", 1000, MONTH_RETRY_S), ("1/year", 1, YEAR_RETRY_S)]
    for algorithm, retry_s in retries_s.items()
]

Decide = Callable[[int], Awaitable[tuple[bool, int]]]
"""One unit-cost check at a Unix ms: (allowed, retry_after in whole seconds)."""


async def quota_story(decide: Decide, limit: int, retry_s: int) -> None:
    """A full quota at T0, the denial after it, and the exact instant room comes back."""
    outcomes = [await decide(T0_MS) for _ in range(limit + 1)]
    assert [allowed for allowed, _ in outcomes] == [True] * limit + [False]
    assert outcomes[-1][1] == retry_s
    assert await decide(T0_MS + retry_s * 1000 - 1000) == (False, 1)
    allowed, _ = await decide(T0_MS + retry_s * 1000)
    assert allowed


# -- planning: the exact ranges -----------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "window_s", "largest"),
    [
        # Every window up to a day keeps the spec's whole range, whatever the algorithm.
        *[(name, window_s, MAX_LIMIT) for name in ALGORITHMS for window_s in (1, 60, 86_400)],
        # Counters and sums never multiply by the window.
        *[
            (name, window_s, MAX_LIMIT)
            for name in ("fixed_window", "sliding_window", "sliding_log")
            for window_s in (2 * 86_400, MONTH_S, YEAR_S, 10 * YEAR_S)
        ],
        # The buckets' accrual: any capacity while window_ms * (window_ms - 1) <= 2^53 ...
        ("token_bucket", 94_906, MAX_LIMIT),
        # ... then capacity_scaled <= 2^53 // window_ms.
        ("token_bucket", 94_907, 94_905),
        ("token_bucket", 2 * 86_400, 52_124),
        ("leaky_bucket", 7 * 86_400, 14_892),
        ("token_bucket", MONTH_S, 3474),
        ("leaky_bucket", YEAR_S, 289),
        ("token_bucket", 10 * YEAR_S, 28),
        # GCRA: microsecond times stay below 2^53 until 2255 for windows up to 41 days.
        ("gcra", 3_599_627, MAX_LIMIT),
        ("gcra", 3_599_628, 0),
        ("gcra", YEAR_S, 0),
    ],
)
def test_largest_exact_limit(algorithm: str, window_s: int, largest: int) -> None:
    assert ALGORITHMS[algorithm].max_limit(window_s) == largest
    rate = f"{largest}/{window_s} seconds"
    if largest:
        Plan(policy_for(rate), ALGORITHMS[algorithm])
    if largest < MAX_LIMIT:
        with pytest.raises(RateLimitConfigError):
            Plan(policy_for(f"{largest + 1}/{window_s} seconds"), ALGORITHMS[algorithm])


def test_accrual_bound_is_where_the_product_stops_being_exact() -> None:
    window_ms = 94_906_266
    assert window_ms * (window_ms - 1) <= 2**53 < (window_ms + 1) * window_ms
    for window_s in (94_907, MONTH_S, YEAR_S, 10 * YEAR_S):
        capacity_scaled = accrual_max_limit(window_s) * 1000
        assert capacity_scaled < window_s * 1000  # so capacity mod window is the capacity
        assert window_s * 1000 * capacity_scaled <= 2**53


def test_gcra_bound_keeps_two_windows_past_2255_below_2_53() -> None:
    now_us = 9_000_000_000_000 * 1000  # memory://'s latest now_ms, in µs
    assert now_us + 2 * 3_599_627 * 10**6 + 1 <= 2**53 < now_us + 2 * 3_599_628 * 10**6
    assert gcra_max_limit(3_599_627) == MAX_LIMIT


async def test_a_rate_outside_the_range_is_refused_before_the_backend() -> None:
    limiter = RateLimiter("memory://", key_prefix="test")
    with pytest.raises(RateLimitConfigError) as refused:
        await limiter.check("k", "1/year", algorithm="gcra")
    assert str(refused.value) == (
        "rate '1/year': a window of 31104000 seconds is too long for gcra, whose exact "
        "range ends at windows of 3599627 seconds (41.6 days); shorten the window or "
        "choose another algorithm"
    )
    with pytest.raises(RateLimitConfigError) as refused:
        await limiter.get_usage("k", "10/day;3475/month", algorithm="token_bucket")
    assert str(refused.value).startswith(
        "rate '10/day;3475/month': the largest limit token_bucket decides exactly over a "
        "window of 2592000 seconds is 3474, got 3475;"
    )
    with pytest.raises(RateLimitConfigError, match="largest limit leaky_bucket"):
        limiter.limit("290/year", algorithm="leaky_bucket")
    default_gcra = RateLimiter("memory://", default_algorithm="gcra")
    with pytest.raises(RateLimitConfigError, match="too long for gcra"):
        default_gcra.limit("5/year")
    assert len(memory_store(limiter)) == 0


# -- memory:// -----------------------------------------------------------------------------


def memory_store(limiter: RateLimiter) -> _accel.MemoryStore:
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    return backend.store


@pytest.mark.parametrize(("rate", "limit", "algorithm", "retry_s"), CASES)
async def test_memory_long_windows_decide_exactly(
    rate: str, limit: int, algorithm: str, retry_s: int
) -> None:
    limiter = RateLimiter("memory://", key_prefix="test")
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    now = [T0_MS]
    backend.clock = lambda: now[0]

    async def decide(at_ms: int) -> tuple[bool, int]:
        now[0] = at_ms
        result = await limiter.check_with_info("client", rate, algorithm=algorithm)
        return result.allowed, result.retry_after or 0

    await quota_story(decide, limit, retry_s)


# -- Redis: the shipped scripts at chosen instants ------------------------------------------


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


@pytest.mark.parametrize(("rate", "limit", "algorithm", "retry_s"), CASES)
async def test_redis_long_windows_decide_exactly_and_as_memory_does(
    lua: LuaHarness, rate: str, limit: int, algorithm: str, retry_s: int
) -> None:
    plan = Plan(policy_for(rate), ALGORITHMS[algorithm])
    keys = _accel.build_keys(
        "app", plan.algorithm.key_tag, "", "s", "client", plan.policy.windows_s
    )
    args = ["1000", "1", *(str(arg) for arg in plan.script_args)]
    store = _accel.MemoryStore(1000)
    # The scripts set absolute expiries: the test clock stays ahead of the real one.
    offset_ms = math.ceil(clock_origin_ms() / (YEAR_S * 1000)) * YEAR_S * 1000 - T0_MS

    async def decide(at_ms: int) -> tuple[bool, int]:
        await lua.set_clock(at_ms + offset_ms)
        reply = await lua.run(algorithm, [key.decode() for key in keys], args)
        assert reply == store.decide(algorithm, keys, args, at_ms + offset_ms)
        allowed, deciding, policies = _accel.decode_decision(reply, 1)
        return allowed, math.ceil(policies[deciding][1] / 1000)

    await quota_story(decide, limit, retry_s)


async def test_redis_scripts_refuse_what_the_planner_refuses(lua: LuaHarness) -> None:
    store = _accel.MemoryStore(1000)
    refusals = [
        (
            "token_bucket",
            ["1000", "1", "3475000", str(MONTH_S), ""],
            "MODERATO_ARG ARGV[3] (capacity_scaled of policy 1) must be at most "
            f"{2**53 // (MONTH_S * 1000)} for a window of 2592000 s (accrual stays below "
            "2^53), got 3475000",
        ),
        (
            "leaky_bucket",
            ["1000", "1", "290000", str(YEAR_S)],
            "MODERATO_ARG ARGV[3] (capacity_scaled of policy 1) must be at most 289583 for "
            "a window of 31104000 s (accrual stays below 2^53), got 290000",
        ),
        (
            "gcra",
            ["1000", "1", "1000", str(YEAR_S)],
            "MODERATO_ARG ARGV[4] (window_s of policy 1) must be at most 3599627 for gcra "
            "(its microsecond times stay below 2^53), got 31104000",
        ),
        (
            "fixed_window",
            ["1000", "1", "1000", "311040001"],
            "MODERATO_ARG ARGV[4] (window_s of policy 1) must be an integer 1..311040000, "
            'got "311040001"',
        ),
    ]
    for algorithm, args, message in refusals:
        with pytest.raises(Exception) as refused:
            await lua.run(algorithm, ["k"], args)
        assert str(refused.value) == message
        with pytest.raises(ValueError) as in_memory:
            store.decide(algorithm, [b"k"], args, lua.now_ms)
        assert str(in_memory.value) == message
    assert await lua.keys() == []
    assert len(store) == 0


# -- the limiter on real Redis time -------------------------------------------------------


@pytest.mark.parametrize(("rate", "limit", "algorithm", "retry_s"), CASES)
async def test_limiter_on_redis_admits_exactly_the_quota(
    redis_url: str, rate: str, limit: int, algorithm: str, retry_s: int
) -> None:
    async with RateLimiter(redis_url, key_prefix="test") as limiter:
        before_s = time.time()
        results = [
            await limiter.check_with_info("client", rate, algorithm=algorithm)
            for _ in range(limit + 1)
        ]
        after_s = time.time()
        assert [result.allowed for result in results] == [True] * limit + [False]
        assert [result.remaining for result in results] == [*range(limit - 1, -1, -1), 0]
        window_s = results[0].window_seconds
        if algorithm == "fixed_window":
            # Windows are aligned to the Unix epoch in whole windows (30 or 360 days).
            assert results[-1].reset_at in {
                (math.floor(at_s / window_s) + 1) * window_s for at_s in (before_s, after_s)
            }
