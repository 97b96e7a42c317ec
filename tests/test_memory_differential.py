"""memory:// against the Lua scripts and the exact reference model.

Hypothesis drives the same calls -- clock steps from 0 ms to days, costs from 0
(peeks) to above capacity, 1 to 3 policies with small and extreme capacities
and windows -- at the same instants through (a) the shipped scripts on a real
Redis with a test clock (tests/lua_harness.py), (b) ``MemoryStore.decide`` and
(c) tests/reference_model.py. At every step the three replies are equal, and
the store holds exactly the model's keys, values and expiries. Every algorithm
of the registry is covered; so are refusals (the scripts' exact messages),
stored states no history produces, reset, and Redis's glob rules.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Union

import accel_reference
import pytest
import pytest_asyncio
import reference_model as model
from differential_calls import policy_sets, resolve_cost, resolve_delta, steps_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lua_harness import DAY_MS, LuaHarness, clock_origin_ms, open_harness
from redis_servers import RedisServer

from moderato import _accel
from moderato.algorithms import ALGORITHMS, RESET_SUFFIXES
from moderato.errors import RedisReplyError

ALGORITHM_NAMES = tuple(ALGORITHMS)

_BOUNDED: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
SEQUENCES = settings(max_examples=60, **_BOUNDED)
SINGLE_CALLS = settings(max_examples=100, **_BOUNDED)

StoreValue = Union[int, dict[str, int], list[tuple[str, int]]]


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def test_every_registered_algorithm_has_a_memory_implementation() -> None:
    assert set(ALGORITHM_NAMES) == set(model.DECIDERS)
    assert set(ALGORITHM_NAMES) <= set(_accel.MEMORY_ALGORITHMS)


# -- states in the three representations -------------------------------------------------


def store_value(value: model.Value) -> StoreValue:
    if isinstance(value, model.SortedSet):
        return [(member, score) for score, member in value.ordered()]
    return value


def expected_dump(state: model.State, now_ms: int) -> dict[bytes, tuple[StoreValue, int]]:
    """What MemoryStore.dump(now_ms) must show for a model state."""
    return {
        key.encode(): (
            store_value(entry.value),
            -1 if entry.expire_at_ms is None else entry.expire_at_ms,
        )
        for key, entry in model.expire(state, now_ms).items()
    }


def load_store(store: _accel.MemoryStore, state: model.State) -> None:
    for key, entry in state.items():
        expiry = -1 if entry.expire_at_ms is None else entry.expire_at_ms
        store.load(key, store_value(entry.value), expiry)  # type: ignore[arg-type]


async def load_redis(lua: LuaHarness, state: model.State) -> None:
    plain = {k: e for k, e in state.items() if not isinstance(e.value, model.SortedSet)}
    await lua.load_state(plain)
    for key, entry in state.items():
        if isinstance(entry.value, model.SortedSet):
            pairs: list[Union[str, int]] = []
            for member, score in entry.value.scores.items():
                pairs += [score, member]
            await lua.execute("ZADD", key, *pairs)
            if entry.expire_at_ms is not None:
                await lua.execute("PEXPIREAT", key, entry.expire_at_ms)


# -- calls ---------------------------------------------------------------------------------


def script_args(
    algorithm: str, cost_scaled: int, apply: bool, policies: Sequence[model.Policy]
) -> list[Union[int, str]]:
    # Ints and strs, as the limiter sends them (and the Redis client encodes them).
    args: list[Union[int, str]] = [cost_scaled, 1 if apply else 0]
    for policy in policies:
        args += [policy.capacity_scaled, policy.window_s]
        if algorithm == "token_bucket":
            rate = policy.refill_scaled_per_s
            args.append("" if rate is None else repr(rate))
    return args


async def run_lua(
    lua: LuaHarness, algorithm: str, keys: list[str], args: Sequence[Union[int, str]]
) -> Union[list[int], str]:
    """The script's reply, or its error message."""
    try:
        reply: list[int] = await lua.run(algorithm, keys, args)
    except RedisReplyError as error:
        return error.message
    return reply


def run_store(
    store: _accel.MemoryStore,
    algorithm: str,
    keys: list[str],
    args: Sequence[Union[int, str]],
    now_ms: int,
) -> Union[list[int], str]:
    try:
        return store.decide(algorithm, [key.encode() for key in keys], args, now_ms)
    except ValueError as error:
        return str(error)


