"""The sliding log, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
Numbers worked out by hand in the comments.
"""

from __future__ import annotations

import pytest
import reference_model as model
from algorithm_behaviours import EveryAlgorithm, ExactRetryHint
from decision_stores import DecisionStore
from lua_calls import DAY_MS, MAX_CAPACITY, MINUTE_MS, decide, log_of, member, policy, state_key

ALGORITHM = "sliding_log"


class TestShared(ExactRetryHint, EveryAlgorithm):
    algorithm = ALGORITHM
    ten_admitted_resets = (1500, 500 + DAY_MS)
    denied_retry_and_resets = (1000, 1500, 500 + DAY_MS)
    drains = False
    corrupt_states = (
        ("string", "1000"),
        ("hash", {"a": "1"}),
        ("zset", [(0, "x")]),
        ("zset", [(0, "12:5")]),  # the total is not 16 digits
        ("zset", [(0, member(5, 6))]),  # cost above the total
        ("zset", [(0, member(5, 0))]),  # cost 0
        ("zset", [(-3, member(5, 5))]),  # before the epoch
        ("zset", [(-30_000, member(5000, 5000)), (-20_000, member(4000, 1000))]),
    )

    def real_clock_resets(self, before_ms: int, after_ms: int) -> range:
        # a log's entry leaves a whole window after it was taken
        return range(before_ms + MINUTE_MS, after_ms + MINUTE_MS + 1)


