"""The sliding window, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from algorithm_behaviours import CountingAlgorithm, EveryAlgorithm, WindowCounter
from decision_stores import BACKENDS, DecisionStore, holds
from lua_calls import DAY_MS, MINUTE_MS, decide, policy

from moderato.errors import RedisReplyError

ALGORITHM = "sliding_window"


class TestShared(CountingAlgorithm, WindowCounter, EveryAlgorithm):
    algorithm = ALGORITHM
    # the 1 s window's next second still weighs this one fully: the one after
    ten_admitted_resets = (1000, DAY_MS)
    denied_retry_and_resets = (1500, 2000, DAY_MS)
    drains = False
    corrupt_states = (
        ("string", "1e5"),
        ("hash", {"a": "1"}),
        ("string", "-3"),
        ("string", "9007199254740993"),
    )
    # denial: the first second of the next window where floor(8000 * w / 1000) + 3000
    # fits 10000: w <= 875, so second 8 (w = floor(52000 / 60) = 866).
    reset_after_8, denied_retry_ms, denied_reset = 60_000, 53_000, 68_000
    fitting_reset = DAY_MS  # the day's end
    # the end of the window that reads it as previous
    expiry_after_t0 = 2 * MINUTE_MS

    def broken_key(self, broken: Any, t0: int) -> str:
        return f"{broken.key}:{(t0 + 1000) // MINUTE_MS - 1}"  # the previous counter

    def stored_after_8_of_10(self, key: str, t0: int) -> dict[str, Any]:
        window_index = (t0 + 15_000) // MINUTE_MS
        return {f"{key}:{window_index}": ("string", "8000", (window_index + 2) * MINUTE_MS)}


async def test_weight_falls_at_whole_seconds(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    await decide(store, ALGORITHM, ten_per_minute, 9000, at_ms=t0 + 30_000)
    # next window, 999 ms in: the previous window still weighs 1000 permille
    reply = await decide(
        store, ALGORITHM, ten_per_minute, 0, apply=False, at_ms=t0 + MINUTE_MS + 999
    )
    assert reply == [1, 0, 1000, 0, t0 + 2 * MINUTE_MS]
    # one whole second in: floor(59000 / 60) = 983 permille; floor(9000 * 983 / 1000) = 8847
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + MINUTE_MS + 1000)
    assert reply == [1, 0, 153, 0, t0 + 2 * MINUTE_MS]


async def test_retry_later_in_the_same_window(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    await decide(store, ALGORITHM, ten_per_minute, 9000, at_ms=t0 + 30_000)
    # cost 2000 needs floor(9000 * w / 1000) <= 8000: w <= 888, first at second 7 (w = 883)
    reply = await decide(store, ALGORITHM, ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 1500)
    assert reply == [0, 0, 1153, 5500, t0 + MINUTE_MS + 7000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 6999)
    assert reply[0] == 0
    reply = await decide(store, ALGORITHM, ten_per_minute, 2000, at_ms=t0 + MINUTE_MS + 7000)
    assert reply[:2] == [1, 0]


async def test_retry_may_lie_beyond_the_next_boundary(store: DecisionStore) -> None:
    """2 per 2 s, all used: the next window still weighs this one at 1000 then 500 permille."""
    t0 = store.now_ms
    two_per_2s = [policy(ALGORITHM, 2, 2)]
    await decide(store, ALGORITHM, two_per_2s, 2000, at_ms=t0)
    reply = await decide(store, ALGORITHM, two_per_2s, 2000, at_ms=t0 + 100)
    assert reply == [0, 0, 0, 3900, t0 + 4000]
    assert (await decide(store, ALGORITHM, two_per_2s, 2000, at_ms=t0 + 3999))[0] == 0
    assert (await decide(store, ALGORITHM, two_per_2s, 2000, at_ms=t0 + 4000))[0] == 1


UNUSABLE_CURRENT = ["abc", "-5", "1.5", "9007199254740993", {"a": "1"}]


@pytest.mark.parametrize(
    ("backend", "stored"),
    [
        pytest.param(backend, stored, id=f"{backend}-{stored}")
        for stored in UNUSABLE_CURRENT
        for backend in BACKENDS
        if holds(backend, stored)  # memory:// keeps integers, not text
    ],
)
@pytest.mark.parametrize("previous", [None, "2000"], ids=["no_previous", "previous"])
async def test_alone_refuses_an_unusable_current_counter(
    store: DecisionStore, stored: object, previous: Optional[str]
) -> None:
    """The one-policy path reads both counters with one MGET, which answers nil for a key
    of another type: the refusal is the general path's all the same, nothing written."""
    t0 = store.now_ms
    broken = policy(ALGORITHM, 10, 60, "broken")
    key = f"{broken.key}:{t0 // MINUTE_MS}"
    if previous is not None:
        await store.execute("SET", f"{broken.key}:{t0 // MINUTE_MS - 1}", previous)
    if isinstance(stored, dict):
        await store.execute("HSET", key, *(x for pair in stored.items() for x in pair))
    else:
        await store.execute("SET", key, str(stored))
    before = await store.dump()
    with pytest.raises(RedisReplyError) as refused:
        await decide(store, ALGORITHM, [broken], 1000)
    assert refused.value.message.startswith(f'MODERATO_STATE key "{key}" ')
    assert await store.dump() == before
