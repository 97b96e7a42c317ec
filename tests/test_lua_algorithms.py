"""The Lua decision scripts on a real Redis: the documented numbers, exactly.

Every test drives the shipped scripts (through their clocked test copies, see
lua_harness.py) at chosen instants. The clock starts on a day boundary, so
``t0`` is also the start of every window that divides a day.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Optional, Union

import pytest
import pytest_asyncio
import reference_model as model
from lua_calls import (
    DAY_MS,
    MAX_CAPACITY,
    MINUTE_MS,
    decide,
    hash_of,
    log_of,
    member,
    policy,
    script_args,
    state_key,
)
from lua_harness import CLOCK_KEY, TIME_LINE, LuaHarness, open_harness, shipped_source
from redis_servers import RedisServer

from moderato.algorithms import RESET_SUFFIXES
from moderato.errors import RedisReplyError
from moderato.scripts import SCRIPT_NAMES, load_script, scripts_dir, without_comments

# The counting algorithms; the rate-law ones (GCRA, log, leaky) have their
# section below.
ALGORITHMS = ["fixed_window", "token_bucket", "sliding_window"]
NEWER = ["gcra", "sliding_log", "leaky_bucket"]


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


# -- the headline example: only admitted requests are charged ----------------------


@pytest.mark.parametrize(
    ("algorithm", "reset_after_8", "denied_retry_ms", "denied_reset"),
    [
        # reset = the window's end; the denial waits for it.
        ("fixed_window", 60_000, 45_000, 60_000),
        # allowed: full-refill time (8 units at 1 per 6 s); denied: when 1 more unit exists.
        ("token_bucket", 15_000 + 48_000, 6_000, 15_000 + 6_000),
        # denial: the first second of the next window where floor(8000 * w / 1000) + 3000
        # fits 10000: w <= 875, so second 8 (w = floor(52000 / 60) = 866).
        ("sliding_window", 60_000, 53_000, 68_000),
    ],
)
async def test_only_admitted_requests_are_charged(
    lua: LuaHarness, algorithm: str, reset_after_8: int, denied_retry_ms: int, denied_reset: int
) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy(algorithm, 10, 60)]
    await lua.set_clock(t0 + 15_000)
    for used in range(1, 9):
        reply = await decide(lua, algorithm, ten_per_minute, 1000)
        assert reply[:4] == [1, 0, (10 - used) * 1000, 0]
    assert reply == [1, 0, 2000, 0, t0 + reset_after_8]

    before = await lua.dump()
    # cost 3 with 2 remaining: denied, 2 remaining shown, nothing charged
    reply = await decide(lua, algorithm, ten_per_minute, 3000)
    assert reply == [0, 0, 2000, denied_retry_ms, t0 + denied_reset]
    assert await lua.dump() == before
    # ... so a cost-2 request still fits
    reply = await decide(lua, algorithm, ten_per_minute, 2000)
    assert reply[:4] == [1, 0, 0, 0]
    reply = await decide(lua, algorithm, ten_per_minute, 1000, apply=False)
    assert reply[:3] == [0, 0, 0]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_charges_are_stored_as_scaled_integers(lua: LuaHarness, algorithm: str) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy(algorithm, 10, 60)]
    await decide(lua, algorithm, ten_per_minute, 8000, at_ms=t0 + 15_000)
    await decide(lua, algorithm, ten_per_minute, 3000)  # denied
    snapshot = await lua.snapshot()
    key = ten_per_minute[0].key
    if algorithm == "token_bucket":
        assert snapshot == {
            key + ":bucket:v2": (
                "hash",
                {"tokens": "2000", "base": str(t0 + 15_000), "credited": "0"},
                t0 + 15_000 + 2 * MINUTE_MS + 60_000,
            )
        }
    else:
        window_index = (t0 + 15_000) // MINUTE_MS
        expiry = (window_index + (2 if algorithm == "sliding_window" else 1)) * MINUTE_MS
        assert snapshot == {f"{key}:{window_index}": ("string", "8000", expiry)}


# -- fixed window ----------------------------------------------------------------------------


async def test_fixed_window_resets_at_the_window_end(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("fixed_window", 10, 60)]
    reply = await decide(lua, "fixed_window", ten_per_minute, 10_000, at_ms=t0 + 1)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    reply = await decide(lua, "fixed_window", ten_per_minute, 1000, at_ms=t0 + MINUTE_MS - 1)
    assert reply == [0, 0, 0, 1, t0 + MINUTE_MS]
    # 14:35:00 - 14:36:00, then a fresh window
    reply = await decide(lua, "fixed_window", ten_per_minute, 1000, at_ms=t0 + MINUTE_MS)
    assert reply == [1, 0, 9000, 0, t0 + 2 * MINUTE_MS]


# -- token bucket ----------------------------------------------------------------------------


async def test_token_bucket_refills_continuously(lua: LuaHarness) -> None:
    """100/minute refills ~1.67 per second: 1666 scaled units after one second."""
    t0 = lua.now_ms
    hundred_per_minute = [policy("token_bucket", 100, 60)]
    reply = await decide(lua, "token_bucket", hundred_per_minute, 100_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    reply = await decide(lua, "token_bucket", hundred_per_minute, 0, apply=False, at_ms=t0 + 1000)
    assert reply == [1, 0, 1666, 0, t0 + MINUTE_MS]
    # 1666 credited; after this charge 99,334 are missing: ceil((1666 + 99334) * 0.6) = 60600 ms
    reply = await decide(lua, "token_bucket", hundred_per_minute, 1000)
    assert reply == [1, 0, 666, 0, t0 + 60_600]


async def test_token_bucket_denied_polling_keeps_refill_progress(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("token_bucket", 10, 60)]
    await decide(lua, "token_bucket", ten_per_minute, 10_000, at_ms=t0)
    drained = await lua.dump()
    for waited_ms in range(0, 6000, 1000):
        reply = await decide(lua, "token_bucket", ten_per_minute, 1000, at_ms=t0 + waited_ms)
        assert reply == [0, 0, waited_ms // 6, 6000 - waited_ms, t0 + 6000]
        assert await lua.dump() == drained
    reply = await decide(lua, "token_bucket", ten_per_minute, 1000, at_ms=t0 + 5999)
    assert reply == [0, 0, 999, 1, t0 + 6000]
    reply = await decide(lua, "token_bucket", ten_per_minute, 1000, at_ms=t0 + 6000)
    assert reply[:4] == [1, 0, 0, 0]


async def test_token_bucket_full_bucket_discards_idle_credit(lua: LuaHarness) -> None:
    """3/minute: one unit per 20 s. Half a unit of surplus is not kept once full."""
    t0 = lua.now_ms
    three_per_minute = [policy("token_bucket", 3, 60)]
    await decide(lua, "token_bucket", three_per_minute, 1000, at_ms=t0)
    # 30 s credit 1500 on top of 2000: capped at 3000, the accrual restarts now
    reply = await decide(lua, "token_bucket", three_per_minute, 1000, at_ms=t0 + 30_000)
    assert reply == [1, 0, 2000, 0, t0 + 50_000]
    key = three_per_minute[0].key + ":bucket:v2"
    assert await lua.execute("HGETALL", key) == [
        b"tokens",
        b"2000",
        b"base",
        str(t0 + 30_000).encode(),
        b"credited",
        b"0",
    ]
    reply = await decide(lua, "token_bucket", three_per_minute, 0, apply=False, at_ms=t0 + 49_999)
    assert reply == [1, 0, 2999, 0, t0 + 50_000]


async def test_token_bucket_rebases_at_whole_windows(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    three_per_minute = [policy("token_bucket", 3, 60)]
    key = three_per_minute[0].key + ":bucket:v2"
    await decide(lua, "token_bucket", three_per_minute, 3000, at_ms=t0)
    # 50 s: 2500 credited, all spent
    reply = await decide(lua, "token_bucket", three_per_minute, 2500, at_ms=t0 + 50_000)
    assert reply == [1, 0, 0, 0, t0 + 110_000]
    # 70 s: 3500 due since base, 2500 of it credited: 1000 more. The base moves one window on
    # and credited keeps only the 500 due since then.
    reply = await decide(lua, "token_bucket", three_per_minute, 1000, at_ms=t0 + 70_000)
    assert reply == [1, 0, 0, 0, t0 + 130_000]
    assert await lua.execute("HGETALL", key) == [
        b"tokens",
        b"0",
        b"base",
        str(t0 + 60_000).encode(),
        b"credited",
        b"500",
    ]


async def test_token_bucket_exactly_full_after_a_rebase_restarts_the_accrual(
    lua: LuaHarness,
) -> None:
    t0 = lua.now_ms
    three_per_minute = [policy("token_bucket", 3, 60)]
    key = three_per_minute[0].key + ":bucket:v2"
    await decide(lua, "token_bucket", three_per_minute, 3000, at_ms=t0)
    await decide(lua, "token_bucket", three_per_minute, 2000, at_ms=t0 + 50_000)  # 500 left
    # 100 s: 5000 due, 2500 credited: 500 + 2500 = exactly full, so the base is now
    reply = await decide(lua, "token_bucket", three_per_minute, 1000, at_ms=t0 + 100_000)
    assert reply == [1, 0, 2000, 0, t0 + 120_000]
    assert await lua.execute("HGETALL", key) == [
        b"tokens",
        b"2000",
        b"base",
        str(t0 + 100_000).encode(),
        b"credited",
        b"0",
    ]


async def test_token_bucket_refill_time_is_exact_where_floats_round_up(lua: LuaHarness) -> None:
    """41 units at 10/minute take exactly 246 ms, but 41 / 10000 * 60000 is 246.00000000000003."""
    assert math.ceil(41 / 10_000 * 60_000) == 247  # the estimate the script corrects
    t0 = lua.now_ms
    ten_per_minute = [policy("token_bucket", 10, 60)]
    reply = await decide(lua, "token_bucket", ten_per_minute, 41, at_ms=t0)
    assert reply == [1, 0, 9959, 0, t0 + 246]
    await decide(lua, "token_bucket", ten_per_minute, 9959)
    reply = await decide(lua, "token_bucket", ten_per_minute, 41)
    assert reply == [0, 0, 0, 246, t0 + 246]


async def test_token_bucket_custom_refill_rate(lua: LuaHarness) -> None:
    """A direct caller's rate: 500 scaled units (half a request) per second, window 60 s."""
    t0 = lua.now_ms
    custom = [policy("token_bucket", 10, 60, refill=500.0)]
    key = custom[0].key + ":bucket:v2"
    # empty after this: 10,000 units at 0.5 per ms take 20 s
    reply = await decide(lua, "token_bucket", custom, 10_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + 20_000]
    # TTL: 2 * max(window 60 s, full refill 20 s) + 60 s
    assert await lua.execute("PEXPIRETIME", key) == t0 + 180_000
    reply = await decide(lua, "token_bucket", custom, 1000, at_ms=t0 + 1999)
    assert reply == [0, 0, 999, 1, t0 + 2000]
    # empty again: full 20 s from now
    reply = await decide(lua, "token_bucket", custom, 1000, at_ms=t0 + 2000)
    assert reply == [1, 0, 0, 0, t0 + 22_000]