async def test_largest_capacity_state_is_decimal(store: DecisionStore) -> None:
    t0 = store.now_ms
    largest = [policy(ALGORITHM, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    key = state_key(ALGORITHM, largest[0])
    await decide(store, ALGORITHM, largest, MAX_CAPACITY - 1, at_ms=t0)
    reply = await decide(store, ALGORITHM, largest, 1)
    assert reply[:4] == [1, 0, 0, 0]
    assert await log_of(store, key) == [
        (member(MAX_CAPACITY - 1, MAX_CAPACITY - 1), t0),
        (member(MAX_CAPACITY, 1), t0),
    ]


async def test_rolls_exactly(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    for _ in range(4):
        await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0)
    await decide(store, ALGORITHM, ten_per_minute, 3000, at_ms=t0 + 20_000)
    for _ in range(3):
        reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 40_000)
    assert reply == [1, 0, 0, 0, t0 + 100_000]
    # four admissions in one ms are four members; totals run on
    assert await log_of(store, key) == [
        (member(1000, 1000), t0),
        (member(2000, 1000), t0),
        (member(3000, 1000), t0),
        (member(4000, 1000), t0),
        (member(7000, 3000), t0 + 20_000),
        (member(8000, 1000), t0 + 40_000),
        (member(9000, 1000), t0 + 40_000),
        (member(10_000, 1000), t0 + 40_000),
    ]
    before = await store.dump()
    # cost 5: the four units leave at +60 s (4 freed), the 3 at +80 s (7 freed)
    reply = await decide(store, ALGORITHM, ten_per_minute, 5000, at_ms=t0 + 50_000)
    assert reply == [0, 0, 0, 30_000, t0 + 80_000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 59_999)
    assert reply == [0, 0, 0, 1, t0 + 60_000]
    assert await store.dump() == before  # denials neither charge nor trim
    # at +60 s the entries of t0 are out of (now - 60 s, now]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 60_000)
    assert reply == [1, 0, 3000, 0, t0 + 120_000]
    assert await log_of(store, key) == [
        (member(7000, 3000), t0 + 20_000),
        (member(8000, 1000), t0 + 40_000),
        (member(9000, 1000), t0 + 40_000),
        (member(10_000, 1000), t0 + 40_000),
        (member(11_000, 1000), t0 + 60_000),
    ]
    # the second of the stamp + 2 s + the window: 1 to 2 s after the newest entry leaves
    assert await store.execute("PEXPIRETIME", key) == t0 + 122_000
    # 7 in the window, cost 5 needs 2 freed: the 3 of +20 s
    reply = await decide(store, ALGORITHM, ten_per_minute, 5000, at_ms=t0 + 79_999)
    assert reply == [0, 0, 3000, 1, t0 + 80_000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 5000, at_ms=t0 + 80_000)
    assert reply == [1, 0, 1000, 0, t0 + 140_000]


async def test_has_no_boundary_burst(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    reply = await decide(store, ALGORITHM, ten_per_minute, 10_000, at_ms=t0 + 59_999)
    assert reply[:4] == [1, 0, 0, 0]
    # a fixed window would start afresh at +60 s; the log waits a whole window
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 60_000)
    assert reply == [0, 0, 0, 59_999, t0 + 119_999]


async def test_peek_reads_as_if_trimmed(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    await decide(store, ALGORITHM, ten_per_minute, 6000, at_ms=t0)
    await decide(store, ALGORITHM, ten_per_minute, 3000, at_ms=t0 + 30_000)
    await store.execute("PERSIST", key)
    before = await store.dump()
    reply = await decide(store, ALGORITHM, ten_per_minute, 0, apply=False, at_ms=t0 + 61_000)
    assert reply == [1, 0, 7000, 0, t0 + 90_000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 7000, apply=False)
    assert reply == [1, 0, 0, 0, t0 + 121_000]
    assert await store.dump() == before  # the stale entry is still there, unexpired
    # the admission trims it and repairs the expiry
    await decide(store, ALGORITHM, ten_per_minute, 7000)
    assert await log_of(store, key) == [
        (member(9000, 3000), t0 + 30_000),
        (member(16_000, 7000), t0 + 61_000),
    ]
    assert await store.execute("PEXPIRETIME", key) == t0 + 123_000


@pytest.mark.parametrize("policies", [1, 2], ids=["one_policy_path", "general_path"])
async def test_trims_and_sets_its_expiry_once_per_second(
    store: DecisionStore, policies: int
) -> None:
    """Admissions stamped in the second of the newest entry neither trim nor touch the
    expiry (it is the same for every stamp of that second); the first of a later second
    does both, and so repairs a lost expiry."""
    t0 = store.now_ms
    chosen = [policy(ALGORITHM, 10, 60), policy(ALGORITHM, 100, 3600)][:policies]
    key = state_key(ALGORITHM, chosen[0])
    await decide(store, ALGORITHM, chosen, 1000, at_ms=t0 + 400)
    assert await store.execute("PEXPIRETIME", key) == t0 + 62_000
    await decide(store, ALGORITHM, chosen, 1000, at_ms=t0 + 60_100)
    await store.execute("PERSIST", key)
    # +60.4 s: the entry of +0.4 s has left the window, but this second was renewed at +60.1
    await decide(store, ALGORITHM, chosen, 1000, at_ms=t0 + 60_900)
    assert await log_of(store, key) == [
        (member(1000, 1000), t0 + 400),
        (member(2000, 1000), t0 + 60_100),
        (member(3000, 1000), t0 + 60_900),
    ]
    assert await store.execute("PEXPIRETIME", key) == -1
    await decide(store, ALGORITHM, chosen, 1000, at_ms=t0 + 61_000)
    assert await log_of(store, key) == [
        (member(2000, 1000), t0 + 60_100),
        (member(3000, 1000), t0 + 60_900),
        (member(4000, 1000), t0 + 61_000),
    ]
    assert await store.execute("PEXPIRETIME", key) == t0 + 123_000


async def test_totals_restart_when_the_window_is_empty(store: DecisionStore) -> None:
    t0 = store.now_ms
    two_per_second = [policy(ALGORITHM, 2, 1)]
    key = state_key(ALGORITHM, two_per_second[0])
    await decide(store, ALGORITHM, two_per_second, 2000, at_ms=t0)
    await decide(store, ALGORITHM, two_per_second, 500, at_ms=t0 + 1000)
    assert await log_of(store, key) == [(member(500, 500), t0 + 1000)]


async def test_renumbers_totals_before_they_pass_2_53(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    top = model.MAX_SAFE_INTEGER
    await store.execute(
        "ZADD",
        key,
        t0 - MINUTE_MS,
        member(top - 5000, 2000),  # out of the window: trimmed
        t0 - 30_000,
        member(top - 4000, 1000),
        t0 - 10_000,
        member(top - 2000, 2000),
    )
    before = await store.dump()
    # 3000 in the window; a cost of 3000 would take the total past 2^53
    reply = await decide(store, ALGORITHM, ten_per_minute, 3000, apply=False, at_ms=t0)
    assert reply == [1, 0, 4000, 0, t0 + MINUTE_MS]
    assert await store.dump() == before
    reply = await decide(store, ALGORITHM, ten_per_minute, 3000)
    assert reply == [1, 0, 4000, 0, t0 + MINUTE_MS]
    assert await log_of(store, key) == [
        (member(1000, 1000), t0 - 30_000),
        (member(3000, 2000), t0 - 10_000),
        (member(6000, 3000), t0),
    ]
    reply = await decide(store, ALGORITHM, ten_per_minute, 5000)
    assert reply == [0, 0, 4000, 30_000, t0 + 30_000]


async def test_entries_ahead_of_the_clock(store: DecisionStore) -> None:
    """The clock stepped back: a newer entry keeps counting; new entries stamp after it."""
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    await decide(store, ALGORITHM, ten_per_minute, 4000, at_ms=t0 + 5000)
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0)
    assert reply == [1, 0, 5000, 0, t0 + 65_000]
    assert await log_of(store, key) == [
        (member(4000, 4000), t0 + 5000),
        (member(5000, 1000), t0 + 5000),
    ]
