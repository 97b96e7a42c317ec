"""The leaky bucket, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
Numbers worked out by hand in the comments.
"""

from __future__ import annotations

from algorithm_behaviours import DrainedRate, EveryAlgorithm, ExactRetryHint
from decision_stores import DecisionStore
from lua_calls import MINUTE_MS, decide, hash_of, policy, state_key

ALGORITHM = "leaky_bucket"


class TestShared(ExactRetryHint, DrainedRate, EveryAlgorithm):
    algorithm = ALGORITHM
    ten_admitted_resets = (1500, 500 + 864_000)
    denied_retry_and_resets = (100, 600, 500 + 864_000)
    drains = True
    corrupt_states = (
        ("string", "1000"),
        ("hash", {"other": "1"}),
        ("hash", {"level": "1000", "base": "{now}"}),
        ("hash", {"level": "1e5", "base": "{now}", "drained": "0"}),
        ("hash", {"level": "10", "base": "4503599627370497", "drained": "0"}),
        ("hash", {"level": "10", "base": "{now}", "drained": "9007199254740993"}),
    )

    def largest_state_after_half_a_day(self, t0: int) -> dict[str, str]:
        return {"level": "4503599627001", "base": str(t0), "drained": "4503599627000"}


async def test_burst_then_drain(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    reply = await decide(store, ALGORITHM, ten_per_minute, 10_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    assert await hash_of(store, key) == {"level": "10000", "base": str(t0), "drained": "0"}
    assert await store.execute("PEXPIRETIME", key) == t0 + MINUTE_MS + 1000
    full = await store.dump()
    # one unit drains every 6 s; polling denials write nothing and lose no progress
    for waited_ms in range(0, 6000, 1000):
        reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + waited_ms)
        assert reply == [0, 0, waited_ms // 6, 6000 - waited_ms, t0 + 6000]
        assert await store.dump() == full
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 5999)
    assert reply == [0, 0, 999, 1, t0 + 6000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 6000)
    # 1000 drained; full again: empty 60 s after the drain restarts... at base + 66 s
    assert reply == [1, 0, 0, 0, t0 + 66_000]
    assert await hash_of(store, key) == {"level": "10000", "base": str(t0), "drained": "1000"}


async def test_empty_bucket_discards_idle_drain(store: DecisionStore) -> None:
    """3/minute: one unit per 20 s. The half unit drained beyond empty is not kept."""
    t0 = store.now_ms
    three_per_minute = [policy(ALGORITHM, 3, 60)]
    key = state_key(ALGORITHM, three_per_minute[0])
    await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0)
    # 30 s drain 1500 from a level of 1000: empty, the drain restarts now
    reply = await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0 + 30_000)
    assert reply == [1, 0, 2000, 0, t0 + 50_000]
    assert await hash_of(store, key) == {"level": "1000", "base": str(t0 + 30_000), "drained": "0"}
    reply = await decide(store, ALGORITHM, three_per_minute, 0, apply=False, at_ms=t0 + 49_999)
    assert reply == [1, 0, 2999, 0, t0 + 50_000]


async def test_rebases_at_whole_windows(store: DecisionStore) -> None:
    t0 = store.now_ms
    three_per_minute = [policy(ALGORITHM, 3, 60)]
    key = state_key(ALGORITHM, three_per_minute[0])
    await decide(store, ALGORITHM, three_per_minute, 3000, at_ms=t0)
    # 50 s: 2500 drained, refilled to the brim
    reply = await decide(store, ALGORITHM, three_per_minute, 2500, at_ms=t0 + 50_000)
    assert reply == [1, 0, 0, 0, t0 + 110_000]
    # 70 s: 3500 due since base, 2500 of it counted: 1000 more. The base moves one window
    # on and drained keeps only the 500 due since then.
    reply = await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0 + 70_000)
    assert reply == [1, 0, 0, 0, t0 + 130_000]
    assert await hash_of(store, key) == {
        "level": "3000",
        "base": str(t0 + MINUTE_MS),
        "drained": "500",
    }


async def test_level_above_capacity_reads_as_full(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    key = state_key(ALGORITHM, ten_per_minute[0])
    await store.execute("HSET", key, "level", "50000", "base", str(t0), "drained", "0")
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 3000)
    # capped at 10000, 500 drained since: 9500, and 500 more drain by +6 s
    assert reply == [0, 0, 500, 3000, t0 + 6000]


async def test_gcra_and_leaky_bucket_give_the_same_replies(store: DecisionStore) -> None:
    """One rate law, two encodings (an exact arrival time, an integer level)."""
    t0 = store.now_ms
    calls = [(0, 3000), (1, 4000), (2500, 4000), (1, 1), (997, 1500), (59_000, 7000), (7, 500)]
    now = t0 + 123
    for delta, cost in calls:
        now += delta
        replies = [
            await decide(store, a, [policy(a, 7, 7), policy(a, 70, 3600)], cost, at_ms=now)
            for a in ("gcra", "leaky_bucket")
        ]
        assert replies[0] == replies[1], (now - t0, cost, replies)