def run_model(
    algorithm: str,
    state: model.State,
    now_ms: int,
    cost_scaled: int,
    apply: bool,
    policies: Sequence[model.Policy],
) -> tuple[Union[list[int], str], model.State]:
    try:
        return model.DECIDERS[algorithm](state, now_ms, cost_scaled, apply, policies)
    except model.ModelStateError:
        return "MODERATO_STATE", state


def same_outcome(reply: Union[list[int], str], expected: Union[list[int], str]) -> bool:
    if isinstance(expected, str):  # the model raises; its message is its own
        return isinstance(reply, str) and reply.startswith(expected + " ")
    return reply == expected


# -- sequences from an empty store -----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@SEQUENCES
@given(data=st.data())
async def test_sequences_agree(lua: LuaHarness, algorithm: str, data: st.DataObject) -> None:
    policies = data.draw(policy_sets(algorithm, "mem"), label="policies")
    steps = data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=25), label="steps")
    start = data.draw(st.one_of(st.integers(0, 2 * DAY_MS), st.sampled_from([0, 999])))
    await lua.flush()
    store = _accel.MemoryStore(1_000_000)
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + start
    state: model.State = {}
    for number, step in enumerate(steps):
        now_ms += resolve_delta(step, policies)
        await lua.set_clock(now_ms)
        await lua.expire_due(now_ms)
        usage, _ = model.DECIDERS[algorithm](state, now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3])
        args = script_args(algorithm, cost_scaled, step.apply, policies)
        expected, state = run_model(algorithm, state, now_ms, cost_scaled, step.apply, policies)
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        assert await run_lua(lua, algorithm, keys, args) == expected, where
        assert run_store(store, algorithm, keys, args, now_ms) == expected, where
        assert store.dump(now_ms) == expected_dump(state, now_ms), where


# -- single calls from any state the scripts accept -------------------------------------------


@st.composite
def stored_states(
    draw: st.DrawFn,
    algorithm: str,
    policies: Sequence[model.Policy],
    now_ms: int,
    anywhere: bool = False,
) -> model.State:
    """States no history produces too: counters above a lowered capacity, buckets of another
    capacity or rate, bases ahead of the clock, arrival times far off, odd logs, lost expiries."""
    state: model.State = {}
    expiry = st.one_of(st.none(), st.integers(now_ms, now_ms + 3 * DAY_MS))
    for policy in policies:
        capacity, window_ms = policy.capacity_scaled, policy.window_ms
        amounts = st.one_of(
            st.integers(0, capacity),
            st.sampled_from([0, capacity]),
            st.integers(0, model.MAX_SAFE_INTEGER),
            st.sampled_from([-1, model.MAX_SAFE_INTEGER + 1]),
        )
        if draw(st.integers(0, 4)) == 0:
            continue  # nothing stored yet
        key: str
        value: model.Value
        if algorithm in ("fixed_window", "sliding_window"):
            index = now_ms // window_ms
            for window_index in (index, index - 1):
                if draw(st.booleans()):
                    state[f"{policy.key}:{window_index}"] = model.Entry(draw(amounts), draw(expiry))
            continue
        if algorithm in ("token_bucket", "leaky_bucket"):
            elapsed_ms = draw(
                st.one_of(
                    st.integers(0, 2 * window_ms),
                    st.integers(-5000, -1),
                    st.integers(0, 3 * DAY_MS),
                )
            )
            written_ms = draw(st.integers(0, max(0, min(elapsed_ms, window_ms - 1))))
            if policy.refill_scaled_per_s is None:
                consistent = written_ms * capacity // window_ms
            else:
                consistent = int(float(written_ms) * policy.refill_scaled_per_s / 1000.0)
            # Branches are chosen with plain draws: one_of() over strategies that may be
            # equal (hypothesis caches and merges them) makes generation depend on that cache.
            accrued = consistent if draw(st.integers(0, 2)) else draw(amounts)
            amount = draw(amounts) if draw(st.booleans()) else draw(st.integers(0, capacity))
            base = draw(amounts) if draw(st.booleans()) else max(0, now_ms - elapsed_ms)
            if algorithm == "token_bucket":
                key = policy.key + model.BUCKET_SUFFIX
                value = {"tokens": amount, "base": base, "credited": accrued}
            else:
                key = policy.key + model.LEAKY_SUFFIX
                value = {"level": amount, "base": base, "drained": accrued}
        elif algorithm == "gcra":
            now_us, window_us = now_ms * 1000, window_ms * 1000
            tat = draw(
                st.one_of(
                    st.integers(now_us - window_us, now_us + window_us),
                    st.integers(now_us + window_us - 2, now_us + window_us + 2),
                    st.integers(now_us - 3 * DAY_MS * 1000, now_us + 3 * DAY_MS * 1000),
                    st.sampled_from([0, now_us, model.MAX_SAFE_INTEGER, -1]),
                )
            )
            frac = draw(
                st.one_of(
                    st.integers(0, capacity - 1),
                    st.sampled_from([0, capacity - 1, capacity]),
                    st.integers(capacity, model.MAX_SAFE_INTEGER + 1),
                )
            )
            key, value = policy.key + model.GCRA_SUFFIX, {"tat": tat, "frac": frac}
        else:
            key, value = policy.key + model.LOG_SUFFIX, draw(log_sets(policy, now_ms, anywhere))
        state[key] = model.Entry(value, draw(expiry))
    return state