async def test_token_bucket_slow_custom_rate_keeps_its_key_for_the_whole_refill(
    lua: LuaHarness,
) -> None:
    """The slowest rate (a full refill per day) must not expire back to a full bucket early."""
    t0 = lua.now_ms
    rate = 10_000 / 86_400
    slow = [policy("token_bucket", 10, 60, refill=rate)]
    await decide(lua, "token_bucket", slow, 10_000, at_ms=t0)
    full_refill_ms = math.ceil(10_000 * 1000 / rate)
    assert full_refill_ms in (DAY_MS, DAY_MS + 1)  # one day, give or take float rounding
    expires_at = await lua.execute("PEXPIRETIME", slow[0].key + ":bucket:v2")
    assert expires_at == t0 + 2 * full_refill_ms + 60_000


async def test_token_bucket_custom_rate_uses_the_scripts_float_order(lua: LuaHarness) -> None:
    """(elapsed * rate) / 1000, in that order: find an instant where the other order differs."""
    rate = 7.1  # 7.1 scaled units per second
    elapsed_ms = 70_000
    # 70000 * 7.1 / 1000 = 497.0 exactly, but 7.1 / 1000 * 70000 = 496.99999999999994
    assert (math.floor(elapsed_ms * rate / 1000), math.floor(elapsed_ms * (rate / 1000))) == (
        497,
        496,
    )
    t0 = lua.now_ms
    custom = [policy("token_bucket", 1, 3600, refill=rate)]
    await decide(lua, "token_bucket", custom, 1000, at_ms=t0)
    reply = await decide(lua, "token_bucket", custom, 0, apply=False, at_ms=t0 + elapsed_ms)
    assert reply[2] == 497


async def test_token_bucket_unsafe_custom_accrual_is_refused(lua: LuaHarness) -> None:
    """Accrual beyond 2^53 without the bucket filling up: MODERATO_STATE, nothing written."""
    t0 = lua.now_ms
    fast = policy("token_bucket", 0, 1, capacity_scaled=MAX_CAPACITY, refill=float(MAX_CAPACITY))
    other = policy("token_bucket", 10, 60)
    credited = model.MAX_SAFE_INTEGER - 1000
    elapsed_ms = 1_000_001  # floor(elapsed * rate / 1000) just passes 2^53, short of full
    due = math.floor(elapsed_ms * float(MAX_CAPACITY) / 1000)
    assert due > model.MAX_SAFE_INTEGER and due - credited < MAX_CAPACITY
    await lua.execute(
        "HSET",
        fast.key + ":bucket:v2",
        "tokens",
        "0",
        "base",
        str(t0 - elapsed_ms),
        "credited",
        str(credited),
    )
    await decide(lua, "token_bucket", [other], 1000, at_ms=t0)
    before = await lua.dump()
    with pytest.raises(RedisReplyError, match=r"^MODERATO_STATE custom refill accrual"):
        await decide(lua, "token_bucket", [other, fast], 1000)
    assert await lua.dump() == before


# -- sliding window --------------------------------------------------------------------------


async def test_sliding_window_weight_falls_at_whole_seconds(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_window", 10, 60)]
    await decide(lua, "sliding_window", ten_per_minute, 9000, at_ms=t0 + 30_000)
    # next window, 999 ms in: the previous window still weighs 1000 permille
    reply = await decide(
        lua, "sliding_window", ten_per_minute, 0, apply=False, at_ms=t0 + MINUTE_MS + 999
    )
    assert reply == [1, 0, 1000, 0, t0 + 2 * MINUTE_MS]
    # one whole second in: floor(59000 / 60) = 983 permille; floor(9000 * 983 / 1000) = 8847
    reply = await decide(lua, "sliding_window", ten_per_minute, 1000, at_ms=t0 + MINUTE_MS + 1000)
    assert reply == [1, 0, 153, 0, t0 + 2 * MINUTE_MS]


async def test_sliding_window_retry_later_in_the_same_window(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_window", 10, 60)]
    await decide(lua, "sliding_window", ten_per_minute, 9000, at_ms=t0 + 30_000)
    # cost 2000 needs floor(9000 * w / 1000) <= 8000: w <= 888, first at second 7 (w = 883)
    reply = await decide(lua, "sliding_window", ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 1500)
    assert reply == [0, 0, 1153, 5500, t0 + MINUTE_MS + 7000]
    assert (await decide(lua, "sliding_window", ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 6999))[
        0
    ] == 0
    reply = await decide(lua, "sliding_window", ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 7000)
    assert reply[:2] == [1, 0]


async def test_sliding_window_retry_may_lie_beyond_the_next_boundary(lua: LuaHarness) -> None:
    """2 per 2 s, all used: the next window still weighs this one at 1000 then 500 permille."""
    t0 = lua.now_ms
    two_per_2s = [policy("sliding_window", 2, 2)]
    await decide(lua, "sliding_window", two_per_2s, 2000, at_ms=t0)
    reply = await decide(lua, "sliding_window", two_per_2s, 2000, at_ms=t0 + 100)
    assert reply == [0, 0, 0, 3900, t0 + 4000]
    assert (await decide(lua, "sliding_window", two_per_2s, 2000, at_ms=t0 + 3999))[0] == 0
    assert (await decide(lua, "sliding_window", two_per_2s, 2000, at_ms=t0 + 4000))[0] == 1


# -- permanent denial ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS + NEWER)
async def test_cost_above_capacity_is_a_permanent_denial(lua: LuaHarness, algorithm: str) -> None:
    ten_per_minute = [policy(algorithm, 10, 60)]
    reply = await decide(lua, algorithm, ten_per_minute, 11_000, at_ms=lua.now_ms + 5000)
    assert reply == [0, 0, 10_000, -1, -1]
    assert await lua.keys() == []  # nothing written, not even a counter
    await decide(lua, algorithm, ten_per_minute, 3000)
    before = await lua.dump()
    reply = await decide(lua, algorithm, ten_per_minute, 10_001)
    assert reply == [0, 0, 7000, -1, -1]
    assert await lua.dump() == before
    # smaller requests still use the uncharged quota
    reply = await decide(lua, algorithm, ten_per_minute, 7000)
    assert reply[:4] == [1, 0, 0, 0]


@pytest.mark.parametrize("algorithm", ALGORITHMS + NEWER)
async def test_largest_cost_against_largest_capacity(lua: LuaHarness, algorithm: str) -> None:
    largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    reply = await decide(lua, algorithm, largest, model.MAX_SAFE_INTEGER, at_ms=lua.now_ms)
    assert reply == [0, 0, MAX_CAPACITY, -1, -1]
    reply = await decide(lua, algorithm, largest, MAX_CAPACITY)
    assert reply[:4] == [1, 0, 0, 0]


@pytest.mark.parametrize(
    ("algorithm", "fitting_reset"),
    # the fitting policy's reset: the day's end; for a full bucket, now (nothing to refill)
    [("fixed_window", DAY_MS), ("token_bucket", 500), ("sliding_window", DAY_MS)],
)
async def test_permanent_denial_decides_over_any_wait(
    lua: LuaHarness, algorithm: str, fitting_reset: int
) -> None:
    t0 = lua.now_ms
    per_second_and_day = [policy(algorithm, 10, 1), policy(algorithm, 1000, 86_400)]
    reply = await decide(lua, algorithm, per_second_and_day, 11_000, at_ms=t0 + 500)
    assert reply == [0, 0, 10_000, -1, -1, 1_000_000, 0, t0 + fitting_reset]
    per_second_and_small_day = [policy(algorithm, 100, 1), policy(algorithm, 50, 86_400)]
    reply = await decide(lua, algorithm, per_second_and_small_day, 60_000)
    assert reply[:2] == [0, 1] and reply[5:] == [50_000, -1, -1]
    assert await lua.keys() == []


# -- several policies in one call ------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "resets", "denied"),
    [
        ("fixed_window", (1000, DAY_MS), (500, 1000, DAY_MS)),
        # 10 units at 10 per s refill in 1 s; 10 of 1000 per day in 864 s
        ("token_bucket", (1500, 500 + 864_000), (100, 600, 500 + 864_000)),
        # the 1 s window's next second still weighs this one fully: the one after
        ("sliding_window", (1000, DAY_MS), (1500, 2000, DAY_MS)),
        ("gcra", (1500, 500 + 864_000), (100, 600, 500 + 864_000)),
        ("leaky_bucket", (1500, 500 + 864_000), (100, 600, 500 + 864_000)),
        ("sliding_log", (1500, 500 + DAY_MS), (1000, 1500, 500 + DAY_MS)),
    ],
)
async def test_one_denying_policy_charges_none(
    lua: LuaHarness, algorithm: str, resets: tuple[int, int], denied: tuple[int, int, int]
) -> None:
    """10/second;1000/day: the 11th request in a second is denied and the day not charged."""
    t0 = lua.now_ms
    policies = [policy(algorithm, 10, 1), policy(algorithm, 1000, 86_400)]
    await lua.set_clock(t0 + 500)
    first = await decide(lua, algorithm, policies, 1000)
    assert first[:3] == [1, 0, 9000] and first[5] == 999_000  # fewest remaining decides
    for _ in range(9):
        reply = await decide(lua, algorithm, policies, 1000)
    assert reply == [1, 0, 0, 0, t0 + resets[0], 990_000, 0, t0 + resets[1]]
    before = await lua.dump()
    retry_ms, reset_0, reset_1 = denied
    reply = await decide(lua, algorithm, policies, 1000)
    assert reply == [0, 0, 0, retry_ms, t0 + reset_0, 990_000, 0, t0 + reset_1]
    assert await lua.dump() == before


@pytest.mark.parametrize("algorithm", ALGORITHMS + NEWER)
async def test_the_day_policy_denies_and_the_second_is_not_charged(
    lua: LuaHarness, algorithm: str
) -> None:
    t0 = lua.now_ms
    policies = [policy(algorithm, 5, 1), policy(algorithm, 8, 86_400)]
    for _ in range(5):
        await decide(lua, algorithm, policies, 1000, at_ms=t0 + 500)
    for _ in range(3):
        reply = await decide(lua, algorithm, policies, 1000, at_ms=t0 + 10_500)
    assert reply[:2] == [1, 1] and reply[5] == 0  # the day, with 0 left, feeds the headers
    before = await lua.dump()
    reply = await decide(lua, algorithm, policies, 1000, at_ms=t0 + 20_500)
    assert reply[:5] == [0, 1, 5000, 0, reply[4]]
    # the buckets and GCRA have drained floor(20 s * 8000 / 1 day) = 1 scaled unit
    # meanwhile; a window or a log frees nothing yet
    assert reply[5] == (1 if algorithm in ("token_bucket", "gcra", "leaky_bucket") else 0)
    assert await lua.dump() == before


async def test_ties_go_to_the_lowest_index(lua: LuaHarness) -> None:
    """Windows of 1 s and 2 s both end at t0 + 2 s."""
    t0 = lua.now_ms
    policies = [policy("fixed_window", 1, 1), policy("fixed_window", 1, 2)]
    reply = await decide(lua, "fixed_window", policies, 1000, at_ms=t0 + 1500)
    assert reply == [1, 0, 0, 0, t0 + 2000, 0, 0, t0 + 2000]
    reply = await decide(lua, "fixed_window", policies, 1000)
    assert reply == [0, 0, 0, 500, t0 + 2000, 0, 500, t0 + 2000]
    longest_last = [policy("fixed_window", 1, 1), policy("fixed_window", 1, 60)]
    await decide(lua, "fixed_window", longest_last, 1000, at_ms=t0 + 2500)
    reply = await decide(lua, "fixed_window", longest_last, 1000)
    assert reply[:2] == [0, 1] and reply[6] == 57_500


# -- peeks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS + NEWER)
@pytest.mark.parametrize("cost_scaled", [0, 1000, 6000, 6333, 7000, 20_000])
async def test_peek_answers_like_a_charge_and_writes_nothing(
    lua: LuaHarness, algorithm: str, cost_scaled: int
) -> None:
    t0 = lua.now_ms
    policies = [policy(algorithm, 10, 60), policy(algorithm, 100, 3600)]
    await decide(lua, algorithm, policies, 4000, at_ms=t0 + 7000)
    for key in await lua.keys():
        await lua.execute("PERSIST", key)  # a peek must not even repair an expiry
    before = await lua.dump()
    peeked = await decide(lua, algorithm, policies, cost_scaled, apply=False, at_ms=t0 + 9000)
    assert await lua.dump() == before
    if cost_scaled:
        assert await decide(lua, algorithm, policies, cost_scaled) == peeked
    else:
        # A usage read: what is left, and nothing asked of it. 2 s refill or drain
        # 333 of the 4000 (ceil-wise) in the buckets and GCRA; windows and the log
        # hold all 4000.
        refilled = algorithm in ("token_bucket", "gcra", "leaky_bucket")
        assert peeked[:3] == [1, 0, 6333 if refilled else 6000]


# -- expiry ----------------------------------------------------------------------------------


async def test_every_written_bucket_expires_and_a_lost_expiry_is_repaired(
    lua: LuaHarness,
) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("token_bucket", 10, 60)]
    await decide(lua, "token_bucket", ten_per_minute, 1000, at_ms=t0 + 15_000)
    (key,) = await lua.keys()
    expiry = t0 + 15_000 + 2 * MINUTE_MS + 60_000  # now + 2 * max(W, refill) + 60 s
    assert await lua.execute("PEXPIRETIME", key) == expiry
    await lua.execute("PERSIST", key)
    # a denial writes nothing, so it repairs nothing
    await decide(lua, "token_bucket", ten_per_minute, 10_000)
    assert await lua.execute("PEXPIRETIME", key) == -1
    await decide(lua, "token_bucket", ten_per_minute, 1000)
    assert await lua.execute("PEXPIRETIME", key) == expiry


