"""The token bucket, exactly: the documented numbers on both backends.

Every case runs on the shipped script on a real Redis (a test clock, see
lua_harness.py) and on memory://'s store (``store``: decision_stores.py); the
behaviours every algorithm shares run from here too (algorithm_behaviours.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import reference_model as model
from algorithm_behaviours import CountingAlgorithm, EveryAlgorithm, populated
from decision_stores import DecisionStore
from lua_calls import DAY_MS, MAX_CAPACITY, MINUTE_MS, decide, policy
from lua_harness import LuaHarness

from moderato.errors import RedisReplyError

ALGORITHM = "token_bucket"
BUCKET = ":bucket:v2"

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


class TestShared(CountingAlgorithm, EveryAlgorithm):
    algorithm = ALGORITHM
    # 10 units at 10 per s refill in 1 s; 10 of 1000 per day in 864 s
    ten_admitted_resets = (1500, 500 + 864_000)
    denied_retry_and_resets = (100, 600, 500 + 864_000)
    drains = True
    corrupt_states = (
        ("string", "1000"),
        ("hash", {"other": "1"}),
        ("hash", {"tokens": "1000", "base": "{now}"}),
        ("hash", {"tokens": "1e5", "base": "{now}", "credited": "0"}),
        ("hash", {"tokens": "-1", "base": "{now}", "credited": "0"}),
        ("hash", {"tokens": "10", "base": "4503599627370497", "credited": "0"}),
        ("hash", {"tokens": "10", "base": "{now}", "credited": "9007199254740993"}),
    )
    # allowed: full-refill time (8 units at 1 per 6 s); denied: when 1 more unit exists.
    reset_after_8, denied_retry_ms, denied_reset = 15_000 + 48_000, 6_000, 15_000 + 6_000
    fitting_reset = 500  # a full bucket: now (nothing to refill)

    def stored_after_8_of_10(self, key: str, t0: int) -> dict[str, Any]:
        return {
            key + BUCKET: (
                "hash",
                {"tokens": "2000", "base": str(t0 + 15_000), "credited": "0"},
                t0 + 15_000 + 2 * MINUTE_MS + 60_000,
            )
        }


async def test_refills_continuously(store: DecisionStore) -> None:
    """100/minute refills ~1.67 per second: 1666 scaled units after one second."""
    t0 = store.now_ms
    hundred_per_minute = [policy(ALGORITHM, 100, 60)]
    reply = await decide(store, ALGORITHM, hundred_per_minute, 100_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + MINUTE_MS]
    reply = await decide(store, ALGORITHM, hundred_per_minute, 0, apply=False, at_ms=t0 + 1000)
    assert reply == [1, 0, 1666, 0, t0 + MINUTE_MS]
    # 1666 credited; after this charge 99,334 are missing: ceil((1666 + 99334) * 0.6) = 60600 ms
    reply = await decide(store, ALGORITHM, hundred_per_minute, 1000)
    assert reply == [1, 0, 666, 0, t0 + 60_600]


async def test_denied_polling_keeps_refill_progress(store: DecisionStore) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    await decide(store, ALGORITHM, ten_per_minute, 10_000, at_ms=t0)
    drained = await store.dump()
    for waited_ms in range(0, 6000, 1000):
        reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + waited_ms)
        assert reply == [0, 0, waited_ms // 6, 6000 - waited_ms, t0 + 6000]
        assert await store.dump() == drained
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 5999)
    assert reply == [0, 0, 999, 1, t0 + 6000]
    reply = await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 6000)
    assert reply[:4] == [1, 0, 0, 0]


async def test_full_bucket_discards_idle_credit(store: DecisionStore) -> None:
    """3/minute: one unit per 20 s. Half a unit of surplus is not kept once full."""
    t0 = store.now_ms
    three_per_minute = [policy(ALGORITHM, 3, 60)]
    await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0)
    # 30 s credit 1500 on top of 2000: capped at 3000, the accrual restarts now
    reply = await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0 + 30_000)
    assert reply == [1, 0, 2000, 0, t0 + 50_000]
    key = three_per_minute[0].key + BUCKET
    assert await store.execute("HGETALL", key) == [
        b"tokens",
        b"2000",
        b"base",
        str(t0 + 30_000).encode(),
        b"credited",
        b"0",
    ]
    reply = await decide(store, ALGORITHM, three_per_minute, 0, apply=False, at_ms=t0 + 49_999)
    assert reply == [1, 0, 2999, 0, t0 + 50_000]


async def test_rebases_at_whole_windows(store: DecisionStore) -> None:
    t0 = store.now_ms
    three_per_minute = [policy(ALGORITHM, 3, 60)]
    key = three_per_minute[0].key + BUCKET
    await decide(store, ALGORITHM, three_per_minute, 3000, at_ms=t0)
    # 50 s: 2500 credited, all spent
    reply = await decide(store, ALGORITHM, three_per_minute, 2500, at_ms=t0 + 50_000)
    assert reply == [1, 0, 0, 0, t0 + 110_000]
    # 70 s: 3500 due since base, 2500 of it credited: 1000 more. The base moves one window on
    # and credited keeps only the 500 due since then.
    reply = await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0 + 70_000)
    assert reply == [1, 0, 0, 0, t0 + 130_000]
    assert await store.execute("HGETALL", key) == [
        b"tokens",
        b"0",
        b"base",
        str(t0 + 60_000).encode(),
        b"credited",
        b"500",
    ]


async def test_exactly_full_after_a_rebase_restarts_the_accrual(store: DecisionStore) -> None:
    t0 = store.now_ms
    three_per_minute = [policy(ALGORITHM, 3, 60)]
    key = three_per_minute[0].key + BUCKET
    await decide(store, ALGORITHM, three_per_minute, 3000, at_ms=t0)
    await decide(store, ALGORITHM, three_per_minute, 2000, at_ms=t0 + 50_000)  # 500 left
    # 100 s: 5000 due, 2500 credited: 500 + 2500 = exactly full, so the base is now
    reply = await decide(store, ALGORITHM, three_per_minute, 1000, at_ms=t0 + 100_000)
    assert reply == [1, 0, 2000, 0, t0 + 120_000]
    assert await store.execute("HGETALL", key) == [
        b"tokens",
        b"2000",
        b"base",
        str(t0 + 100_000).encode(),
        b"credited",
        b"0",
    ]


async def test_refill_time_is_exact_where_floats_round_up(store: DecisionStore) -> None:
    """41 units at 10/minute take exactly 246 ms, but 41 / 10000 * 60000 is 246.00000000000003."""
    assert math.ceil(41 / 10_000 * 60_000) == 247  # the estimate the script corrects
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    reply = await decide(store, ALGORITHM, ten_per_minute, 41, at_ms=t0)
    assert reply == [1, 0, 9959, 0, t0 + 246]
    await decide(store, ALGORITHM, ten_per_minute, 9959)
    reply = await decide(store, ALGORITHM, ten_per_minute, 41)
    assert reply == [0, 0, 0, 246, t0 + 246]


async def test_custom_refill_rate(store: DecisionStore) -> None:
    """A direct caller's rate: 500 scaled units (half a request) per second, window 60 s."""
    t0 = store.now_ms
    custom = [policy(ALGORITHM, 10, 60, refill=500.0)]
    key = custom[0].key + BUCKET
    # empty after this: 10,000 units at 0.5 per ms take 20 s
    reply = await decide(store, ALGORITHM, custom, 10_000, at_ms=t0)
    assert reply == [1, 0, 0, 0, t0 + 20_000]
    # TTL: 2 * max(window 60 s, full refill 20 s) + 60 s
    assert await store.execute("PEXPIRETIME", key) == t0 + 180_000
    reply = await decide(store, ALGORITHM, custom, 1000, at_ms=t0 + 1999)
    assert reply == [0, 0, 999, 1, t0 + 2000]
    # empty again: full 20 s from now
    reply = await decide(store, ALGORITHM, custom, 1000, at_ms=t0 + 2000)
    assert reply == [1, 0, 0, 0, t0 + 22_000]


