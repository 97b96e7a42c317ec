"""Behaviours several algorithms share, stated once and run by each algorithm's file.

Each tests/test_<algorithm>.py subclasses the classes below that apply to its
algorithm (``class TestShared(..., EveryAlgorithm)``, EveryAlgorithm last, so
the narrower classes' defaults win), naming the algorithm and
its own expected numbers as class attributes, so a shared case runs once per
algorithm from that algorithm's file, on both backends (the ``store`` fixture:
the shipped scripts on Redis, and memory://'s store). The classes are not
named ``Test*``, so pytest collects them only through those subclasses.

Every case drives the decision at chosen instants (see lua_harness.py); the
clock starts on a day boundary, so ``t0`` is also the start of every window
that divides a day.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Union

import pytest
import reference_model as model
from decision_stores import BACKENDS, DecisionStore, holds
from lua_calls import (
    DAY_MS,
    MAX_CAPACITY,
    MINUTE_MS,
    decide,
    hash_of,
    policy,
    script_args,
    state_key,
)
from lua_harness import LuaHarness

from moderato.algorithms import RESET_SUFFIXES
from moderato.errors import RedisReplyError
from moderato.scripts import load_script

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
    ("extra arguments", ["k"], ["1000", "1", "{p}", "5", "5"], "arguments for 1 policies"),
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

# Valid spellings the scripts' cheap argument check leaves to the exact one (more digits
# than it reads with tonumber alone, leading zeros, a custom refill rate): the same
# decision and the same stored state as the plain spelling.
UNUSUAL_SPELLINGS = [
    ("leading zeros", ["0000000000001000", "1", "00000000000000010000", "0000060"]),
    ("cost of 2^53 (a permanent denial)", ["9007199254740992", "1", "10000", "60"]),
    ("16-digit peek cost", ["0000000000000000", "0", "10000", "60"]),
]

StoredValue = Union[str, dict[str, str], list[tuple[int, str]]]


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


async def populated(store: DecisionStore, algorithm: str) -> dict[str, Any]:
    """Some state under keys "k" and "j", so a write would show in the dump."""
    await store.set_clock(store.now_ms + 1000)
    good = ["1000", "1", *GOOD_POLICY[algorithm], *GOOD_POLICY[algorithm]]
    await store.run(algorithm, ["k", "j"], good)
    for key in await store.keys():
        await store.execute("PERSIST", key)  # so that a repair would show too
    return await store.dump()


def plain(args: list[str]) -> list[str]:
    return [str(int(arg)) for arg in args]


def corrupt_cases(states: Sequence[tuple[str, StoredValue]]) -> list[Any]:
    """(backend, kind, value) for every planted state each backend can hold."""
    return [
        pytest.param(backend, kind, value, id=f"{backend}-{kind}-{value}")
        for kind, value in states
        for backend in BACKENDS
        if holds(backend, value)
    ]


async def plant(store: DecisionStore, key: str, kind: str, value: StoredValue, t0: int) -> None:
    """Writes a state by hand: "{now}" and "{now_us}" stand for t0 in ms and µs; a
    sorted set's scores are relative to t0 + 1 s, except -3 (before the epoch)."""
    if kind == "string":
        assert isinstance(value, str)
        await store.execute("SET", key, value)
    elif kind == "hash":
        assert isinstance(value, dict)
        fields = [
            x
            for k, v in value.items()
            for x in (k, v.replace("{now}", str(t0)).replace("{now_us}", str(t0 * 1000)))
        ]
        await store.execute("HSET", key, *fields)
    else:
        assert isinstance(value, list)
        pairs = [x for at, m in value for x in (at if at == -3 else t0 + 1000 + at, m)]
        await store.execute("ZADD", key, *pairs)