@pytest.mark.parametrize(
    ("algorithm", "expiry_after_t0"),
    [
        ("fixed_window", MINUTE_MS),  # the window's end
        ("sliding_window", 2 * MINUTE_MS),  # the end of the window that reads it as previous
    ],
)
@pytest.mark.parametrize("policies", [1, 2], ids=["one_policy_path", "general_path"])
async def test_a_window_counter_gets_its_expiry_when_created_and_keeps_it(
    lua: LuaHarness, algorithm: str, expiry_after_t0: int, policies: int
) -> None:
    """The expiry is set by the admission that finds the counter at 0 and kept by later
    ones; a counter that lost it (by hand: nothing moderato runs does that) keeps none."""
    t0 = lua.now_ms
    chosen = [policy(algorithm, 10, 60), policy(algorithm, 100, 3600)][:policies]
    await decide(lua, algorithm, chosen, 1000, at_ms=t0 + 15_000)
    key = f"{chosen[0].key}:{t0 // MINUTE_MS}"
    assert await lua.execute("PEXPIRETIME", key) == t0 + expiry_after_t0
    await decide(lua, algorithm, chosen, 1000, at_ms=t0 + 16_000)
    assert await lua.execute("PEXPIRETIME", key) == t0 + expiry_after_t0
    await lua.execute("PERSIST", key)
    await decide(lua, algorithm, chosen, 1000, at_ms=t0 + 17_000)
    assert await lua.execute("GET", key) == b"3000"
    assert await lua.execute("PEXPIRETIME", key) == -1
    # one found at 0 counts as created
    await lua.execute("SET", key, "0")
    await decide(lua, algorithm, chosen, 1000, at_ms=t0 + 18_000)
    assert await lua.execute("PEXPIRETIME", key) == t0 + expiry_after_t0


# -- the largest numbers ---------------------------------------------------------------------


