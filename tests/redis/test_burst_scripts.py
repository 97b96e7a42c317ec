"""Bursts in the decision scripts and memory://: a bucket that holds burst_scaled while it
refills capacity_scaled per window (docs/internals.md, "Bursts").

The differential suites (tests/test_differential.py)
hold the scripts, the store and the model to each other on generated burst policies; this
file states the behaviour itself, in numbers, and every burst refusal word for word.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Union

import pytest
import pytest_asyncio
import reference_model as model
from lua_harness import LuaHarness, clock_origin_ms, open_harness
from redis_servers import RedisServer

from moderato import _accel
from moderato.errors import RedisReplyError

BUCKETS = ("token_bucket", "gcra", "leaky_bucket")
Args = list[Union[int, str]]


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def arguments(
    algorithm: str, cost_scaled: int, capacity_scaled: int, window_s: int, burst_scaled: int
) -> Args:
    policy = model.Policy("k", capacity_scaled, window_s, None, burst_scaled)
    return [cost_scaled, 1, *model.script_fields(algorithm, [policy])]


class Both:
    """The script (on Redis, at a test clock) and memory:// side by side, on one key."""

    def __init__(self, lua: LuaHarness, algorithm: str) -> None:
        self.lua, self.algorithm = lua, algorithm
        self.store = _accel.MemoryStore(1000)

    async def decide(self, now_ms: int, args: Args) -> list[int]:
        await self.lua.set_clock(now_ms)
        from_lua = await self.lua.run(self.algorithm, ["k"], [str(arg) for arg in args])
        from_store = self.store.decide(self.algorithm, [b"k"], args, now_ms)
        assert from_store == from_lua
        return list(from_lua)

    async def admitted(self, now_ms: int, args: Args, calls: int) -> int:
        """How many of ``calls`` unit calls at ``now_ms`` are admitted."""
        return sum([(await self.decide(now_ms, args))[0] for _ in range(calls)])


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_ten_per_second_with_a_burst_of_fifty(lua: LuaHarness, algorithm: str) -> None:
    """A fresh key admits the burst at once, then the rate: 10 per second."""
    both = Both(lua, algorithm)
    await lua.flush()
    start_ms = clock_origin_ms() // 1000 * 1000
    args = arguments(algorithm, 1000, 10_000, 1, 50_000)
    assert await both.admitted(start_ms, args, 60) == 50
    # Refused: 0 left, one request back in 100 ms (1/10 s), the bucket full in 5 s.
    assert await both.decide(start_ms, args) == [0, 0, 0, 100, start_ms + 100]
    for second in range(1, 4):
        assert await both.admitted(start_ms + second * 1000, args, 20) == 10
    # Idle for five seconds: the burst is back, and no more.
    assert await both.admitted(start_ms + 3000 + 5000, args, 60) == 50


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_three_per_second_with_a_burst_of_ten(lua: LuaHarness, algorithm: str) -> None:
    """A burst that is no whole number of windows: 10 at once, then one per 1/3 s."""
    both = Both(lua, algorithm)
    await lua.flush()
    start_ms = clock_origin_ms() // 1000 * 1000
    args = arguments(algorithm, 1000, 3000, 1, 10_000)
    assert await both.admitted(start_ms, args, 12) == 10
    # The next unit is credited at ceil(1000 / 3) = 334 ms.
    assert (await both.decide(start_ms + 333, args))[0] == 0
    assert (await both.decide(start_ms + 334, args))[0] == 1
    # 9 s later: 27 units credited, capped at the burst of 10.
    assert await both.admitted(start_ms + 9334, args, 12) == 10


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_a_burst_below_the_rate(lua: LuaHarness, algorithm: str) -> None:
    """10 per second with a burst of 5: at most 5 at once, refilled one per 100 ms."""
    both = Both(lua, algorithm)
    await lua.flush()
    start_ms = clock_origin_ms() // 1000 * 1000
    args = arguments(algorithm, 1000, 10_000, 1, 5000)
    assert await both.admitted(start_ms, args, 8) == 5
    assert await both.admitted(start_ms + 100, args, 3) == 1
    # A whole second idle fills the bucket to 5, not 10.
    assert await both.admitted(start_ms + 1100, args, 8) == 5
    # A cost above the burst can never fit: a permanent denial.
    assert await both.decide(start_ms + 5000, [6000, *args[1:]]) == [0, 0, 5000, -1, -1]


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_a_burst_equal_to_the_capacity_is_the_plain_policy(
    lua: LuaHarness, algorithm: str
) -> None:
    plain_policy = model.Policy("k", 10_000, 1)
    plain: Args = [1000, 1, *model.script_fields(algorithm, [plain_policy])]
    bursting = arguments(algorithm, 1000, 10_000, 1, 10_000)
    start_ms = clock_origin_ms()
    replies = {}
    for name, args in (("plain", plain), ("burst", bursting)):
        await lua.flush()
        both = Both(lua, algorithm)
        replies[name] = [await both.decide(start_ms + 37 * step, args) for step in range(15)]
        replies[name].append(await lua.dump())  # type: ignore[arg-type]
    assert replies["plain"] == replies["burst"]