class EveryAlgorithm:
    """What every algorithm does. Subclasses name ``algorithm`` and, for the two
    several-policy cases, the numbers their algorithm gives."""

    algorithm: ClassVar[str]
    # test_one_denying_policy_charges_none: the two policies' resets after ten
    # admissions, and the denial's (retry, reset of policy 0, reset of policy 1), from t0
    ten_admitted_resets: ClassVar[tuple[int, int]]
    denied_retry_and_resets: ClassVar[tuple[int, int, int]]
    # whether the state drains with time (a bucket, GCRA) rather than at a window's end
    drains: ClassVar[bool]
    # the planted states the algorithm refuses: (kind, value) at the broken policy's key
    corrupt_states: ClassVar[Sequence[tuple[str, StoredValue]]]

    def broken_key(self, broken: model.Policy, t0: int) -> str:
        """Where a planted state is read (the live state key by default)."""
        return state_key(self.algorithm, broken)

    async def test_cost_above_capacity_is_a_permanent_denial(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        ten_per_minute = [policy(algorithm, 10, 60)]
        reply = await decide(store, algorithm, ten_per_minute, 11_000, at_ms=store.now_ms + 5000)
        assert reply == [0, 0, 10_000, -1, -1]
        assert await store.keys() == []  # nothing written, not even a counter
        await decide(store, algorithm, ten_per_minute, 3000)
        before = await store.dump()
        reply = await decide(store, algorithm, ten_per_minute, 10_001)
        assert reply == [0, 0, 7000, -1, -1]
        assert await store.dump() == before
        # smaller requests still use the uncharged quota
        reply = await decide(store, algorithm, ten_per_minute, 7000)
        assert reply[:4] == [1, 0, 0, 0]

    async def test_largest_cost_against_largest_capacity(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
        reply = await decide(store, algorithm, largest, model.MAX_SAFE_INTEGER, at_ms=store.now_ms)
        assert reply == [0, 0, MAX_CAPACITY, -1, -1]
        reply = await decide(store, algorithm, largest, MAX_CAPACITY)
        assert reply[:4] == [1, 0, 0, 0]

    async def test_one_denying_policy_charges_none(self, store: DecisionStore) -> None:
        """10/second;1000/day: the 11th request in a second is denied and the day not charged."""
        algorithm = self.algorithm
        resets, denied = self.ten_admitted_resets, self.denied_retry_and_resets
        t0 = store.now_ms
        policies = [policy(algorithm, 10, 1), policy(algorithm, 1000, 86_400)]
        await store.set_clock(t0 + 500)
        first = await decide(store, algorithm, policies, 1000)
        assert first[:3] == [1, 0, 9000] and first[5] == 999_000  # fewest remaining decides
        for _ in range(9):
            reply = await decide(store, algorithm, policies, 1000)
        assert reply == [1, 0, 0, 0, t0 + resets[0], 990_000, 0, t0 + resets[1]]
        before = await store.dump()
        retry_ms, reset_0, reset_1 = denied
        reply = await decide(store, algorithm, policies, 1000)
        assert reply == [0, 0, 0, retry_ms, t0 + reset_0, 990_000, 0, t0 + reset_1]
        assert await store.dump() == before

    async def test_the_day_policy_denies_and_the_second_is_not_charged(
        self, store: DecisionStore
    ) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        policies = [policy(algorithm, 5, 1), policy(algorithm, 8, 86_400)]
        for _ in range(5):
            await decide(store, algorithm, policies, 1000, at_ms=t0 + 500)
        for _ in range(3):
            reply = await decide(store, algorithm, policies, 1000, at_ms=t0 + 10_500)
        assert reply[:2] == [1, 1] and reply[5] == 0  # the day, with 0 left, feeds the headers
        before = await store.dump()
        reply = await decide(store, algorithm, policies, 1000, at_ms=t0 + 20_500)
        assert reply[:5] == [0, 1, 5000, 0, reply[4]]
        # the buckets and GCRA have drained floor(20 s * 8000 / 1 day) = 1 scaled unit
        # meanwhile; a window or a log frees nothing yet
        assert reply[5] == (1 if self.drains else 0)
        assert await store.dump() == before

    @pytest.mark.parametrize("cost_scaled", [0, 1000, 6000, 6333, 7000, 20_000])
    async def test_peek_answers_like_a_charge_and_writes_nothing(
        self, store: DecisionStore, cost_scaled: int
    ) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        policies = [policy(algorithm, 10, 60), policy(algorithm, 100, 3600)]
        await decide(store, algorithm, policies, 4000, at_ms=t0 + 7000)
        for key in await store.keys():
            await store.execute("PERSIST", key)  # a peek must not even repair an expiry
        before = await store.dump()
        peeked = await decide(store, algorithm, policies, cost_scaled, apply=False, at_ms=t0 + 9000)
        assert await store.dump() == before
        if cost_scaled:
            assert await decide(store, algorithm, policies, cost_scaled) == peeked
        else:
            # A usage read: what is left, and nothing asked of it. 2 s refill or drain
            # 333 of the 4000 (ceil-wise) in the buckets and GCRA; windows and the log
            # hold all 4000.
            assert peeked[:3] == [1, 0, 6333 if self.drains else 6000]

    @pytest.mark.parametrize(
        ("what", "keys", "args", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS]
    )
    async def test_bad_arguments_are_refused_before_any_key_is_touched(
        self, store: DecisionStore, what: str, keys: list[str], args: list[str], message: str
    ) -> None:
        before = await populated(store, self.algorithm)
        with pytest.raises(RedisReplyError) as refused:
            await store.run(self.algorithm, keys, expand(self.algorithm, args))
        assert refused.value.message.startswith("MODERATO_ARG ")
        assert message in refused.value.message
        assert await store.dump() == before

    @pytest.mark.parametrize(
        ("what", "args"), UNUSUAL_SPELLINGS, ids=[spelling[0] for spelling in UNUSUAL_SPELLINGS]
    )
    async def test_unusual_valid_spellings_decide_as_the_plain_ones(
        self, store: DecisionStore, what: str, args: list[str]
    ) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        results = []
        for spelled in (plain(args), args):
            await store.flush()
            await store.set_clock(t0 + 1000)
            extra = [""] if algorithm == "token_bucket" else []
            # Some state first, so the decision reads stored values too.
            await store.run(algorithm, ["k"], ["3000", "1", "10000", "60", *extra])
            await store.set_clock(t0 + 2500)
            reply = await store.run(algorithm, ["k"], [*spelled, *extra])
            results.append((reply, await store.dump()))
        assert results[0] == results[1]

    @pytest.mark.parametrize("alone", [False, True], ids=["beside_a_healthy_policy", "alone"])
    async def test_unusable_state_is_refused_and_nothing_is_written(
        self, store: DecisionStore, kind: str, value: StoredValue, alone: bool
    ) -> None:
        """Alone, the broken policy takes the scripts' one-policy path first: same refusal."""
        algorithm = self.algorithm
        t0 = store.now_ms
        healthy, broken = policy(algorithm, 10, 60, "healthy"), policy(algorithm, 10, 60, "broken")
        await decide(store, algorithm, [healthy], 1000, at_ms=t0 + 1000)
        key = self.broken_key(broken, t0)
        await plant(store, key, kind, value, t0)
        before = await store.dump()
        with pytest.raises(RedisReplyError) as refused:
            await decide(store, algorithm, [broken] if alone else [healthy, broken], 1000)
        assert refused.value.message.startswith("MODERATO_STATE ")
        assert key in refused.value.message
        assert await store.dump() == before

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The corrupt states each backend can hold, for the refusal case above."""
        if metafunc.function.__name__ == "test_unusable_state_is_refused_and_nothing_is_written":
            metafunc.parametrize(("backend", "kind", "value"), corrupt_cases(self.corrupt_states))

    async def test_shipped_script_runs_on_redis_time(self, lua: LuaHarness) -> None:
        """The unmodified script, with Redis's own TIME."""
        algorithm = self.algorithm
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
        assert reply[4] in self.real_clock_resets(real_before_ms, real_after_ms)
        reset_args = ["60", *RESET_SUFFIXES]
        deleted = await lua.client.evalsha(
            load_script("reset"), [ten_per_minute[0].key], reset_args
        )
        assert deleted == 1

    def real_clock_resets(self, before_ms: int, after_ms: int) -> range:
        """A first unit of 10/minute taken between the two instants: when it is back
        (by default, 6 s after: one unit's share of the minute)."""
        return range(before_ms + 6000, after_ms + 6000 + 1)


class CountingAlgorithm:
    """The two windows and the token bucket: a counter of what was charged."""

    algorithm: ClassVar[str]
    # test_only_admitted_requests_are_charged at 10/minute from t0 + 15 s: the reset
    # after 8 admissions, and a denied cost 3's retry and reset, from t0
    reset_after_8: ClassVar[int]
    denied_retry_ms: ClassVar[int]
    denied_reset: ClassVar[int]
    # test_permanent_denial_decides_over_any_wait: the fitting day policy's reset, from t0
    fitting_reset: ClassVar[int]

    async def test_only_admitted_requests_are_charged(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        ten_per_minute = [policy(algorithm, 10, 60)]
        await store.set_clock(t0 + 15_000)
        for used in range(1, 9):
            reply = await decide(store, algorithm, ten_per_minute, 1000)
            assert reply[:4] == [1, 0, (10 - used) * 1000, 0]
        assert reply == [1, 0, 2000, 0, t0 + self.reset_after_8]

        before = await store.dump()
        # cost 3 with 2 remaining: denied, 2 remaining shown, nothing charged
        reply = await decide(store, algorithm, ten_per_minute, 3000)
        assert reply == [0, 0, 2000, self.denied_retry_ms, t0 + self.denied_reset]
        assert await store.dump() == before
        # ... so a cost-2 request still fits
        reply = await decide(store, algorithm, ten_per_minute, 2000)
        assert reply[:4] == [1, 0, 0, 0]
        reply = await decide(store, algorithm, ten_per_minute, 1000, apply=False)
        assert reply[:3] == [0, 0, 0]

    async def test_charges_are_stored_as_scaled_integers(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        ten_per_minute = [policy(algorithm, 10, 60)]
        await decide(store, algorithm, ten_per_minute, 8000, at_ms=t0 + 15_000)
        await decide(store, algorithm, ten_per_minute, 3000)  # denied
        assert await store.snapshot() == self.stored_after_8_of_10(ten_per_minute[0].key, t0)

    def stored_after_8_of_10(self, key: str, t0: int) -> dict[str, Any]:
        """The snapshot after 8 of 10/minute charged at t0 + 15 s."""
        raise NotImplementedError

    async def test_permanent_denial_decides_over_any_wait(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        per_second_and_day = [policy(algorithm, 10, 1), policy(algorithm, 1000, 86_400)]
        reply = await decide(store, algorithm, per_second_and_day, 11_000, at_ms=t0 + 500)
        assert reply == [0, 0, 10_000, -1, -1, 1_000_000, 0, t0 + self.fitting_reset]
        per_second_and_small_day = [policy(algorithm, 100, 1), policy(algorithm, 50, 86_400)]
        reply = await decide(store, algorithm, per_second_and_small_day, 60_000)
        assert reply[:2] == [0, 1] and reply[5:] == [50_000, -1, -1]
        assert await store.keys() == []


class WindowCounter:
    """Fixed and sliding window: a counter per window, expiring after it is read."""

    algorithm: ClassVar[str]
    expiry_after_t0: ClassVar[int]  # of the counter of the window that starts at t0

    def real_clock_resets(self, before_ms: int, after_ms: int) -> set[int]:
        return {(t // MINUTE_MS + 1) * MINUTE_MS for t in (before_ms, after_ms)}

    @pytest.mark.parametrize("policies", [1, 2], ids=["one_policy_path", "general_path"])
    async def test_a_window_counter_gets_its_expiry_when_created_and_keeps_it(
        self, store: DecisionStore, policies: int
    ) -> None:
        """The expiry is set by the admission that finds the counter at 0 and kept by later
        ones; a counter that lost it (by hand: nothing moderato runs does that) keeps none."""
        algorithm = self.algorithm
        t0 = store.now_ms
        chosen = [policy(algorithm, 10, 60), policy(algorithm, 100, 3600)][:policies]
        await decide(store, algorithm, chosen, 1000, at_ms=t0 + 15_000)
        key = f"{chosen[0].key}:{t0 // MINUTE_MS}"
        assert await store.execute("PEXPIRETIME", key) == t0 + self.expiry_after_t0
        await decide(store, algorithm, chosen, 1000, at_ms=t0 + 16_000)
        assert await store.execute("PEXPIRETIME", key) == t0 + self.expiry_after_t0
        await store.execute("PERSIST", key)
        await decide(store, algorithm, chosen, 1000, at_ms=t0 + 17_000)
        assert await store.execute("GET", key) == b"3000"
        assert await store.execute("PEXPIRETIME", key) == -1
        # one found at 0 counts as created
        await store.execute("SET", key, "0")
        await decide(store, algorithm, chosen, 1000, at_ms=t0 + 18_000)
        assert await store.execute("PEXPIRETIME", key) == t0 + self.expiry_after_t0

    async def test_counters_at_the_largest_capacity_are_decimal(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
        t0 = store.now_ms
        reply = await decide(store, algorithm, largest, MAX_CAPACITY - 1, at_ms=t0)
        assert reply[:4] == [1, 0, 1, 0]
        reply = await decide(store, algorithm, largest, 1)
        assert reply[:4] == [1, 0, 0, 0]
        ((_, value, _),) = (await store.snapshot()).values()
        assert value == "9007199254000"
        if algorithm == "sliding_window":
            # a day later, half way through: floor(9,007,199,254,000 * 500 / 1000) still counts
            at_ms = t0 + DAY_MS * 3 // 2
            reply = await decide(store, algorithm, largest, 0, apply=False, at_ms=at_ms)
            assert reply == [1, 0, 4_503_599_627_000, 0, t0 + 2 * DAY_MS]

    @pytest.mark.parametrize("stored", ["-5", "-1000", "9007199254740993", "9223372036854775807"])
    async def test_window_single_policy_refuses_what_incrby_would_take_or_not(
        self, store: DecisionStore, stored: str
    ) -> None:
        """The one-policy path charges the current counter with INCRBY first: a counter
        INCRBY takes but the script must not (negative, beyond 2^53) or cannot take (an
        overflow) is refused exactly as the general path refuses it, and left as it was."""
        algorithm = self.algorithm
        t0 = store.now_ms
        broken = policy(algorithm, 10, 60, "broken")
        key = f"{broken.key}:{t0 // MINUTE_MS}"
        await store.execute("SET", key, stored)
        before = await store.dump()
        with pytest.raises(RedisReplyError) as refused:
            await decide(store, algorithm, [broken], 1000)
        assert refused.value.message == (
            f'MODERATO_STATE key "{key}" holds "{stored}", not a decimal integer '
            "0..9007199254740992"
        )
        assert await store.dump() == before


class ExactRetryHint:
    """GCRA, the sliding log and the leaky bucket: a denial's retry is exact."""

    algorithm: ClassVar[str]

    @pytest.mark.parametrize(
        ("pattern", "cost_scaled"),
        [([1000] * 10, 1000), ([3000, 3000, 4000], 2500), ([700] * 14, 9000), ([9999], 10_000)],
    )
    async def test_retry_hint_is_exact(
        self, store: DecisionStore, pattern: list[int], cost_scaled: int
    ) -> None:
        """With no other traffic: refused 1 ms before the hint, admitted at it."""
        algorithm = self.algorithm
        t0 = store.now_ms + 1234
        ten_per_7s = [policy(algorithm, 10, 7)]
        for step, charge in enumerate(pattern):
            await decide(store, algorithm, ten_per_7s, charge, at_ms=t0 + 33 * step)
        now = store.now_ms + 1
        reply = await decide(store, algorithm, ten_per_7s, cost_scaled, at_ms=now)
        assert reply[0] == 0 and reply[3] > 0
        before = await decide(
            store, algorithm, ten_per_7s, cost_scaled, apply=False, at_ms=now + reply[3] - 1
        )
        at = await decide(
            store, algorithm, ten_per_7s, cost_scaled, apply=False, at_ms=now + reply[3]
        )
        assert (before[0], at[0]) == (0, 1)
        assert before[3:5] == [1, now + reply[3]] and reply[4] == now + reply[3]


class DrainedRate:
    """GCRA and the leaky bucket: one rate law, drained with time."""

    algorithm: ClassVar[str]

    def largest_state_after_half_a_day(self, t0: int) -> dict[str, str]:
        """The stored fields once a unit is taken half a day after a full capacity."""
        raise NotImplementedError

    async def test_largest_capacity_state_is_decimal(self, store: DecisionStore) -> None:
        algorithm = self.algorithm
        t0 = store.now_ms
        largest = [policy(algorithm, 0, 86_400, capacity_scaled=MAX_CAPACITY)]
        key = state_key(algorithm, largest[0])
        await decide(store, algorithm, largest, MAX_CAPACITY - 1, at_ms=t0)
        reply = await decide(store, algorithm, largest, 1)
        assert reply[:4] == [1, 0, 0, 0]
        # half a day drains exactly half of 9,007,199,254,000
        reply = await decide(store, algorithm, largest, 0, apply=False, at_ms=t0 + DAY_MS // 2)
        assert reply == [1, 0, 4_503_599_627_000, 0, t0 + DAY_MS]
        # a scaled unit moves the TAT by 86.4e9 / 9,007,199,254,000 µs: up to the next ms
        reply = await decide(store, algorithm, largest, 1)
        assert reply == [1, 0, 4_503_599_626_999, 0, t0 + DAY_MS + 1]
        assert await hash_of(store, key) == self.largest_state_after_half_a_day(t0)

    async def test_every_written_key_expires_and_a_lost_expiry_is_repaired(
        self, store: DecisionStore
    ) -> None:
        # 1 unit of 10/minute drains in 6 s; the key expires 1 s after it would read empty
        # (the sliding log repairs it once per second of its stamps:
        # test_sliding_log.py's test_trims_and_sets_its_expiry_once_per_second)
        first_expiry, second_expiry = 15_000 + 6000 + 1000, 15_000 + 12_000 + 1000
        algorithm = self.algorithm
        t0 = store.now_ms
        ten_per_minute = [policy(algorithm, 10, 60)]
        await decide(store, algorithm, ten_per_minute, 1000, at_ms=t0 + 15_000)
        (key,) = await store.keys()
        assert key == state_key(algorithm, ten_per_minute[0])
        assert await store.execute("PEXPIRETIME", key) == t0 + first_expiry
        await store.execute("PERSIST", key)
        await decide(store, algorithm, ten_per_minute, 10_000)  # a denial repairs nothing
        assert await store.execute("PEXPIRETIME", key) == -1
        await decide(store, algorithm, ten_per_minute, 1000)
        assert await store.execute("PEXPIRETIME", key) == t0 + second_expiry