@st.composite
def log_sets(
    draw: st.DrawFn, policy: model.Policy, now_ms: int, anywhere: bool = False
) -> model.SortedSet:
    """A log around the window, entries ahead of the clock, totals near 2^53; sometimes
    with a member the scripts cannot read: the newest (where the model reads members as
    the script does), or, with anywhere, at any instant."""
    window_ms, capacity = policy.window_ms, policy.capacity_scaled
    instants = sorted(
        draw(
            st.lists(
                st.one_of(
                    st.integers(now_ms - 2 * window_ms, now_ms),
                    st.sampled_from([now_ms - window_ms, now_ms - window_ms + 1, now_ms]),
                    st.integers(now_ms + 1, now_ms + 5000),
                ),
                min_size=1,
                max_size=8,
            )
        )
    )
    costs = [draw(st.integers(1, max(1, capacity // 3))) for _ in instants]
    near_limit = model.MAX_SAFE_INTEGER - sum(costs) - draw(st.integers(0, 2 * capacity))
    total = draw(st.one_of(st.just(0), st.integers(0, 10**12), st.just(max(0, near_limit))))
    gaps = st.integers(0, 2 * capacity) if anywhere else st.just(0)
    scores: dict[str, int] = {}
    for at_ms, cost in zip(instants, costs):
        total += cost + draw(gaps)  # with a gap, the running totals do not chain
        scores[model.log_member(min(total, model.MAX_SAFE_INTEGER), cost)] = at_ms
    if draw(st.integers(0, 4)) == 0:
        bad = draw(st.sampled_from(["12:5", "x", "0000000000000005:6", "0000000000000005:0"]))
        newest = max(scores.values()) + 1
        scores[bad] = (
            draw(st.sampled_from(sorted({newest, *scores.values()}))) if anywhere else newest
        )
    return model.SortedSet(scores)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@SINGLE_CALLS
@given(data=st.data())
async def test_calls_from_any_state_agree(
    lua: LuaHarness, algorithm: str, data: st.DataObject
) -> None:
    policies = data.draw(policy_sets(algorithm, "mem"), label="policies")
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS), label="start")
    state = data.draw(stored_states(algorithm, policies, now_ms), label="state")
    await lua.flush()
    await load_redis(lua, state)
    store = _accel.MemoryStore(1_000_000)
    load_store(store, state)
    for number, step in enumerate(
        data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=3), label="steps")
    ):
        now_ms += resolve_delta(step, policies) if number else 0
        await lua.set_clock(now_ms)
        await lua.expire_due(now_ms)
        usage, _ = run_model(algorithm, state, now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3]) if isinstance(usage, list) else 1
        args = script_args(algorithm, cost_scaled, step.apply, policies)
        before = store.dump(now_ms)
        expected, state = run_model(algorithm, state, now_ms, cost_scaled, step.apply, policies)
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        from_lua = await run_lua(lua, algorithm, keys, args)
        from_store = run_store(store, algorithm, keys, args, now_ms)
        assert same_outcome(from_lua, expected), (where, from_lua, expected)
        assert same_outcome(from_store, expected), (where, from_store, expected)
        if isinstance(expected, str):
            # The same refusal, word for word, and nothing written.
            assert from_store == from_lua, where
            assert store.dump(now_ms) == before, where
            return
        assert store.dump(now_ms) == expected_dump(state, now_ms), where