async def test_token_state_at_the_largest_capacity_is_decimal(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    largest = [policy("token_bucket", 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    key = largest[0].key + ":bucket:v2"
    await decide(lua, "token_bucket", largest, MAX_CAPACITY, at_ms=t0)
    # half a day refills exactly half of 9,007,199,254,000
    # the unit just spent is back 1 ms after the day: credit(W) - credit(W/2) = C/2 exactly
    reply = await decide(lua, "token_bucket", largest, 1, at_ms=t0 + DAY_MS // 2)
    assert reply == [1, 0, 4_503_599_626_999, 0, t0 + DAY_MS + 1]
    assert await lua.execute("HGETALL", key) == [
        b"tokens",
        b"4503599626999",
        b"base",
        str(t0).encode(),
        b"credited",
        b"4503599627000",
    ]
    # one millisecond credits floor(9,007,199,254,000 / 86,400,000) = 104,249 units
    await decide(lua, "token_bucket", largest, 4_503_599_626_999)
    reply = await decide(lua, "token_bucket", largest, 0, apply=False, at_ms=t0 + DAY_MS // 2 + 1)
    assert reply == [1, 0, 104_249, 0, t0 + DAY_MS * 3 // 2]
    for value in (await lua.snapshot())[key][1].values():  # type: ignore[union-attr]
        assert re.fullmatch(r"[0-9]+", value)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
async def test_counters_at_the_largest_capacity_are_decimal(
    lua: LuaHarness, algorithm: str
) -> None:
    largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    t0 = lua.now_ms
    reply = await decide(lua, algorithm, largest, MAX_CAPACITY - 1, at_ms=t0)
    assert reply[:4] == [1, 0, 1, 0]
    reply = await decide(lua, algorithm, largest, 1)
    assert reply[:4] == [1, 0, 0, 0]
    ((_, value, _),) = (await lua.snapshot()).values()
    assert value == "9007199254000"
    if algorithm == "sliding_window":
        # a day later, half way through: floor(9,007,199,254,000 * 500 / 1000) still counts
        reply = await decide(lua, algorithm, largest, 0, apply=False, at_ms=t0 + DAY_MS * 3 // 2)
        assert reply == [1, 0, 4_503_599_627_000, 0, t0 + 2 * DAY_MS]


# -- algorithms never share a key ------------------------------------------------------------


async def test_algorithms_on_one_identity_use_separate_keys(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    await lua.set_clock(t0 + 5000)
    for algorithm in ALGORITHMS:
        # each starts from a fresh quota, whatever the others stored
        reply = await decide(lua, algorithm, [policy(algorithm, 10, 60)], 4000)
        assert reply[:4] == [1, 0, 6000, 0]
    keys = await lua.keys()
    assert len(keys) == 3
    assert sorted(key.split(":")[1] for key in keys) == ["fw", "sw", "tb"]
    keys = [policy(a, 10, 60).key for a in ALGORITHMS]
    deleted = await lua.run("reset", keys, ["60"] * 3 + list(RESET_SUFFIXES))
    assert deleted == 3
    assert await lua.keys() == []


# -- reset -----------------------------------------------------------------------------------


async def test_reset_deletes_every_derived_key_of_the_given_bases(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    for identity in ("alice", "bob"):
        for algorithm in ALGORITHMS:
            for window_s in (1, 60):
                p = [policy(algorithm, 10, window_s, identity)]
                await decide(lua, algorithm, p, 1000, at_ms=t0 + 59_500)
                await decide(lua, algorithm, p, 1000, at_ms=t0 + 60_500)
    alice = [policy(a, 10, w, "alice").key for a in ALGORITHMS for w in (1, 60)]
    # a legacy bucket and a key at the base itself go too
    await lua.execute("SET", alice[2] + ":bucket", "legacy")
    await lua.execute("SET", alice[0], "x")
    bob_before = {k: v for k, v in (await lua.snapshot()).items() if "bob" in k}
    alice_count = len([k for k in await lua.keys() if "alice" in k])
    windows = ["1", "60"] * 3 + list(RESET_SUFFIXES)
    assert await lua.run("reset", alice, windows) == alice_count
    remaining = await lua.snapshot()
    assert remaining == bob_before
    assert await lua.run("reset", alice, windows) == 0


# -- validation ------------------------------------------------------------------------------

GOOD_POLICY = {
    "fixed_window": ["10000", "60"],
    "sliding_window": ["10000", "60"],
    "token_bucket": ["10000", "60", ""],
    "gcra": ["10000", "60"],
    "sliding_log": ["10000", "60"],
    "leaky_bucket": ["10000", "60"],
}

BAD_CALLS = [
    # (what, keys, args with "{p}" standing for one good policy's arguments, expected text)
    ("no keys", [], ["1000", "1"], "expected 1..16 keys"),
    ("17 keys", [f"k{i}" for i in range(17)], ["1000", "1"], "expected 1..16 keys"),
    ("missing policy arguments", ["k"], ["1000", "1"], "arguments for 1 policies"),
    ("extra argument", ["k"], ["1000", "1", "{p}", "5"], "arguments for 1 policies"),
    ("repeated key", ["k", "k"], ["1000", "1", "{p}", "{p}"], "KEYS[2] repeats KEYS[1]"),
    ("cost not a number", ["k"], ["abc", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("negative cost", ["k"], ["-1000", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("fractional cost", ["k"], ["1.5", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("exponent cost", ["k"], ["1e3", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("blank around cost", ["k"], [" 1000", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("empty cost", ["k"], ["", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("hex cost", ["k"], ["0x10", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("cost above 2^53", ["k"], ["9007199254740993", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("zero cost when charging", ["k"], ["0", "1", "{p}"], "ARGV[1] (cost_scaled)"),
    ("apply not 0 or 1", ["k"], ["1000", "2", "{p}"], "ARGV[2] (apply)"),
    ("apply as a word", ["k"], ["1000", "true", "{p}"], "ARGV[2] (apply)"),
    (
        "zero capacity",
        ["k"],
        ["1000", "1", "0", "60", "{rest}"],
        "ARGV[3] (capacity_scaled of policy 1)",
    ),
    (
        "capacity too large",
        ["k"],
        ["1000", "1", "9007199254001", "60", "{rest}"],
        "ARGV[3] (capacity_scaled of policy 1)",
    ),
    (
        "capacity with decimals",
        ["k"],
        ["1000", "1", "10000.0", "60", "{rest}"],
        "ARGV[3] (capacity_scaled of policy 1)",
    ),
    ("zero window", ["k"], ["1000", "1", "10000", "0", "{rest}"], "ARGV[4] (window_s of policy 1)"),
    (
        "window over ten years",
        ["k"],
        ["1000", "1", "10000", "311040001", "{rest}"],
        "ARGV[4] (window_s of policy 1)",
    ),
    (
        "window with a unit",
        ["k"],
        ["1000", "1", "10000", "60s", "{rest}"],
        "ARGV[4] (window_s of policy 1)",
    ),
    (
        "second policy bad",
        ["k", "j"],
        ["1000", "1", "{p}", "10000", "-60", "{rest}"],
        "(window_s of policy 2)",
    ),
]

BAD_REFILL_RATES = [
    "abc",
    "inf",
    "nan",
    "-1",
    "1e999",
    "0.1",
    "9007199254001",
    "0x10",
    " 5",
    "5 ",
    "1e",
    ".5",
]


def expand(algorithm: str, args: list[str]) -> list[str]:
    expanded: list[str] = []
    for arg in args:
        if arg == "{p}":
            expanded += GOOD_POLICY[algorithm]
        elif arg == "{rest}":
            expanded += GOOD_POLICY[algorithm][2:]
        else:
            expanded.append(arg)
    return expanded


async def populated(lua: LuaHarness, algorithm: str) -> dict[str, tuple[bytes, int]]:
    """Some state under keys "k" and "j", so a write would show in the dump."""
    await lua.set_clock(lua.now_ms + 1000)
    good = ["1000", "1", *GOOD_POLICY[algorithm], *GOOD_POLICY[algorithm]]
    await lua.run(algorithm, ["k", "j"], good)
    for key in await lua.keys():
        await lua.execute("PERSIST", key)  # so that a repair would show too
    return await lua.dump()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("what", "keys", "args", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS]
)
async def test_bad_arguments_are_refused_before_any_key_is_touched(
    lua: LuaHarness, algorithm: str, what: str, keys: list[str], args: list[str], message: str
) -> None:
    before = await populated(lua, algorithm)
    with pytest.raises(RedisReplyError) as refused:
        await lua.run(algorithm, keys, expand(algorithm, args))
    assert refused.value.message.startswith("MODERATO_ARG ")
    assert message in refused.value.message
    assert await lua.dump() == before


# Valid spellings the scripts' cheap argument check leaves to the exact one (more digits
# than it reads with tonumber alone, leading zeros, a custom refill rate): the same
# decision and the same stored state as the plain spelling.
UNUSUAL_SPELLINGS = [
    ("leading zeros", ["0000000000001000", "1", "00000000000000010000", "0000060"]),
    ("cost of 2^53 (a permanent denial)", ["9007199254740992", "1", "10000", "60"]),
    ("16-digit peek cost", ["0000000000000000", "0", "10000", "60"]),
]
EVERY_ALGORITHM = ["fixed_window", "token_bucket", "sliding_window", "gcra", "sliding_log",
                   "leaky_bucket"]  # fmt: skip


def plain(args: list[str]) -> list[str]:
    return [str(int(arg)) for arg in args]


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM)
@pytest.mark.parametrize(
    ("what", "args"), UNUSUAL_SPELLINGS, ids=[spelling[0] for spelling in UNUSUAL_SPELLINGS]
)
async def test_unusual_valid_spellings_decide_as_the_plain_ones(
    lua: LuaHarness, algorithm: str, what: str, args: list[str]
) -> None:
    t0 = lua.now_ms
    results = []
    for spelled in (plain(args), args):
        await lua.flush()
        await lua.set_clock(t0 + 1000)
        extra = [""] if algorithm == "token_bucket" else []
        # Some state first, so the decision reads stored values too.
        await lua.run(algorithm, ["k"], ["3000", "1", "10000", "60", *extra])
        await lua.set_clock(t0 + 2500)
        reply = await lua.run(algorithm, ["k"], [*spelled, *extra])
        results.append((reply, await lua.dump()))
    assert results[0] == results[1]


async def test_a_custom_refill_rate_takes_the_exact_check_and_decides(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    reply = await lua.run("token_bucket", ["k"], ["1000", "1", "10000", "60", "2.5E+2"])
    # 250 scaled units per second: the 1,000 this charge takes are back in 4 s.
    assert reply == [1, 0, 9000, 0, t0 + 4000]


@pytest.mark.parametrize("rate", BAD_REFILL_RATES)
async def test_bad_refill_rates_are_refused(lua: LuaHarness, rate: str) -> None:
    before = await populated(lua, "token_bucket")
    with pytest.raises(RedisReplyError) as refused:
        await lua.run("token_bucket", ["k"], ["1000", "1", "10000", "60", rate])
    assert refused.value.message.startswith(
        "MODERATO_ARG ARGV[5] (refill_scaled_per_s of policy 1)"
    )
    assert await lua.dump() == before


@pytest.mark.parametrize(
    "rate", ["0.11574074074074074", "1", "1.5", "1e3", "2.5E+2", "9007199254000"]
)
async def test_good_refill_rates_are_accepted(lua: LuaHarness, rate: str) -> None:
    await lua.run("token_bucket", ["k"], ["1000", "1", "10000", "60", rate])


async def test_a_long_bad_argument_is_shown_shortened(lua: LuaHarness) -> None:
    with pytest.raises(RedisReplyError) as refused:
        await lua.run("fixed_window", ["k"], ["7" * 30 + "x" * 70, "1", "10000", "60"])
    assert refused.value.message.endswith('got "' + "7" * 30 + "x" * 10 + '..."')


@pytest.mark.parametrize(
    ("keys", "args", "message"),
    [
        ([], [], "expected 1..256 keys"),
        ([f"k{i}" for i in range(257)], ["60"] * 258, "expected 1..256 keys"),
        (["k"], [], "expected one window_s argument per key (1) and then at least one"),
        (["k"], ["60"], "at least one state suffix, got 1 arguments"),
        (["k"], ["60", "bucket"], 'ARGV[2] (a state suffix) must be ":" and up to 31'),
        (["k"], ["60", ":" + "x" * 32], "ARGV[2] (a state suffix)"),
        (["k"], ["60", ":a b"], "ARGV[2] (a state suffix)"),
        (["k"], ["0", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k"], ["311040001", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k"], ["0311040001", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k", "j"], ["60", "1m", ":log"], "ARGV[2] (window_s of KEYS[2])"),
    ],
)
async def test_reset_refuses_bad_arguments(
    lua: LuaHarness, keys: list[str], args: list[str], message: str
) -> None:
    before = await populated(lua, "fixed_window")
    with pytest.raises(RedisReplyError) as refused:
        await lua.run("reset", keys, args)
    assert refused.value.message.startswith("MODERATO_ARG ") and message in refused.value.message
    assert await lua.dump() == before


# -- unusable stored state -------------------------------------------------------------------

CORRUPT_STATES = [
    ("fixed_window", "string", "abc"),
    ("fixed_window", "string", "-5"),
    ("fixed_window", "string", "1.5"),
    ("fixed_window", "string", "9007199254740993"),
    ("fixed_window", "hash", {"a": "1"}),
    ("sliding_window", "string", "1e5"),
    ("sliding_window", "hash", {"a": "1"}),
    ("sliding_window", "string", "-3"),
    ("sliding_window", "string", "9007199254740993"),
    ("token_bucket", "string", "1000"),
    ("token_bucket", "hash", {"other": "1"}),
    ("token_bucket", "hash", {"tokens": "1000", "base": "{now}"}),
    ("token_bucket", "hash", {"tokens": "1e5", "base": "{now}", "credited": "0"}),
    ("token_bucket", "hash", {"tokens": "-1", "base": "{now}", "credited": "0"}),
    ("token_bucket", "hash", {"tokens": "10", "base": "4503599627370497", "credited": "0"}),
    ("token_bucket", "hash", {"tokens": "10", "base": "{now}", "credited": "9007199254740993"}),
]


@pytest.mark.parametrize("alone", [False, True], ids=["beside_a_healthy_policy", "alone"])
@pytest.mark.parametrize(("algorithm", "kind", "value"), CORRUPT_STATES)
async def test_unusable_state_is_refused_and_nothing_is_written(
    lua: LuaHarness, algorithm: str, kind: str, value: object, alone: bool
) -> None:
    """Alone, the broken policy takes the scripts' one-policy path first: same refusal."""
    t0 = lua.now_ms
    healthy, broken = policy(algorithm, 10, 60, "healthy"), policy(algorithm, 10, 60, "broken")
    await decide(lua, algorithm, [healthy], 1000, at_ms=t0 + 1000)
    if algorithm == "token_bucket":
        key = broken.key + ":bucket:v2"
    elif algorithm == "fixed_window":
        key = f"{broken.key}:{(t0 + 1000) // MINUTE_MS}"
    else:
        key = f"{broken.key}:{(t0 + 1000) // MINUTE_MS - 1}"  # the previous counter
    if kind == "string":
        await lua.execute("SET", key, str(value))
    else:
        assert isinstance(value, dict)
        fields = [x for k, v in value.items() for x in (k, v.replace("{now}", str(t0)))]
        await lua.execute("HSET", key, *fields)
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, algorithm, [broken] if alone else [healthy, broken], 1000)
    assert refused.value.message.startswith("MODERATO_STATE ")
    assert key in refused.value.message
    assert await lua.dump() == before


@pytest.mark.parametrize("previous", [None, "2000"], ids=["no_previous", "previous"])
@pytest.mark.parametrize("stored", ["abc", "-5", "1.5", "9007199254740993", {"a": "1"}])
async def test_sliding_window_alone_refuses_an_unusable_current_counter(
    lua: LuaHarness, stored: object, previous: Optional[str]
) -> None:
    """The one-policy path reads both counters with one MGET, which answers nil for a key
    of another type: the refusal is the general path's all the same, nothing written."""
    t0 = lua.now_ms
    broken = policy("sliding_window", 10, 60, "broken")
    key = f"{broken.key}:{t0 // MINUTE_MS}"
    if previous is not None:
        await lua.execute("SET", f"{broken.key}:{t0 // MINUTE_MS - 1}", previous)
    if isinstance(stored, dict):
        await lua.execute("HSET", key, *(x for pair in stored.items() for x in pair))
    else:
        await lua.execute("SET", key, str(stored))
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, "sliding_window", [broken], 1000)
    assert refused.value.message.startswith(f'MODERATO_STATE key "{key}" ')
    assert await lua.dump() == before


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
@pytest.mark.parametrize("stored", ["-5", "-1000", "9007199254740993", "9223372036854775807"])
async def test_window_single_policy_refuses_what_incrby_would_take_or_not(
    lua: LuaHarness, algorithm: str, stored: str
) -> None:
    """The one-policy path charges the current counter with INCRBY first: a counter
    INCRBY takes but the script must not (negative, beyond 2^53) or cannot take (an
    overflow) is refused exactly as the general path refuses it, and left as it was."""
    t0 = lua.now_ms
    broken = policy(algorithm, 10, 60, "broken")
    key = f"{broken.key}:{t0 // MINUTE_MS}"
    await lua.execute("SET", key, stored)
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, algorithm, [broken], 1000)
    assert refused.value.message == (
        f'MODERATO_STATE key "{key}" holds "{stored}", not a decimal integer 0..9007199254740992'
    )
    assert await lua.dump() == before


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("0", [1, 0, 9000, 0, MINUTE_MS]),
        ("007", [1, 0, 8993, 0, MINUTE_MS]),  # INCRBY refuses it; the general path takes it
        ("9000", [1, 0, 0, 0, MINUTE_MS]),
        ("9001", [0, 0, 999, MINUTE_MS - 1000, MINUTE_MS]),
        ("25000", [0, 0, 0, MINUTE_MS - 1000, MINUTE_MS]),  # above a since-lowered capacity
        ("9007199254740992", [0, 0, 0, MINUTE_MS - 1000, MINUTE_MS]),  # 2^53: still valid
    ],
)
async def test_fixed_window_single_policy_counter_edges(
    lua: LuaHarness, stored: str, expected: list[int]
) -> None:
    """Admissions and denials of the one-policy path around capacity and 2^53; a denial
    leaves the counter and its (missing) expiry as they were."""
    t0 = lua.now_ms - lua.now_ms % MINUTE_MS
    ten_per_minute = policy("fixed_window", 10, 60)
    key = f"{ten_per_minute.key}:{t0 // MINUTE_MS}"
    await lua.execute("SET", key, stored)
    before = await lua.dump()
    reply = await decide(lua, "fixed_window", [ten_per_minute], 1000, at_ms=t0 + 1000)
    expected = [*expected[:4], t0 + expected[4]]
    assert reply == expected
    if reply[0]:
        assert await lua.execute("GET", key) == str(int(stored) + 1000).encode()
        # the expiry is set only on a counter found at 0
        expiry = t0 + MINUTE_MS if stored == "0" else -1
        assert await lua.execute("PEXPIRETIME", key) == expiry
    else:
        assert await lua.dump() == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"other": "1"}, "holds a hash without tokens, base and credited"),
        (
            {"tokens": "x1", "base": "1", "credited": "0"},
            'field tokens of key "{key}" is "x1", not a decimal integer 0..9007199254740992',
        ),
        (
            {"tokens": "1", "credited": "0"},
            'field base of key "{key}" is missing, not a decimal integer 0..4503599627370496',
        ),
    ],
)
async def test_a_bucket_hash_refusal_names_the_field(
    lua: LuaHarness, fields: dict[str, str], message: str
) -> None:
    broken = policy("token_bucket", 10, 60, "broken")
    key = broken.key + ":bucket:v2"
    await lua.execute("HSET", key, *(x for pair in fields.items() for x in pair))
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, "token_bucket", [broken], 1000)
    if message.startswith("holds"):
        message = f'key "{key}" {message}'
    assert refused.value.message == "MODERATO_STATE " + message.replace("{key}", key)


# -- the shipped files -----------------------------------------------------------------------


def test_scripts_are_found_in_the_source_tree() -> None:
    assert scripts_dir() == Path(__file__).resolve().parent.parent / "lua"
    # spliced into scripts, never run on their own (together.lua: into the composite
    # scripts.composite_script() assembles)
    included = ("prelude", "accrual", "bucket_state", "one_policy", "window_counter", "together")
    shipped = sorted(p.stem for p in scripts_dir().glob("*.lua") if p.stem not in included)
    assert sorted(SCRIPT_NAMES) == shipped


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_reads_the_clock_once(name: str) -> None:
    source = shipped_source(name)
    assert source.count(TIME_LINE) == 1
    assert source.count(b"'TIME'") == 1
    assert CLOCK_KEY.encode() not in source


def test_decision_scripts_include_the_prelude_once() -> None:
    # As the loader sends it: without its comments (and so without the blank lines).
    prelude = without_comments((scripts_dir() / "prelude.lua").read_bytes()).rstrip(b"\n")
    decision_scripts = [name for name in SCRIPT_NAMES if name != "reset"]
    assert len(decision_scripts) == 6
    for name in decision_scripts:
        raw = (scripts_dir() / f"{name}.lua").read_bytes()
        assert raw.count(b"--#include prelude.lua") == 1, name
        source = load_script(name).source
        assert source.count(prelude) == 1 and b"--#include" not in source, name


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_shipped_script_runs_on_redis_time(lua: LuaHarness, algorithm: str) -> None:
    """The unmodified script, with Redis's own TIME."""
    seconds, micros = await lua.execute("TIME")
    real_before_ms = int(seconds) * 1000 + int(micros) // 1000
    ten_per_minute = [policy(algorithm, 10, 60, "real-clock")]
    reply = await lua.client.evalsha(
        load_script(algorithm),
        [ten_per_minute[0].key],
        script_args(algorithm, 1000, True, ten_per_minute),
    )
    seconds, micros = await lua.execute("TIME")
    real_after_ms = int(seconds) * 1000 + int(micros) // 1000
    assert reply[:4] == [1, 0, 9000, 0]
    if algorithm == "token_bucket":
        assert real_before_ms + 6000 <= reply[4] <= real_after_ms + 6000
    else:
        window_ends = {(t // MINUTE_MS + 1) * MINUTE_MS for t in (real_before_ms, real_after_ms)}
        assert reply[4] in window_ends
    reset_args = ["60", *RESET_SUFFIXES]
    deleted = await lua.client.evalsha(load_script("reset"), [ten_per_minute[0].key], reset_args)
    assert deleted == 1


# == GCRA, sliding log, leaky bucket ==============================================================
#
# The same shipped scripts and clock; numbers worked out by hand in the comments.


# -- GCRA ------------------------------------------------------------------------------------


async def test_gcra_burst_then_steady_without_drift(lua: LuaHarness) -> None:
    """7/minute: one unit per 60/7 s = 8571.428... ms, a step no whole µs count holds."""
    start = lua.now_ms + 15_000
    seven_per_minute = [policy("gcra", 7, 60)]
    key = state_key("gcra", seven_per_minute[0])
    await lua.set_clock(start)
    # a fresh key admits the whole capacity at once; reset = ceil(k * 60000 / 7) ms on
    resets = [8572, 17_143, 25_715, 34_286, 42_858, 51_429, 60_000]
    for k, reset in enumerate(resets, 1):
        reply = await decide(lua, "gcra", seven_per_minute, 1000)
        assert reply == [1, 0, (7 - k) * 1000, 0, start + reset]
        if k == 1:
            # TAT = start + 8571428 µs + 4/7 µs: frac counts 1/7000 µs
            assert await hash_of(lua, key) == {"tat": str(start * 1000 + 8_571_428), "frac": "4000"}
    assert await hash_of(lua, key) == {"tat": str(start * 1000 + 60_000_000), "frac": "0"}
    assert await lua.execute("PEXPIRETIME", key) == start + 60_000 + 1000
    before = await lua.dump()
    reply = await decide(lua, "gcra", seven_per_minute, 1000)
    assert reply == [0, 0, 0, 8572, start + 8572]
    assert await lua.dump() == before
    # Steady: the k-th next unit fits from start + k * 60/7 s, rounded up to the ms; 1 ms
    # earlier it is refused with retry 1. Over two minutes nothing drifts: fractions are kept.
    for k in range(1, 15):
        fits_at = start + -(-k * 60_000 // 7)
        reply = await decide(lua, "gcra", seven_per_minute, 1000, at_ms=fits_at - 1)
        assert reply[:4] == [0, 0, 999, 1], (k, reply)
        reply = await decide(lua, "gcra", seven_per_minute, 1000, at_ms=fits_at)
        assert reply[:4] == [1, 0, 0, 0], (k, reply)
    # 14 steps of exactly 60/7 s after the burst: the TAT is exactly two minutes further on
    assert await hash_of(lua, key) == {"tat": str(start * 1000 + 180_000_000), "frac": "0"}


async def test_gcra_keeps_fractions_of_a_microsecond(lua: LuaHarness) -> None:
    """3,000,000/second: a unit moves the TAT by 1/3 µs; per-request µs rounding would
    admit a million or three million times too many or too few."""
    start = lua.now_ms
    fast = [policy("gcra", 3_000_000, 1)]
    key = state_key("gcra", fast[0])
    capacity = 3_000_000_000
    await lua.set_clock(start)
    for k, expected in enumerate(
        [
            {"tat": str(start * 1000), "frac": "1000000000"},  # 1/3 µs
            {"tat": str(start * 1000), "frac": "2000000000"},  # 2/3 µs
            {"tat": str(start * 1000 + 1), "frac": "0"},  # 1 µs
        ],
        1,
    ):
        reply = await decide(lua, "gcra", fast, 1000)
        assert reply == [1, 0, capacity - k * 1000, 0, start + 1]
        assert await hash_of(lua, key) == expected
    # the rest of the burst in one request: the TAT is a whole window ahead
    reply = await decide(lua, "gcra", fast, capacity - 3000)
    assert reply == [1, 0, 0, 0, start + 1000]
    # one scaled unit more: it fits once 1/3000 µs has passed, i.e. at the next ms
    reply = await decide(lua, "gcra", fast, 1)
    assert reply == [0, 0, 0, 1, start + 1]
    # 1 ms drains 3,000,000 scaled units exactly
    reply = await decide(lua, "gcra", fast, 0, apply=False, at_ms=start + 1)
    assert reply == [1, 0, 3_000_000, 0, start + 1000]


async def test_gcra_a_passed_tat_is_an_empty_bucket(lua: LuaHarness) -> None:
    start = lua.now_ms
    ten_per_minute = [policy("gcra", 10, 60)]
    await decide(lua, "gcra", ten_per_minute, 10_000, at_ms=start)
    # long after the TAT: full capacity again, the TAT restarts from now
    reply = await decide(lua, "gcra", ten_per_minute, 1000, at_ms=start + 90_000)
    assert reply == [1, 0, 9000, 0, start + 96_000]


async def test_gcra_tat_beyond_a_window_reads_as_full(lua: LuaHarness) -> None:
    """The clock stepped back: a TAT two windows ahead is capped at one (a full bucket)."""
    start = lua.now_ms
    ten_per_minute = [policy("gcra", 10, 60)]
    key = state_key("gcra", ten_per_minute[0])
    await lua.execute("HSET", key, "tat", str((start + 2 * MINUTE_MS) * 1000), "frac", "5")
    reply = await decide(lua, "gcra", ten_per_minute, 1000, at_ms=start)
    assert reply == [0, 0, 0, 6000, start + 6000]
    reply = await decide(lua, "gcra", ten_per_minute, 0, apply=False)
    assert reply == [1, 0, 0, 0, start + MINUTE_MS]


async def test_gcra_frac_of_capacity_or_more_counts_as_one_microsecond(lua: LuaHarness) -> None:
    start = lua.now_ms
    ten_per_minute = [policy("gcra", 10, 60)]
    key = state_key("gcra", ten_per_minute[0])
    # TAT = start + 5999 ms + 999 µs, and a frac >= capacity: one more µs, exactly 6 s
    await lua.execute("HSET", key, "tat", str(start * 1000 + 5_999_999), "frac", "10000")
    reply = await decide(lua, "gcra", ten_per_minute, 0, apply=False, at_ms=start)
    assert reply == [1, 0, 9000, 0, start + 6000]
    reply = await decide(lua, "gcra", ten_per_minute, 1000)
    assert reply == [1, 0, 8000, 0, start + 12_000]
    assert await hash_of(lua, key) == {"tat": str(start * 1000 + 12_000_000), "frac": "0"}


# -- sliding log -----------------------------------------------------------------------------


async def test_sliding_log_rolls_exactly(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_log", 10, 60)]
    key = state_key("sliding_log", ten_per_minute[0])
    for _ in range(4):
        await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0)
    await decide(lua, "sliding_log", ten_per_minute, 3000, at_ms=t0 + 20_000)
    for _ in range(3):
        reply = await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0 + 40_000)
    assert reply == [1, 0, 0, 0, t0 + 100_000]
    # four admissions in one ms are four members; totals run on
    assert await log_of(lua, key) == [
        (member(1000, 1000), t0),
        (member(2000, 1000), t0),
        (member(3000, 1000), t0),
        (member(4000, 1000), t0),
        (member(7000, 3000), t0 + 20_000),
        (member(8000, 1000), t0 + 40_000),
        (member(9000, 1000), t0 + 40_000),
        (member(10_000, 1000), t0 + 40_000),
    ]
    before = await lua.dump()
    # cost 5: the four units leave at +60 s (4 freed), the 3 at +80 s (7 freed)
    reply = await decide(lua, "sliding_log", ten_per_minute, 5000, at_ms=t0 + 50_000)
    assert reply == [0, 0, 0, 30_000, t0 + 80_000]
    reply = await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0 + 59_999)
    assert reply == [0, 0, 0, 1, t0 + 60_000]
    assert await lua.dump() == before  # denials neither charge nor trim
    # at +60 s the entries of t0 are out of (now - 60 s, now]
    reply = await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0 + 60_000)
    assert reply == [1, 0, 3000, 0, t0 + 120_000]
    assert await log_of(lua, key) == [
        (member(7000, 3000), t0 + 20_000),
        (member(8000, 1000), t0 + 40_000),
        (member(9000, 1000), t0 + 40_000),
        (member(10_000, 1000), t0 + 40_000),
        (member(11_000, 1000), t0 + 60_000),
    ]
    # the second of the stamp + 2 s + the window: 1 to 2 s after the newest entry leaves
    assert await lua.execute("PEXPIRETIME", key) == t0 + 122_000
    # 7 in the window, cost 5 needs 2 freed: the 3 of +20 s
    reply = await decide(lua, "sliding_log", ten_per_minute, 5000, at_ms=t0 + 79_999)
    assert reply == [0, 0, 3000, 1, t0 + 80_000]
    reply = await decide(lua, "sliding_log", ten_per_minute, 5000, at_ms=t0 + 80_000)
    assert reply == [1, 0, 1000, 0, t0 + 140_000]


async def test_sliding_log_has_no_boundary_burst(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_log", 10, 60)]
    reply = await decide(lua, "sliding_log", ten_per_minute, 10_000, at_ms=t0 + 59_999)
    assert reply[:4] == [1, 0, 0, 0]
    # a fixed window would start afresh at +60 s; the log waits a whole window
    reply = await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0 + 60_000)
    assert reply == [0, 0, 0, 59_999, t0 + 119_999]


async def test_sliding_log_peek_reads_as_if_trimmed(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_log", 10, 60)]
    key = state_key("sliding_log", ten_per_minute[0])
    await decide(lua, "sliding_log", ten_per_minute, 6000, at_ms=t0)
    await decide(lua, "sliding_log", ten_per_minute, 3000, at_ms=t0 + 30_000)
    await lua.execute("PERSIST", key)
    before = await lua.dump()
    reply = await decide(lua, "sliding_log", ten_per_minute, 0, apply=False, at_ms=t0 + 61_000)
    assert reply == [1, 0, 7000, 0, t0 + 90_000]
    reply = await decide(lua, "sliding_log", ten_per_minute, 7000, apply=False)
    assert reply == [1, 0, 0, 0, t0 + 121_000]
    assert await lua.dump() == before  # the stale entry is still there, unexpired
    # the admission trims it and repairs the expiry
    await decide(lua, "sliding_log", ten_per_minute, 7000)
    assert await log_of(lua, key) == [
        (member(9000, 3000), t0 + 30_000),
        (member(16_000, 7000), t0 + 61_000),
    ]
    assert await lua.execute("PEXPIRETIME", key) == t0 + 123_000


@pytest.mark.parametrize("policies", [1, 2], ids=["one_policy_path", "general_path"])
async def test_sliding_log_trims_and_sets_its_expiry_once_per_second(
    lua: LuaHarness, policies: int
) -> None:
    """Admissions stamped in the second of the newest entry neither trim nor touch the
    expiry (it is the same for every stamp of that second); the first of a later second
    does both, and so repairs a lost expiry."""
    t0 = lua.now_ms
    chosen = [policy("sliding_log", 10, 60), policy("sliding_log", 100, 3600)][:policies]
    key = state_key("sliding_log", chosen[0])
    await decide(lua, "sliding_log", chosen, 1000, at_ms=t0 + 400)
    assert await lua.execute("PEXPIRETIME", key) == t0 + 62_000
    await decide(lua, "sliding_log", chosen, 1000, at_ms=t0 + 60_100)
    await lua.execute("PERSIST", key)
    # +60.4 s: the entry of +0.4 s has left the window, but this second was renewed at +60.1
    await decide(lua, "sliding_log", chosen, 1000, at_ms=t0 + 60_900)
    assert await log_of(lua, key) == [
        (member(1000, 1000), t0 + 400),
        (member(2000, 1000), t0 + 60_100),
        (member(3000, 1000), t0 + 60_900),
    ]
    assert await lua.execute("PEXPIRETIME", key) == -1
    await decide(lua, "sliding_log", chosen, 1000, at_ms=t0 + 61_000)
    assert await log_of(lua, key) == [
        (member(2000, 1000), t0 + 60_100),
        (member(3000, 1000), t0 + 60_900),
        (member(4000, 1000), t0 + 61_000),
    ]
    assert await lua.execute("PEXPIRETIME", key) == t0 + 123_000


async def test_sliding_log_totals_restart_when_the_window_is_empty(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    two_per_second = [policy("sliding_log", 2, 1)]
    key = state_key("sliding_log", two_per_second[0])
    await decide(lua, "sliding_log", two_per_second, 2000, at_ms=t0)
    await decide(lua, "sliding_log", two_per_second, 500, at_ms=t0 + 1000)
    assert await log_of(lua, key) == [(member(500, 500), t0 + 1000)]


async def test_sliding_log_renumbers_totals_before_they_pass_2_53(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_log", 10, 60)]
    key = state_key("sliding_log", ten_per_minute[0])
    top = model.MAX_SAFE_INTEGER
    await lua.execute(
        "ZADD",
        key,
        t0 - MINUTE_MS,
        member(top - 5000, 2000),  # out of the window: trimmed
        t0 - 30_000,
        member(top - 4000, 1000),
        t0 - 10_000,
        member(top - 2000, 2000),
    )
    before = await lua.dump()
    # 3000 in the window; a cost of 3000 would take the total past 2^53
    reply = await decide(lua, "sliding_log", ten_per_minute, 3000, apply=False, at_ms=t0)
    assert reply == [1, 0, 4000, 0, t0 + MINUTE_MS]
    assert await lua.dump() == before
    reply = await decide(lua, "sliding_log", ten_per_minute, 3000)
    assert reply == [1, 0, 4000, 0, t0 + MINUTE_MS]
    assert await log_of(lua, key) == [
        (member(1000, 1000), t0 - 30_000),
        (member(3000, 2000), t0 - 10_000),
        (member(6000, 3000), t0),
    ]
    reply = await decide(lua, "sliding_log", ten_per_minute, 5000)
    assert reply == [0, 0, 4000, 30_000, t0 + 30_000]


async def test_sliding_log_entries_ahead_of_the_clock(lua: LuaHarness) -> None:
    """The clock stepped back: a newer entry keeps counting; new entries stamp after it."""
    t0 = lua.now_ms
    ten_per_minute = [policy("sliding_log", 10, 60)]
    key = state_key("sliding_log", ten_per_minute[0])
    await decide(lua, "sliding_log", ten_per_minute, 4000, at_ms=t0 + 5000)
    reply = await decide(lua, "sliding_log", ten_per_minute, 1000, at_ms=t0)
    assert reply == [1, 0, 5000, 0, t0 + 65_000]
    assert await log_of(lua, key) == [
        (member(4000, 4000), t0 + 5000),
        (member(5000, 1000), t0 + 5000),
    ]


# -- leaky bucket ----------------------------------------------------------------------------


async def test_leaky_bucket_burst_then_drain(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("leaky_bucket", 10, 60)]
    key = state_key("leaky_bucket", ten_per_minute[0])
    reply = await decide(lua, "leaky_bucket", ten_per_minute, 10_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    assert await hash_of(lua, key) == {"level": "10000", "base": str(t0), "drained": "0"}
    assert await lua.execute("PEXPIRETIME", key) == t0 + MINUTE_MS + 1000
    full = await lua.dump()
    # one unit drains every 6 s; polling denials write nothing and lose no progress
    for waited_ms in range(0, 6000, 1000):
        reply = await decide(lua, "leaky_bucket", ten_per_minute, 1000, at_ms=t0 + waited_ms)
        assert reply == [0, 0, waited_ms // 6, 6000 - waited_ms, t0 + 6000]
        assert await lua.dump() == full
    reply = await decide(lua, "leaky_bucket", ten_per_minute, 1000, at_ms=t0 + 5999)
    assert reply == [0, 0, 999, 1, t0 + 6000]
    reply = await decide(lua, "leaky_bucket", ten_per_minute, 1000, at_ms=t0 + 6000)
    # 1000 drained; full again: empty 60 s after the drain restarts... at base + 66 s
    assert reply == [1, 0, 0, 0, t0 + 66_000]
    assert await hash_of(lua, key) == {"level": "10000", "base": str(t0), "drained": "1000"}


async def test_leaky_bucket_empty_bucket_discards_idle_drain(lua: LuaHarness) -> None:
    """3/minute: one unit per 20 s. The half unit drained beyond empty is not kept."""
    t0 = lua.now_ms
    three_per_minute = [policy("leaky_bucket", 3, 60)]
    key = state_key("leaky_bucket", three_per_minute[0])
    await decide(lua, "leaky_bucket", three_per_minute, 1000, at_ms=t0)
    # 30 s drain 1500 from a level of 1000: empty, the drain restarts now
    reply = await decide(lua, "leaky_bucket", three_per_minute, 1000, at_ms=t0 + 30_000)
    assert reply == [1, 0, 2000, 0, t0 + 50_000]
    assert await hash_of(lua, key) == {"level": "1000", "base": str(t0 + 30_000), "drained": "0"}
    reply = await decide(lua, "leaky_bucket", three_per_minute, 0, apply=False, at_ms=t0 + 49_999)
    assert reply == [1, 0, 2999, 0, t0 + 50_000]


async def test_leaky_bucket_rebases_at_whole_windows(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    three_per_minute = [policy("leaky_bucket", 3, 60)]
    key = state_key("leaky_bucket", three_per_minute[0])
    await decide(lua, "leaky_bucket", three_per_minute, 3000, at_ms=t0)
    # 50 s: 2500 drained, refilled to the brim
    reply = await decide(lua, "leaky_bucket", three_per_minute, 2500, at_ms=t0 + 50_000)
    assert reply == [1, 0, 0, 0, t0 + 110_000]
    # 70 s: 3500 due since base, 2500 of it counted: 1000 more. The base moves one window
    # on and drained keeps only the 500 due since then.
    reply = await decide(lua, "leaky_bucket", three_per_minute, 1000, at_ms=t0 + 70_000)
    assert reply == [1, 0, 0, 0, t0 + 130_000]
    assert await hash_of(lua, key) == {
        "level": "3000",
        "base": str(t0 + MINUTE_MS),
        "drained": "500",
    }


async def test_leaky_bucket_level_above_capacity_reads_as_full(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy("leaky_bucket", 10, 60)]
    key = state_key("leaky_bucket", ten_per_minute[0])
    await lua.execute("HSET", key, "level", "50000", "base", str(t0), "drained", "0")
    reply = await decide(lua, "leaky_bucket", ten_per_minute, 1000, at_ms=t0 + 3000)
    # capped at 10000, 500 drained since: 9500, and 500 more drain by +6 s
    assert reply == [0, 0, 500, 3000, t0 + 6000]


# -- all three -------------------------------------------------------------------------------


async def test_gcra_and_leaky_bucket_give_the_same_replies(lua: LuaHarness) -> None:
    """One rate law, two encodings (an exact arrival time, an integer level)."""
    t0 = lua.now_ms
    calls = [(0, 3000), (1, 4000), (2500, 4000), (1, 1), (997, 1500), (59_000, 7000), (7, 500)]
    now = t0 + 123
    for delta, cost in calls:
        now += delta
        replies = [
            await decide(lua, a, [policy(a, 7, 7), policy(a, 70, 3600)], cost, at_ms=now)
            for a in ("gcra", "leaky_bucket")
        ]
        assert replies[0] == replies[1], (now - t0, cost, replies)


@pytest.mark.parametrize(
    ("algorithm", "first_expiry", "second_expiry"),
    [
        # 1 unit of 10/minute drains in 6 s; the key expires 1 s after it would read empty
        ("gcra", 15_000 + 6000 + 1000, 15_000 + 12_000 + 1000),
        ("leaky_bucket", 15_000 + 6000 + 1000, 15_000 + 12_000 + 1000),
        # (the sliding log repairs it once per second of its stamps:
        # test_sliding_log_trims_and_sets_its_expiry_once_per_second)
    ],
)
async def test_every_written_key_expires_and_a_lost_expiry_is_repaired_gcra_leaky(
    lua: LuaHarness, algorithm: str, first_expiry: int, second_expiry: int
) -> None:
    t0 = lua.now_ms
    ten_per_minute = [policy(algorithm, 10, 60)]
    await decide(lua, algorithm, ten_per_minute, 1000, at_ms=t0 + 15_000)
    (key,) = await lua.keys()
    assert key == state_key(algorithm, ten_per_minute[0])
    assert await lua.execute("PEXPIRETIME", key) == t0 + first_expiry
    await lua.execute("PERSIST", key)
    await decide(lua, algorithm, ten_per_minute, 10_000)  # a denial repairs nothing
    assert await lua.execute("PEXPIRETIME", key) == -1
    await decide(lua, algorithm, ten_per_minute, 1000)
    assert await lua.execute("PEXPIRETIME", key) == t0 + second_expiry


@pytest.mark.parametrize("algorithm", NEWER)
@pytest.mark.parametrize(
    ("pattern", "cost_scaled"),
    [([1000] * 10, 1000), ([3000, 3000, 4000], 2500), ([700] * 14, 9000), ([9999], 10_000)],
)
async def test_retry_hint_is_exact(
    lua: LuaHarness, algorithm: str, pattern: list[int], cost_scaled: int
) -> None:
    """With no other traffic: refused 1 ms before the hint, admitted at it."""
    t0 = lua.now_ms + 1234
    ten_per_7s = [policy(algorithm, 10, 7)]
    for step, charge in enumerate(pattern):
        await decide(lua, algorithm, ten_per_7s, charge, at_ms=t0 + 33 * step)
    now = lua.now_ms + 1
    reply = await decide(lua, algorithm, ten_per_7s, cost_scaled, at_ms=now)
    assert reply[0] == 0 and reply[3] > 0
    before = await decide(
        lua, algorithm, ten_per_7s, cost_scaled, apply=False, at_ms=now + reply[3] - 1
    )
    at = await decide(lua, algorithm, ten_per_7s, cost_scaled, apply=False, at_ms=now + reply[3])
    assert (before[0], at[0]) == (0, 1)
    assert before[3:5] == [1, now + reply[3]] and reply[4] == now + reply[3]


@pytest.mark.parametrize("algorithm", NEWER)
async def test_largest_capacity_state_is_decimal(lua: LuaHarness, algorithm: str) -> None:
    t0 = lua.now_ms
    largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    key = state_key(algorithm, largest[0])
    await decide(lua, algorithm, largest, MAX_CAPACITY - 1, at_ms=t0)
    reply = await decide(lua, algorithm, largest, 1)
    assert reply[:4] == [1, 0, 0, 0]
    if algorithm == "sliding_log":
        assert await log_of(lua, key) == [
            (member(MAX_CAPACITY - 1, MAX_CAPACITY - 1), t0),
            (member(MAX_CAPACITY, 1), t0),
        ]
        return
    # half a day drains exactly half of 9,007,199,254,000
    reply = await decide(lua, algorithm, largest, 0, apply=False, at_ms=t0 + DAY_MS // 2)
    assert reply == [1, 0, 4_503_599_627_000, 0, t0 + DAY_MS]
    # a scaled unit moves the TAT by 86.4e9 / 9,007,199,254,000 µs: up to the next ms
    reply = await decide(lua, algorithm, largest, 1)
    assert reply == [1, 0, 4_503_599_626_999, 0, t0 + DAY_MS + 1]
    if algorithm == "gcra":
        assert await hash_of(lua, key) == {
            "tat": str((t0 + DAY_MS) * 1000),
            "frac": "86400000000",
        }
    else:
        assert await hash_of(lua, key) == {
            "level": "4503599627001",
            "base": str(t0),
            "drained": "4503599627000",
        }


# -- keys and reset --------------------------------------------------------------------------


async def test_algorithms_on_one_identity_use_separate_keys_gcra_log_leaky(lua: LuaHarness) -> None:
    await lua.set_clock(lua.now_ms + 5000)
    for algorithm in NEWER:
        reply = await decide(lua, algorithm, [policy(algorithm, 10, 60)], 4000)
        assert reply[:4] == [1, 0, 6000, 0]
    assert await lua.keys() == sorted(state_key(a, policy(a, 10, 60)) for a in NEWER)
    keys = [policy(a, 10, 60).key for a in NEWER]
    deleted = await lua.run("reset", keys, ["60"] * 3 + list(RESET_SUFFIXES))
    assert deleted == 3
    assert await lua.keys() == []


async def test_reset_deletes_the_new_keys_of_the_given_bases(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    for identity in ("alice", "bob"):
        for algorithm in NEWER:
            for window_s in (1, 60):
                await decide(
                    lua, algorithm, [policy(algorithm, 10, window_s, identity)], 1000, at_ms=t0
                )
    alice = [policy(a, 10, w, "alice").key for a in NEWER for w in (1, 60)]
    bob_before = {k: v for k, v in (await lua.dump()).items() if "bob" in k}
    assert await lua.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 6
    assert await lua.dump() == bob_before
    assert await lua.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 0


@pytest.mark.parametrize("algorithm", NEWER)
async def test_shipped_script_runs_on_redis_time_gcra_log_leaky(
    lua: LuaHarness, algorithm: str
) -> None:
    """The unmodified script, with Redis's own TIME."""
    seconds, micros = await lua.execute("TIME")
    real_before_ms = int(seconds) * 1000 + int(micros) // 1000
    ten_per_minute = [policy(algorithm, 10, 60, "real-clock")]
    reply = await lua.client.evalsha(
        load_script(algorithm),
        [ten_per_minute[0].key],
        script_args(algorithm, 1000, True, ten_per_minute),
    )
    seconds, micros = await lua.execute("TIME")
    real_after_ms = int(seconds) * 1000 + int(micros) // 1000
    assert reply[:4] == [1, 0, 9000, 0]
    recovery_ms = MINUTE_MS if algorithm == "sliding_log" else 6000
    assert real_before_ms + recovery_ms <= reply[4] <= real_after_ms + recovery_ms
    reset_args = ["60", *RESET_SUFFIXES]
    deleted = await lua.client.evalsha(load_script("reset"), [ten_per_minute[0].key], reset_args)
    assert deleted == 1


# -- arguments and stored state --------------------------------------------------------------


@pytest.mark.parametrize("algorithm", NEWER)
@pytest.mark.parametrize(
    ("what", "keys", "args", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS]
)
async def test_bad_arguments_are_refused_before_any_key_is_touched_gcra_log_leaky(
    lua: LuaHarness, algorithm: str, what: str, keys: list[str], args: list[str], message: str
) -> None:
    await lua.set_clock(lua.now_ms + 1000)
    await lua.run(algorithm, ["k", "j"], ["1000", "1", "10000", "60", "10000", "60"])
    for key in await lua.keys():
        await lua.execute("PERSIST", key)  # so that a repair would show too
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await lua.run(algorithm, keys, expand(algorithm, args))
    assert refused.value.message.startswith("MODERATO_ARG ")
    assert message in refused.value.message
    assert await lua.dump() == before


StoredValue = Union[str, dict[str, str], list[tuple[int, str]]]

NEWER_CORRUPT_STATES: list[tuple[str, str, StoredValue]] = [
    ("gcra", "string", "5"),
    ("gcra", "hash", {"a": "1"}),
    ("gcra", "hash", {"tat": "{now_us}"}),
    ("gcra", "hash", {"tat": "1.5", "frac": "0"}),
    ("gcra", "hash", {"tat": "-1", "frac": "0"}),
    ("gcra", "hash", {"tat": "{now_us}", "frac": "9007199254740993"}),
    ("gcra", "hash", {"tat": "9007199254740993", "frac": "0"}),
    ("gcra", "hash", {"tat": "{now_us}", "frac": " 1"}),
    ("leaky_bucket", "string", "1000"),
    ("leaky_bucket", "hash", {"other": "1"}),
    ("leaky_bucket", "hash", {"level": "1000", "base": "{now}"}),
    ("leaky_bucket", "hash", {"level": "1e5", "base": "{now}", "drained": "0"}),
    ("leaky_bucket", "hash", {"level": "10", "base": "4503599627370497", "drained": "0"}),
    ("leaky_bucket", "hash", {"level": "10", "base": "{now}", "drained": "9007199254740993"}),
    ("sliding_log", "string", "1000"),
    ("sliding_log", "hash", {"a": "1"}),
    ("sliding_log", "zset", [(0, "x")]),
    ("sliding_log", "zset", [(0, "12:5")]),  # the total is not 16 digits
    ("sliding_log", "zset", [(0, member(5, 6))]),  # cost above the total
    ("sliding_log", "zset", [(0, member(5, 0))]),  # cost 0
    ("sliding_log", "zset", [(-3, member(5, 5))]),  # before the epoch
    ("sliding_log", "zset", [(-30_000, member(5000, 5000)), (-20_000, member(4000, 1000))]),
]


@pytest.mark.parametrize("alone", [False, True], ids=["beside_a_healthy_policy", "alone"])
@pytest.mark.parametrize(("algorithm", "kind", "value"), NEWER_CORRUPT_STATES)
async def test_unusable_state_is_refused_and_nothing_is_written_gcra_log_leaky(
    lua: LuaHarness, algorithm: str, kind: str, value: StoredValue, alone: bool
) -> None:
    """Alone, the broken policy takes the scripts' one-policy path first: same refusal."""
    t0 = lua.now_ms
    healthy, broken = policy(algorithm, 10, 60, "healthy"), policy(algorithm, 10, 60, "broken")
    await decide(lua, algorithm, [healthy], 1000, at_ms=t0 + 1000)
    key = state_key(algorithm, broken)
    if kind == "string":
        assert isinstance(value, str)
        await lua.execute("SET", key, value)
    elif kind == "hash":
        assert isinstance(value, dict)
        fields = [
            x
            for k, v in value.items()
            for x in (k, v.replace("{now}", str(t0)).replace("{now_us}", str(t0 * 1000)))
        ]
        await lua.execute("HSET", key, *fields)
    else:
        assert isinstance(value, list)
        # scores relative to now, except the one before the epoch
        pairs = [x for at, m in value for x in (at if at == -3 else t0 + 1000 + at, m)]
        await lua.execute("ZADD", key, *pairs)
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, algorithm, [broken] if alone else [healthy, broken], 1000)
    assert refused.value.message.startswith("MODERATO_STATE ")
    assert key in refused.value.message
    assert await lua.dump() == before