MAX = model.MAX_CAPACITY_SCALED


def refusal(text: str) -> str:
    return "MODERATO_ARG " + text


@pytest.mark.parametrize(
    ("algorithm", "args", "message"),
    [
        (
            "token_bucket",
            [1000, 1, 10_000, 1, "", 0],
            f'ARGV[6] (burst_scaled of policy 1) must be an integer 1..{MAX}, got "0"',
        ),
        (
            "gcra",
            [1000, 1, 10_000, 1, MAX + 1],
            f'ARGV[5] (burst_scaled of policy 1) must be an integer 1..{MAX}, got "{MAX + 1}"',
        ),
        (
            "leaky_bucket",
            [1000, 1, 10_000, 60, "5x"],
            f'ARGV[5] (burst_scaled of policy 1) must be an integer 1..{MAX}, got "5x"',
        ),
        (
            "token_bucket",
            [1000, 1, 10_000, 1, "20000", 50_000],
            'ARGV[5] (refill_scaled_per_s of policy 1) must be "" with a burst_scaled '
            '(a burst refills at the exact public rate), got "20000"',
        ),
        # 1/day refills at most 3600 days' worth in ten 360-day years, GCRA 41 days' worth.
        (
            "token_bucket",
            [1000, 1, 1000, 86_400, "", 3_600_001],
            "ARGV[6] (burst_scaled of policy 1) must be at most 3600000 for capacity_scaled "
            "1000 per 86400 s (a burst refills within 311040000 s), got 3600001",
        ),
        (
            "leaky_bucket",
            [1000, 1, 1000, 86_400, 3_600_001],
            "ARGV[5] (burst_scaled of policy 1) must be at most 3600000 for capacity_scaled "
            "1000 per 86400 s (a burst refills within 311040000 s), got 3600001",
        ),
        (
            "gcra",
            [1000, 1, 1000, 86_400, 41_001],
            "ARGV[5] (burst_scaled of policy 1) must be at most 41000 for capacity_scaled "
            "1000 per 86400 s (a burst refills within 3599627 s), got 41001",
        ),
        # The second policy: its own fields are counted past the first's four.
        (
            "gcra",
            [1000, 1, 10_000, 1, 50_000, 1000, 3600, 0],
            f'ARGV[8] (burst_scaled of policy 2) must be an integer 1..{MAX}, got "0"',
        ),
        (
            "token_bucket",
            [1000, 1, 10_000, 1, "", 50_000, 7],
            "expected 5 arguments for 1 policies (cost_scaled, apply, then 3 per policy), "
            "or 6 with burst_scaled, got 7",
        ),
        # The window algorithms take no burst: the extra field is an argument too many.
        (
            "fixed_window",
            [1000, 1, 10_000, 1, 50_000],
            "expected 4 arguments for 1 policies (cost_scaled, apply, then 2 per policy), got 5",
        ),
        (
            "sliding_log",
            [1000, 1, 10_000, 1, 50_000],
            "expected 4 arguments for 1 policies (cost_scaled, apply, then 2 per policy), got 5",
        ),
    ],
)
async def test_burst_refusals_are_the_same_word_for_word(
    lua: LuaHarness, algorithm: str, args: Args, message: str
) -> None:
    keys = ["k", "k2"] if len(args) == 8 else ["k"]
    with pytest.raises(RedisReplyError) as refused:
        await lua.run(algorithm, keys, [str(arg) for arg in args])
    assert refused.value.message == refusal(message)
    store = _accel.MemoryStore(1000)
    with pytest.raises(ValueError) as refused_in_process:
        store.decide(algorithm, [key.encode() for key in keys], args, clock_origin_ms())
    assert str(refused_in_process.value) == refusal(message)
    assert len(store) == 0 and await lua.keys() == []


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_the_largest_burst_is_exact_to_the_end(algorithm: str) -> None:
    """The largest burst of 1/second refills in ten years (GCRA: 41.6 days), exactly."""
    bound_s = 3_599_627 if algorithm == "gcra" else 311_040_000
    store = _accel.MemoryStore(1000)
    start_ms = clock_origin_ms()
    args = arguments(algorithm, 1000, 1000, 1, bound_s * 1000)
    reply = store.decide(algorithm, [b"k"], [bound_s * 1000, *args[1:]], start_ms)
    assert reply[:3] == [1, 0, 0]
    # Empty now: full again after exactly bound_s seconds.
    assert reply[4] == start_ms + bound_s * 1000
    refused = store.decide(algorithm, [b"k"], args, start_ms)
    assert refused == [0, 0, 0, 1000, start_ms + 1000]
