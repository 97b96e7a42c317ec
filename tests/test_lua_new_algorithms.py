"""The GCRA, sliding log and leaky bucket scripts on a real Redis: exact numbers.

Like test_lua_algorithms.py, every test drives the shipped scripts (clocked test
copies, see lua_harness.py) at chosen instants; the clock starts on a day
boundary ``t0``. Expected numbers are worked out by hand in the comments.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Optional, Union

import pytest
import pytest_asyncio
import reference_model as model
from lua_harness import LuaHarness, open_harness
from redis_servers import RedisServer
from test_lua_algorithms import BAD_CALLS

from moderato.algorithms import RESET_SUFFIXES
from moderato.errors import RedisReplyError
from moderato.scripts import load_script

TAGS = {"gcra": "gc", "sliding_log": "sl", "leaky_bucket": "lb"}
SUFFIXES = {"gcra": ":gcra", "sliding_log": ":log", "leaky_bucket": ":leaky"}
ALGORITHMS = list(TAGS)
MAX_CAPACITY = model.MAX_CAPACITY_SCALED
MINUTE_MS = 60_000
DAY_MS = 86_400_000


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def policy(
    algorithm: str,
    limit: int,
    window_s: int,
    identity: str = "client",
    *,
    capacity_scaled: Optional[int] = None,
) -> model.Policy:
    key = f"app:{TAGS[algorithm]}:{{tenant:scope:{identity}}}:{window_s}"
    return model.Policy(key, limit * 1000 if capacity_scaled is None else capacity_scaled, window_s)


def state_key(algorithm: str, p: model.Policy) -> str:
    return p.key + SUFFIXES[algorithm]


def script_args(cost_scaled: int, apply: bool, policies: Sequence[model.Policy]) -> list[str]:
    args = [str(cost_scaled), "1" if apply else "0"]
    for p in policies:
        args += [str(p.capacity_scaled), str(p.window_s)]
    return args


async def decide(
    lua: LuaHarness,
    algorithm: str,
    policies: Sequence[model.Policy],
    cost_scaled: int,
    *,
    apply: bool = True,
    at_ms: Optional[int] = None,
) -> list[int]:
    if at_ms is not None:
        await lua.set_clock(at_ms)
    reply = await lua.run(
        algorithm, [p.key for p in policies], script_args(cost_scaled, apply, policies)
    )
    assert all(type(value) is int for value in reply), reply
    return list(reply)


async def hash_of(lua: LuaHarness, key: str) -> dict[str, str]:
    raw = await lua.execute("HGETALL", key)
    return {raw[i].decode(): raw[i + 1].decode() for i in range(0, len(raw), 2)}


async def log_of(lua: LuaHarness, key: str) -> list[tuple[str, int]]:
    raw = await lua.execute("ZRANGE", key, 0, -1, "WITHSCORES")
    return [(raw[i].decode(), int(raw[i + 1])) for i in range(0, len(raw), 2)]


def member(total_scaled: int, cost_scaled: int) -> str:
    return f"{total_scaled:016d}:{cost_scaled}"


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
    assert await lua.execute("PEXPIRETIME", key) == t0 + 121_000
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
    assert await lua.execute("PEXPIRETIME", key) == t0 + 122_000


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


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_cost_above_capacity_is_a_permanent_denial(lua: LuaHarness, algorithm: str) -> None:
    ten_per_minute = [policy(algorithm, 10, 60)]
    reply = await decide(lua, algorithm, ten_per_minute, 11_000, at_ms=lua.now_ms + 5000)
    assert reply == [0, 0, 10_000, -1, -1]
    assert await lua.keys() == []
    await decide(lua, algorithm, ten_per_minute, 3000)
    before = await lua.dump()
    reply = await decide(lua, algorithm, ten_per_minute, 10_001)
    assert reply == [0, 0, 7000, -1, -1]
    assert await lua.dump() == before
    reply = await decide(lua, algorithm, ten_per_minute, 7000)
    assert reply[:4] == [1, 0, 0, 0]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_largest_cost_against_largest_capacity(lua: LuaHarness, algorithm: str) -> None:
    largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    reply = await decide(lua, algorithm, largest, model.MAX_SAFE_INTEGER, at_ms=lua.now_ms)
    assert reply == [0, 0, MAX_CAPACITY, -1, -1]
    reply = await decide(lua, algorithm, largest, MAX_CAPACITY)
    assert reply[:4] == [1, 0, 0, 0]


@pytest.mark.parametrize(
    ("algorithm", "resets", "denied"),
    [
        # 10 units at 10 per s are drained in 1 s; 10 of 1000 per day in 864 s
        ("gcra", (1500, 500 + 864_000), (100, 600, 500 + 864_000)),
        ("leaky_bucket", (1500, 500 + 864_000), (100, 600, 500 + 864_000)),
        # the log recovers when its newest entry leaves; the denial waits for the first
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
    assert first[:3] == [1, 0, 9000] and first[5] == 999_000
    for _ in range(9):
        reply = await decide(lua, algorithm, policies, 1000)
    assert reply == [1, 0, 0, 0, t0 + resets[0], 990_000, 0, t0 + resets[1]]
    before = await lua.dump()
    retry_ms, reset_0, reset_1 = denied
    reply = await decide(lua, algorithm, policies, 1000)
    assert reply == [0, 0, 0, retry_ms, t0 + reset_0, 990_000, 0, t0 + reset_1]
    assert await lua.dump() == before


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_the_day_policy_denies_and_the_second_is_not_charged(
    lua: LuaHarness, algorithm: str
) -> None:
    t0 = lua.now_ms
    policies = [policy(algorithm, 5, 1), policy(algorithm, 8, 86_400)]
    for _ in range(5):
        await decide(lua, algorithm, policies, 1000, at_ms=t0 + 500)
    for _ in range(3):
        reply = await decide(lua, algorithm, policies, 1000, at_ms=t0 + 10_500)
    assert reply[:2] == [1, 1] and reply[5] == 0
    before = await lua.dump()
    reply = await decide(lua, algorithm, policies, 1000, at_ms=t0 + 20_500)
    assert reply[:5] == [0, 1, 5000, 0, reply[4]]
    # 20 s drain floor(20 s * 8000 / 1 day) = 1 scaled unit; a log frees nothing yet
    assert reply[5] == (0 if algorithm == "sliding_log" else 1)
    assert await lua.dump() == before


@pytest.mark.parametrize("algorithm", ALGORITHMS)
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
        # 2 s drain ceil-wise 333 of the 4000 (GCRA, leaky); the log holds all 4000
        assert peeked[:3] == [1, 0, 6000 if algorithm == "sliding_log" else 6333]


@pytest.mark.parametrize(
    ("algorithm", "first_expiry", "second_expiry"),
    [
        # 1 unit of 10/minute drains in 6 s; the key expires 1 s after it would read empty
        ("gcra", 15_000 + 6000 + 1000, 15_000 + 12_000 + 1000),
        ("leaky_bucket", 15_000 + 6000 + 1000, 15_000 + 12_000 + 1000),
        # the newest entry leaves a window after its admission
        ("sliding_log", 15_000 + MINUTE_MS + 1000, 15_000 + MINUTE_MS + 1000),
    ],
)
async def test_every_written_key_expires_and_a_lost_expiry_is_repaired(
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


@pytest.mark.parametrize("algorithm", ALGORITHMS)
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


@pytest.mark.parametrize("algorithm", ALGORITHMS)
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


async def test_algorithms_on_one_identity_use_separate_keys(lua: LuaHarness) -> None:
    await lua.set_clock(lua.now_ms + 5000)
    for algorithm in ALGORITHMS:
        reply = await decide(lua, algorithm, [policy(algorithm, 10, 60)], 4000)
        assert reply[:4] == [1, 0, 6000, 0]
    assert await lua.keys() == sorted(state_key(a, policy(a, 10, 60)) for a in ALGORITHMS)
    deleted = await lua.run(
        "reset", [policy(a, 10, 60).key for a in ALGORITHMS], ["60"] * 3 + list(RESET_SUFFIXES)
    )
    assert deleted == 3
    assert await lua.keys() == []


async def test_reset_deletes_the_new_keys_of_the_given_bases(lua: LuaHarness) -> None:
    t0 = lua.now_ms
    for identity in ("alice", "bob"):
        for algorithm in ALGORITHMS:
            for window_s in (1, 60):
                await decide(
                    lua, algorithm, [policy(algorithm, 10, window_s, identity)], 1000, at_ms=t0
                )
    alice = [policy(a, 10, w, "alice").key for a in ALGORITHMS for w in (1, 60)]
    bob_before = {k: v for k, v in (await lua.dump()).items() if "bob" in k}
    assert await lua.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 6
    assert await lua.dump() == bob_before
    assert await lua.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_shipped_script_runs_on_redis_time(lua: LuaHarness, algorithm: str) -> None:
    """The unmodified script, with Redis's own TIME."""
    seconds, micros = await lua.execute("TIME")
    real_before_ms = int(seconds) * 1000 + int(micros) // 1000
    ten_per_minute = [policy(algorithm, 10, 60, "real-clock")]
    reply = await lua.client.evalsha(
        load_script(algorithm), [ten_per_minute[0].key], script_args(1000, True, ten_per_minute)
    )
    seconds, micros = await lua.execute("TIME")
    real_after_ms = int(seconds) * 1000 + int(micros) // 1000
    assert reply[:4] == [1, 0, 9000, 0]
    recovery_ms = MINUTE_MS if algorithm == "sliding_log" else 6000
    assert real_before_ms + recovery_ms <= reply[4] <= real_after_ms + recovery_ms
    deleted = await lua.client.evalsha(
        load_script("reset"), [ten_per_minute[0].key], ["60", *RESET_SUFFIXES]
    )
    assert deleted == 1