async def test_slow_custom_rate_keeps_its_key_for_the_whole_refill(store: DecisionStore) -> None:
    """The slowest rate (a full refill per day) must not expire back to a full bucket early."""
    t0 = store.now_ms
    rate = 10_000 / 86_400
    slow = [policy(ALGORITHM, 10, 60, refill=rate)]
    await decide(store, ALGORITHM, slow, 10_000, at_ms=t0)
    full_refill_ms = math.ceil(10_000 * 1000 / rate)
    assert full_refill_ms in (DAY_MS, DAY_MS + 1)  # one day, give or take float rounding
    expires_at = await store.execute("PEXPIRETIME", slow[0].key + BUCKET)
    assert expires_at == t0 + 2 * full_refill_ms + 60_000


async def test_custom_rate_uses_the_scripts_float_order(store: DecisionStore) -> None:
    """(elapsed * rate) / 1000, in that order: find an instant where the other order differs."""
    rate = 7.1  # 7.1 scaled units per second
    elapsed_ms = 70_000
    # 70000 * 7.1 / 1000 = 497.0 exactly, but 7.1 / 1000 * 70000 = 496.99999999999994
    assert (math.floor(elapsed_ms * rate / 1000), math.floor(elapsed_ms * (rate / 1000))) == (
        497,
        496,
    )
    t0 = store.now_ms
    custom = [policy(ALGORITHM, 1, 3600, refill=rate)]
    await decide(store, ALGORITHM, custom, 1000, at_ms=t0)
    reply = await decide(store, ALGORITHM, custom, 0, apply=False, at_ms=t0 + elapsed_ms)
    assert reply[2] == 497