@SINGLE_CALLS
@given(data=st.data())
async def test_logs_are_read_as_the_script_reads_them(lua: LuaHarness, data: st.DataObject) -> None:
    """A member the script cannot read is refused only when the script reads it (the
    newest, the first in the window, the ranks its bisection visits, or every member of
    the window when renumbering). The reference model checks every member of the window,
    so here the store is held against the script alone."""
    policies = data.draw(policy_sets("sliding_log", "mem"), label="policies")
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS), label="start")
    state = data.draw(stored_states("sliding_log", policies, now_ms, True), label="state")
    await lua.flush()
    await load_redis(lua, state)
    await lua.set_clock(now_ms)
    store = _accel.MemoryStore(1_000_000)
    load_store(store, state)
    for step in data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=3)):
        cost_scaled = resolve_cost(step, policies, [p.capacity_scaled for p in policies])
        args = script_args("sliding_log", cost_scaled, step.apply, policies)
        before = store.dump(now_ms)
        from_lua = await run_lua(lua, "sliding_log", keys, args)
        assert run_store(store, "sliding_log", keys, args, now_ms) == from_lua
        if isinstance(from_lua, str):
            assert store.dump(now_ms) == before
        assert store.dump(now_ms) == await redis_logs(lua, keys)


async def redis_logs(lua: LuaHarness, keys: list[str]) -> dict[bytes, tuple[StoreValue, int]]:
    """The logs Redis holds, as MemoryStore.dump() shows them."""
    found: dict[bytes, tuple[StoreValue, int]] = {}
    for key in (base + model.LOG_SUFFIX for base in keys):
        flat = await lua.execute("ZRANGE", key, 0, -1, "WITHSCORES")
        if flat:
            members = [(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]
            found[key.encode()] = (members, int(await lua.execute("PEXPIRETIME", key)))
    return found


# -- refusals: the scripts' messages, word for word ------------------------------------------

JUNK: list[Union[int, str]] = [
    "", "-1", "0", "1", "01", "1.5", "abc", " 1", "1 ", "+1", "0x10", "1e3", "1E2", "5.",
    "5.e3", ".5", "1e", "1e+", "1e400", "1e-400", "nan", "inf", "9007199254740992",
    "9007199254740993", "00000000000000000009007199254740992", "9007199254000",
    "9007199254001", "86400", "86401", "94907", "3599627", "3599628", "311040000",
    "311040001", "\x00", "\u0661", "\uff11", "é" * 30, "7" * 60,
    -5, 0, 1, 2, 86_401, 3_599_628, 311_040_001, 2**53 + 1, 2**70,
]  # fmt: skip


@st.composite
def bad_calls(draw: st.DrawFn, algorithm: str) -> tuple[list[str], list[Union[int, str]]]:
    policies = draw(policy_sets(algorithm, "mem"))
    keys = [policy.key for policy in policies]
    args = script_args(algorithm, draw(st.integers(0, 5000)), draw(st.booleans()), policies)
    for _ in range(draw(st.integers(1, 2))):
        mutation = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add", "keys"]))
        if mutation == "replace":
            args[draw(st.integers(0, len(args) - 1))] = draw(st.sampled_from(JUNK))
        elif mutation == "drop" and len(args) > 1:
            del args[draw(st.integers(0, len(args) - 1))]
        elif mutation == "add":
            args.append(draw(st.sampled_from(JUNK)))
        else:
            keys = draw(
                st.sampled_from([[], keys + keys[:1], [f"k{i}" for i in range(17)], keys[:1] * 2])
            )
    return keys, args


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@SINGLE_CALLS
@given(data=st.data())
async def test_refusals_are_word_for_word(
    lua: LuaHarness, algorithm: str, data: st.DataObject
) -> None:
    keys, args = data.draw(bad_calls(algorithm), label="call")
    await lua.flush()
    store = _accel.MemoryStore(1000)
    from_lua = await run_lua(lua, algorithm, keys, args)
    from_store = run_store(store, algorithm, keys, args, lua.now_ms)
    assert from_store == from_lua
    if isinstance(from_lua, str):
        assert from_lua.startswith("MODERATO_ARG "), from_lua
        assert len(store) == 0


# -- reset ----------------------------------------------------------------------------------------

SUFFIXES: list[Union[int, str]] = [
    *RESET_SUFFIXES, ":other", ":", "#", "log", ":#:", "::", ":a-b_C9", ":" + "a" * 31,
    ":" + "a" * 32, ":\u00e9", ": ", ":a.b", ":*", 5,
]  # fmt: skip


@SINGLE_CALLS
@given(data=st.data())
async def test_reset_agrees(lua: LuaHarness, data: st.DataObject) -> None:
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS))
    await lua.flush()
    await lua.set_clock(now_ms)
    store = _accel.MemoryStore(100_000)
    state: model.State = {}
    # Some history on a few bases, by every algorithm, so every derived key exists.
    bases = [f"r:{{c}}:{window_s}" for window_s in (1, 60, 3600)]
    for algorithm in data.draw(st.lists(st.sampled_from(ALGORITHM_NAMES), max_size=6)):
        policies = [model.Policy(base, 5000, int(base.rsplit(":", 1)[1])) for base in bases]
        args = script_args(algorithm, 1000, True, policies)
        _, state = model.DECIDERS[algorithm](state, now_ms, 1000, True, policies)
        await lua.run(algorithm, bases, args)
        store.decide(algorithm, [b.encode() for b in bases], args, now_ms)
    now_ms += data.draw(st.sampled_from([0, 1, 999, 1000, 59_999, 60_000, 3_600_000]))
    await lua.set_clock(now_ms)
    await lua.expire_due(now_ms)
    count = data.draw(st.integers(1, 4))
    keys = data.draw(
        st.lists(st.sampled_from([*bases, "r:{c}:other"]), min_size=count, max_size=count)
    )
    windows: list[Union[int, str]] = data.draw(
        st.lists(st.one_of(st.sampled_from([1, 60, 3600, "060"]), st.sampled_from(JUNK)),
                 min_size=count, max_size=count + data.draw(st.integers(0, 1)))
    )  # fmt: skip
    # The registry's suffixes, as both backends pass them, or others, good and bad.
    suffixes: list[Union[int, str]] = data.draw(
        st.one_of(st.just(list(RESET_SUFFIXES)), st.lists(st.sampled_from(SUFFIXES), max_size=3))
    )
    # A surplus window is read as the first state suffix, by both.
    args = [*windows, *suffixes]
    try:
        from_lua: Union[int, str] = await lua.run("reset", keys, args)
    except RedisReplyError as error:
        from_lua = error.message
    try:
        from_store: Union[int, str] = store.reset([k.encode() for k in keys], args, now_ms)
    except ValueError as error:
        from_store = str(error)
    assert from_store == from_lua
    if isinstance(from_lua, str):
        assert from_lua.startswith("MODERATO_ARG "), from_lua
    elif suffixes == list(RESET_SUFFIXES) and len(windows) == count:
        deleted, state = model.reset(state, now_ms, keys, [int(w) for w in windows])
        assert from_lua == deleted
        assert store.dump(now_ms) == expected_dump(state, now_ms)


