"""GCRA, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
Numbers worked out by hand in the comments.
"""

from __future__ import annotations

from algorithm_behaviours import DrainedRate, EveryAlgorithm, ExactRetryHint
from decision_stores import DecisionStore
from lua_calls import DAY_MS, MINUTE_MS, decide, hash_of, policy, state_key

ALGORITHM = "gcra"


class TestShared(ExactRetryHint, DrainedRate, EveryAlgorithm):
    algorithm = ALGORITHM
    ten_admitted_resets = (1500, 500 + 864_000)
    denied_retry_and_resets = (100, 600, 500 + 864_000)
    drains = True
    corrupt_states = (
        ("string", "5"),
        ("hash", {"a": "1"}),
        ("hash", {"tat": "{now_us}"}),
        ("hash", {"tat": "1.5", "frac": "0"}),
        ("hash", {"tat": "-1", "frac": "0"}),
        ("hash", {"tat": "{now_us}", "frac": "9007199254740993"}),
        ("hash", {"tat": "9007199254740993", "frac": "0"}),
        ("hash", {"tat": "{now_us}", "frac": " 1"}),
    )

    def largest_state_after_half_a_day(self, t0: int) -> dict[str, str]:
        return {"tat": str((t0 + DAY_MS) * 1000), "frac": "86400000000"}


async def test_burst_then_steady_without_drift(store: DecisionStore) -> None:
    """7/minute: one unit per 60/7 s = 8571.428... ms, a step no whole µs count holds."""
    start = store.now_ms + 15_000
    seven_per_minute = [policy(ALGORITHM, 7, 60)]
    key = state_key(ALGORITHM, seven_per_minute[0])
    await store.set_clock(start)
    # a fresh key admits the whole capacity at once; reset = ceil(k * 60000 / 7) ms on
    resets = [8572, 17_143, 25_715, 34_286, 42_858, 51_429, 60_000]
    for k, reset in enumerate(resets, 1):
        reply = await decide(store, ALGORITHM, seven_per_minute, 1000)
        assert reply == [1, 0, (7 - k) * 1000, 0, start + reset]
        if k == 1:
            # TAT = start + 8571428 µs + 4/7 µs: frac counts 1/7000 µs
            assert await hash_of(store, key) == {
                "tat": str(start * 1000 + 8_571_428),
                "frac": "4000",
            }
    assert await hash_of(store, key) == {"tat": str(start * 1000 + 60_000_000), "frac": "0"}
    assert await store.execute("PEXPIRETIME", key) == start + 60_000 + 1000
    before = await store.dump()
    reply = await decide(store, ALGORITHM, seven_per_minute, 1000)
    assert reply == [0, 0, 0, 8572, start + 8572]
    assert await store.dump() == before
    # Steady: the k-th next unit fits from start + k * 60/7 s, rounded up to the ms; 1 ms
    # earlier it is refused with retry 1. Over two minutes nothing drifts: fractions are kept.
    for k in range(1, 15):
        fits_at = start + -(-k * 60_000 // 7)
        reply = await decide(store, ALGORITHM, seven_per_minute, 1000, at_ms=fits_at - 1)
        assert reply[:4] == [0, 0, 999, 1], (k, reply)
        reply = await decide(store, ALGORITHM, seven_per_minute, 1000, at_ms=fits_at)
        assert reply[:4] == [1, 0, 0, 0], (k, reply)
    # 14 steps of exactly 60/7 s after the burst: the TAT is exactly two minutes further on
    assert await hash_of(store, key) == {"tat": str(start * 1000 + 180_000_000), "frac": "0"}


async def test_keeps_fractions_of_a_microsecond(store: DecisionStore) -> None:
    """3,000,000/second: a unit moves the TAT by 1/3 µs; per-request µs rounding would
    admit a million or three million times too many or too few."""
    start = store.now_ms
    fast = [policy(ALGORITHM, 3_000_000, 1)]
    key = state_key(ALGORITHM, fast[0])
    capacity = 3_000_000_000
    await store.set_clock(start)
    for k, expected in enumerate(
        [
            {"tat": str(start * 1000), "frac": "1000000000"},  # 1/3 µs
            {"tat": str(start * 1000), "frac": "2000000000"},  # 2/3 µs
            {"tat": str(start * 1000 + 1), "frac": "0"},  # 1 µs
        ],
        1,
    ):
        reply = await decide(store, ALGORITHM, fast, 1000)
        assert reply == [1, 0, capacity - k * 1000, 0, start + 1]
        assert await hash_of(store, key) == expected
    # the rest of the burst in one request: the TAT is a whole window ahead
    reply = await decide(store, ALGORITHM, fast, capacity - 3000)
    assert reply == [1, 0, 0, 0, start + 1000]
    # one scaled unit more: it fits once 1/3000 µs has passed, i.e. at the next ms
    reply = await decide(store, ALGORITHM, fast, 1)
    assert reply == [0, 0, 0, 1, start + 1]
    # 1 ms drains 3,000,000 scaled units exactly
    reply = await decide(store, ALGORITHM, fast, 0, apply=False, at_ms=start + 1)
    assert reply == [1, 0, 3_000_000, 0, start + 1000]


async def test_a_passed_tat_is_an_empty_bucket(store: DecisionStore) -> None:
    start = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    await decide(store, ALGORITHM, ten_per_minute, 10_000, at_ms=start)
    # long after the TAT: full capacity again, the TAT restarts from now
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=start + 90_000)
    assert reply == [1, 0, 9000, 0, start + 96_000]


async def test_tat_beyond_a_window_reads_as_full(store: DecisionStore) -> None:
    """The clock stepped back: a TAT two windows ahead is capped at one (a full bucket)."""
    start = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    await store.execute("HSET", key, "tat", str((start + 2 * MINUTE_MS) * 1000), "frac", "5")
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=start)
    assert reply == [0, 0, 0, 6000, start + 6000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 0, apply=False)
    assert reply == [1, 0, 0, 0, start + MINUTE_MS]


async def test_frac_of_capacity_or_more_counts_as_one_microsecond(store: DecisionStore) -> None:
    start = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    # TAT = start + 5999 ms + 999 µs, and a frac >= capacity: one more µs, exactly 6 s
    await store.execute("HSET", key, "tat", str(start * 1000 + 5_999_999), "frac", "10000")
    reply = await decide(store, ALGORITHM, ten_per_minute, 0, apply=False, at_ms=start)
    assert reply == [1, 0, 9000, 0, start + 6000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000)
    assert reply == [1, 0, 8000, 0, start + 12_000]
    assert await hash_of(store, key) == {"tat": str(start * 1000 + 12_000_000), "frac": "0"}
