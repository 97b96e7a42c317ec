"""The fixed window, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from algorithm_behaviours import CountingAlgorithm, EveryAlgorithm, WindowCounter
from decision_stores import DecisionStore, holds
from lua_calls import DAY_MS, MINUTE_MS, decide, policy

from moderato.errors import RedisReplyError

ALGORITHM = "fixed_window"


class TestShared(CountingAlgorithm, WindowCounter, EveryAlgorithm):
    algorithm = ALGORITHM
    ten_admitted_resets = (1000, DAY_MS)
    denied_retry_and_resets = (500, 1000, DAY_MS)
    drains = False
    corrupt_states = (
        ("string", "abc"),
        ("string", "-5"),
        ("string", "1.5"),
        ("string", "9007199254740993"),
        ("hash", {"a": "1"}),
    )
    # reset = the window's end; the denial waits for it.
    reset_after_8, denied_retry_ms, denied_reset = 60_000, 45_000, 60_000
    fitting_reset = DAY_MS  # the day's end
    expiry_after_t0 = MINUTE_MS  # the window's end

    def broken_key(self, broken: Any, t0: int) -> str:
        return f"{broken.key}:{(t0 + 1000) // MINUTE_MS}"

    def stored_after_8_of_10(self, key: str, t0: int) -> dict[str, Any]:
        window_index = (t0 + 15_000) // MINUTE_MS
        return {f"{key}:{window_index}": ("string", "8000", (window_index + 1) * MINUTE_MS)}


async def test_resets_at_the_window_end(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    reply = await decide(store, ALGORITHM, ten_per_minute, 10_000, at_ms=t0 + 1)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + MINUTE_MS - 1)
    assert reply == [0, 0, 0, 1, t0 + MINUTE_MS]
    # 14:35:00 - 14:36:00, then a fresh window
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + MINUTE_MS)
    assert reply == [1, 0, 9000, 0, t0 + 2 * MINUTE_MS]


async def test_ties_go_to_the_lowest_index(store: DecisionStore) -> None:
    """Windows of 1 s and 2 s both end at t0 + 2 s."""
    t0 = store.now_ms
    policies = [policy(ALGORITHM, 1, 1), policy(ALGORITHM, 1, 2)]
    reply = await decide(store, ALGORITHM, policies, 1000, at_ms=t0 + 1500)
    assert reply == [1, 0, 0, 0, t0 + 2000, 0, 0, t0 + 2000]
    reply = await decide(store, ALGORITHM, policies, 1000)
    assert reply == [0, 0, 0, 500, t0 + 2000, 0, 500, t0 + 2000]
    longest_last = [policy(ALGORITHM, 1, 1), policy(ALGORITHM, 1, 60)]
    await decide(store, ALGORITHM, longest_last, 1000, at_ms=t0 + 2500)
    reply = await decide(store, ALGORITHM, longest_last, 1000)
    assert reply[:2] == [0, 1] and reply[6] == 57_500


SINGLE_POLICY_EDGES = [
    ("0", [1, 0, 9000, 0, MINUTE_MS]),
    ("007", [1, 0, 8993, 0, MINUTE_MS]),  # INCRBY refuses it; the general path takes it
    ("9000", [1, 0, 0, 0, MINUTE_MS]),
    ("9001", [0, 0, 999, MINUTE_MS - 1000, MINUTE_MS]),
    ("25000", [0, 0, 0, MINUTE_MS - 1000, MINUTE_MS]),  # above a since-lowered capacity
    ("9007199254740992", [0, 0, 0, MINUTE_MS - 1000, MINUTE_MS]),  # 2^53: still valid
]


@pytest.mark.parametrize(
    ("backend", "stored", "expected"),
    [
        pytest.param(backend, stored, expected, id=f"{backend}-{stored}")
        for stored, expected in SINGLE_POLICY_EDGES
        for backend in ("redis", "memory")
        if holds(backend, stored)  # memory:// keeps integers, not their spellings
    ],
)
async def test_single_policy_counter_edges(
    store: DecisionStore, stored: str, expected: list[int]
) -> None:
    """Admissions and denials of the one-policy path around capacity and 2^53; a denial
    leaves the counter and its (missing) expiry as they were."""
    t0 = store.now_ms - store.now_ms % MINUTE_MS
    ten_per_minute = policy(ALGORITHM, 10, 60)
    key = f"{ten_per_minute.key}:{t0 // MINUTE_MS}"
    await store.execute("SET", key, stored)
    before = await store.dump()
    reply = await decide(store, ALGORITHM, [ten_per_minute], 1000, at_ms=t0 + 1000)
    expected = [*expected[:4], t0 + expected[4]]
    assert reply == expected
    if reply[0]:
        assert await store.execute("GET", key) == str(int(stored) + 1000).encode()
        # the expiry is set only on a counter found at 0
        expiry = t0 + MINUTE_MS if stored == "0" else -1
        assert await store.execute("PEXPIRETIME", key) == expiry
    else:
        assert await store.dump() == before


async def test_a_long_bad_argument_is_shown_shortened(store: DecisionStore) -> None:
    with pytest.raises(RedisReplyError) as refused:
        await store.run(ALGORITHM, ["k"], ["7" * 30 + "x" * 70, "1", "10000", "60"])
    assert refused.value.message.endswith('got "' + "7" * 30 + "x" * 10 + '..."')