# -- glob patterns, against Redis's KEYS ---------------------------------------------------

KEY_ALPHABET = "ab:{}*?[]^-\\x"
glob_items = st.one_of(
    st.sampled_from(list("ab:{}x-^")),
    st.sampled_from(["?", "*", "**", "\\*", "\\?", "\\[", "\\\\", "\\a", "\\"]),
    st.builds(
        lambda negate, members: "[" + ("^" if negate else "") + "".join(members) + "]",
        st.booleans(),
        st.lists(
            st.one_of(
                st.sampled_from(list("ab:{}x*?^[")),
                st.sampled_from(["a-b", "b-a", "-", "\\]", "\\-", "a-"]),
            ),
            max_size=3,
        ),
    ),
    st.sampled_from(["[", "[^", "[a", "[a-"]),  # unterminated sets run to the end
)


@settings(max_examples=400, **_BOUNDED)
@given(
    keys=st.sets(st.text(KEY_ALPHABET, min_size=0, max_size=6), min_size=1, max_size=16),
    pattern=st.lists(glob_items, max_size=5).map("".join),
)
async def test_delete_matching_follows_redis_glob(
    lua: LuaHarness, keys: set[str], pattern: str
) -> None:
    await lua.flush()
    store = _accel.MemoryStore(100)
    for key in keys:
        await lua.execute("SET", key, "1")
        store.load(key, 1, -1)
    matched = {k.decode() for k in await lua.execute("KEYS", pattern)} - {"moderato-test:clock"}
    assert store.delete_matching(pattern) == len(matched), sorted(matched)
    assert {k.decode() for k in store.dump(0)} == keys - matched