# -- arguments and stored state --------------------------------------------------------------


def expand(args: list[str]) -> list[str]:
    expanded: list[str] = []
    for arg in args:
        if arg == "{p}":
            expanded += ["10000", "60"]
        elif arg != "{rest}":
            expanded.append(arg)
    return expanded


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("what", "keys", "args", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS]
)
async def test_bad_arguments_are_refused_before_any_key_is_touched(
    lua: LuaHarness, algorithm: str, what: str, keys: list[str], args: list[str], message: str
) -> None:
    await lua.set_clock(lua.now_ms + 1000)
    await lua.run(algorithm, ["k", "j"], ["1000", "1", "10000", "60", "10000", "60"])
    for key in await lua.keys():
        await lua.execute("PERSIST", key)  # so that a repair would show too
    before = await lua.dump()
    with pytest.raises(RedisReplyError) as refused:
        await lua.run(algorithm, keys, expand(args))
    assert refused.value.message.startswith("MODERATO_ARG ")
    assert message in refused.value.message
    assert await lua.dump() == before


StoredValue = Union[str, dict[str, str], list[tuple[int, str]]]

CORRUPT_STATES: list[tuple[str, str, StoredValue]] = [
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
@pytest.mark.parametrize(("algorithm", "kind", "value"), CORRUPT_STATES)
async def test_unusable_state_is_refused_and_nothing_is_written(
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