async def test_unsafe_custom_accrual_is_refused(store: DecisionStore) -> None:
    """Accrual beyond 2^53 without the bucket filling up: MODERATO_STATE, nothing written."""
    t0 = store.now_ms
    fast = policy(ALGORITHM, 0, 1, capacity_scaled=MAX_CAPACITY, refill=float(MAX_CAPACITY))
    other = policy(ALGORITHM, 10, 60)
    credited = model.MAX_SAFE_INTEGER - 1000
    elapsed_ms = 1_000_001  # floor(elapsed * rate / 1000) just passes 2^53, short of full
    due = math.floor(elapsed_ms * float(MAX_CAPACITY) / 1000)
    assert due > model.MAX_SAFE_INTEGER and due - credited < MAX_CAPACITY
    await store.execute(
        "HSET",
        fast.key + BUCKET,
        "tokens",
        "0",
        "base",
        str(t0 - elapsed_ms),
        "credited",
        str(credited),
    )
    await decide(store, ALGORITHM, [other], 1000, at_ms=t0)
    before = await store.dump()
    with pytest.raises(RedisReplyError, match=r"^MODERATO_STATE custom refill accrual"):
        await decide(store, ALGORITHM, [other, fast], 1000)
    assert await store.dump() == before


async def test_every_written_bucket_expires_and_a_lost_expiry_is_repaired(
    store: DecisionStore,
) -> None:
    t0 = store.now_ms
    ten_per_minute = [policy(ALGORITHM, 10, 60)]
    await decide(store, ALGORITHM, ten_per_minute, 1000, at_ms=t0 + 15_000)
    (key,) = await store.keys()
    expiry = t0 + 15_000 + 2 * MINUTE_MS + 60_000  # now + 2 * max(W, refill) + 60 s
    assert await store.execute("PEXPIRETIME", key) == expiry
    await store.execute("PERSIST", key)
    # a denial writes nothing, so it repairs nothing
    await decide(store, ALGORITHM, ten_per_minute, 10_000)
    assert await store.execute("PEXPIRETIME", key) == -1
    await decide(store, ALGORITHM, ten_per_minute, 1000)
    assert await store.execute("PEXPIRETIME", key) == expiry


async def test_state_at_the_largest_capacity_is_decimal(store: DecisionStore) -> None:
    t0 = store.now_ms
    largest = [policy(ALGORITHM, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
    key = largest[0].key + BUCKET
    await decide(store, ALGORITHM, largest, MAX_CAPACITY, at_ms=t0)
    # half a day refills exactly half of 9,007,199,254,000
    # the unit just spent is back 1 ms after the day: credit(W) - credit(W/2) = C/2 exactly
    reply = await decide(store, ALGORITHM, largest, 1, at_ms=t0 + DAY_MS // 2)
    assert reply == [1, 0, 4_503_599_626_999, 0, t0 + DAY_MS + 1]
    assert await store.execute("HGETALL", key) == [
        b"tokens",
        b"4503599626999",
        b"base",
        str(t0).encode(),
        b"credited",
        b"4503599627000",
    ]
    # one millisecond credits floor(9,007,199,254,000 / 86,400,000) = 104,249 units
    await decide(store, ALGORITHM, largest, 4_503_599_626_999)
    reply = await decide(store, ALGORITHM, largest, 0, apply=False, at_ms=t0 + DAY_MS // 2 + 1)
    assert reply == [1, 0, 104_249, 0, t0 + DAY_MS * 3 // 2]
    for value in (await store.snapshot())[key][1].values():  # type: ignore[union-attr]
        assert re.fullmatch(r"[0-9]+", value)


async def test_a_custom_refill_rate_takes_the_exact_check_and_decides(
    store: DecisionStore,
) -> None:
    t0 = store.now_ms
    reply = await store.run(ALGORITHM, ["k"], ["1000", "1", "10000", "60", "2.5E+2"])
    # 250 scaled units per second: the 1,000 this charge takes are back in 4 s.
    assert reply == [1, 0, 9000, 0, t0 + 4000]


@pytest.mark.parametrize("rate", BAD_REFILL_RATES)
async def test_bad_refill_rates_are_refused(store: DecisionStore, rate: str) -> None:
    before = await populated(store, ALGORITHM)
    with pytest.raises(RedisReplyError) as refused:
        await store.run(ALGORITHM, ["k"], ["1000", "1", "10000", "60", rate])
    assert refused.value.message.startswith(
        "MODERATO_ARG ARGV[5] (refill_scaled_per_s of policy 1)"
    )
    assert await store.dump() == before


@pytest.mark.parametrize(
    "rate", ["0.11574074074074074", "1", "1.5", "1e3", "2.5E+2", "9007199254000"]
)
async def test_good_refill_rates_are_accepted(store: DecisionStore, rate: str) -> None:
    await store.run(ALGORITHM, ["k"], ["1000", "1", "10000", "60", rate])


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
    """Hashes memory:// cannot hold (its buckets always have their three integer fields):
    on Redis alone."""
    broken = policy(ALGORITHM, 10, 60, "broken")
    key = broken.key + BUCKET
    await lua.execute("HSET", key, *(x for pair in fields.items() for x in pair))
    with pytest.raises(RedisReplyError) as refused:
        await decide(lua, ALGORITHM, [broken], 1000)
    if message.startswith("holds"):
        message = f'key "{key}" {message}'
    assert refused.value.message == "MODERATO_STATE " + message.replace("{key}", key)