# Patterns that pin a tenant and an identity ("...{<tenant>:...:<identity>}...", as reset
# builds them) are answered from the store's identity index and its unindexed list; keys
# of every shape, braces and colons anywhere, must still go exactly as KEYS finds them.
TAG_BYTES = st.sampled_from(["a", "b", ":", "{", "}", "", "*"])
pinned_patterns = st.builds(
    lambda head, tenant, middle, identity, tail: f"{head}{{{tenant}:{middle}:{identity}}}{tail}",
    st.sampled_from(["p:??:", "p:fw:", "*", "p*", "?:", ""]),
    st.sampled_from(["", "a", "b"]),
    st.sampled_from(["*", "a", "?", "*:*", "a:b", ""]),
    st.sampled_from(["", "a", "b"]),
    st.sampled_from([":*", "", "*", ":60", "?"]),
)
shaped_keys = st.builds(
    lambda head, tenant, scope, identity, tail: f"{head}{{{tenant}:{scope}:{identity}}}{tail}",
    st.sampled_from(["p:fw:", "p:tb:", "p:{:", "p}:", "q:fw:", ""]),
    TAG_BYTES, TAG_BYTES, TAG_BYTES,
    st.sampled_from(["", ":60", ":60:1", "}", "{"]),
)  # fmt: skip


@settings(max_examples=300, **_BOUNDED)
@given(
    keys=st.sets(st.one_of(shaped_keys, st.text(KEY_ALPHABET, min_size=1, max_size=8)),
                 min_size=1, max_size=24),
    pattern=pinned_patterns,
)  # fmt: skip
async def test_identity_patterns_follow_redis_glob(
    lua: LuaHarness, keys: set[str], pattern: str
) -> None:
    await lua.flush()
    store = _accel.MemoryStore(100)
    for key in keys:
        await lua.execute("SET", key, "1")
        store.load(key, 1, -1)
    matched = {k.decode() for k in await lua.execute("KEYS", pattern)} - {"moderato-test:clock"}
    assert store.delete_matching(pattern) == len(matched), sorted(matched)
    assert {k.decode() for k in store.dump(0)} == keys - matched
    left = [k.encode() for k in keys - matched]
    unindexed = [k for k in left if accel_reference.store_key_identity(k) is None]
    assert store.table_stats()["unindexed"] == len(unindexed)


# -- the sweep never changes a decision ------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_sweeping_changes_no_decision(algorithm: str, data: st.DataObject) -> None:
    policies = data.draw(policy_sets(algorithm, "mem"), label="policies")
    keys = [policy.key.encode() for policy in policies]
    swept, unswept = _accel.MemoryStore(1_000_000), _accel.MemoryStore(1_000_000)
    now_ms = clock_origin_ms()
    state: model.State = {}
    for step in data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=25)):
        now_ms += resolve_delta(step, policies)
        usage = unswept.decide(algorithm, keys, script_args(algorithm, 0, False, policies), now_ms)
        cost_scaled = resolve_cost(step, policies, usage[2::3])
        args = script_args(algorithm, cost_scaled, step.apply, policies)
        swept.sweep(now_ms)
        assert swept.decide(algorithm, keys, args, now_ms) == unswept.decide(
            algorithm, keys, args, now_ms
        )
        _, state = model.DECIDERS[algorithm](state, now_ms, cost_scaled, step.apply, policies)
    # What the sweep dropped had expired, or was a full token bucket (absent-equivalent).
    assert len(swept) <= len(unswept)
