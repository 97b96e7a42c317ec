"""Both backends against the exact reference model, for every algorithm of the registry.

Hypothesis drives calls -- clock steps from 0 ms to days, costs from 0 (peeks) to
above capacity, 1 to 3 policies with small and extreme capacities and windows, and
bursts for the algorithms that take one -- through each backend (``backend``: the
shipped scripts on a real Redis with a test clock, tests/lua_harness.py, or
memory://'s store, tests/decision_stores.py) and
through tests/reference_model.py. At every step the reply is the model's, and the
backend holds exactly the model's keys, values and (absolute) expiries. The cases
are parametrized over backend x registry, so a new algorithm is covered by its
registry entry and its model alone.

Then memory:// word for word with the scripts where the model is silent: refused
arguments, refused stored states, logs read as the script reads them, reset, and
Redis's glob rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import accel_reference
import pytest
import reference_model as model
from decision_stores import DecisionStore, MemoryHarness
from differential_calls import (
    BURST_BOUNDS_S,
    assert_holds,
    expected_dump,
    load_state,
    policy_sets,
    resolve_cost,
    resolve_delta,
    run_call,
    run_model,
    run_scenario,
    same_outcome,
    scenarios,
    script_args,
    steps_for,
    stored_states,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lua_harness import DAY_MS, LuaHarness, clock_origin_ms

from moderato import _accel
from moderato.algorithms import ALGORITHMS, RESET_SUFFIXES

ALGORITHM_NAMES = tuple(ALGORITHMS)

_BOUNDED: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
# Sequences of up to 25 calls; single calls from a drawn state are cheap, so they get more.
SEQUENCES = settings(max_examples=60, **_BOUNDED)
STATES = settings(max_examples=150, **_BOUNDED)
SINGLE_CALLS = settings(max_examples=100, **_BOUNDED)


def test_every_registered_algorithm_has_a_model_and_a_store_implementation() -> None:
    assert set(ALGORITHM_NAMES) == set(model.DECIDERS)
    assert set(ALGORITHM_NAMES) <= set(_accel.MEMORY_ALGORITHMS)


# -- against the model ---------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@SEQUENCES
@given(data=st.data())
async def test_sequences_match_the_model(
    store: DecisionStore, algorithm: str, data: st.DataObject
) -> None:
    await run_scenario(store, algorithm, data.draw(scenarios(algorithm), label="scenario"))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@STATES
@given(data=st.data())
async def test_calls_from_any_state_match_the_model(
    store: DecisionStore, algorithm: str, data: st.DataObject
) -> None:
    """From a drawn state, 1-3 calls: the model's reply and state, or the model's refusal
    (MODERATO_STATE) with nothing written."""
    policies = data.draw(policy_sets(algorithm, "test"), label="policies")
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS), label="start")
    state = data.draw(stored_states(algorithm, policies, now_ms), label="state")
    await store.flush()
    await load_state(store, state)
    for number, step in enumerate(
        data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=3), label="steps")
    ):
        now_ms += resolve_delta(step, policies) if number else 0
        await store.set_clock(now_ms)
        await store.expire_due(now_ms)
        usage, _ = run_model(algorithm, state, now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3]) if isinstance(usage, list) else 1
        args = script_args(algorithm, cost_scaled, step.apply, policies)
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        before = await store.dump()
        expected, state = run_model(algorithm, state, now_ms, cost_scaled, step.apply, policies)
        reply = await run_call(store, algorithm, keys, args)
        assert same_outcome(reply, expected), (where, reply, expected)
        if isinstance(expected, str):
            assert await store.dump() == before, where
            return
        await assert_holds(store, state, now_ms, where)


# -- memory:// word for word with the scripts ----------------------------------------------


async def both(
    lua: LuaHarness, memory: MemoryHarness, name: str, keys: list[str], args: list[Any]
) -> tuple[Union[list[int], int, str], Union[list[int], int, str]]:
    return await run_call(lua, name, keys, args), await run_call(memory, name, keys, args)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@SINGLE_CALLS
@given(data=st.data())
async def test_refused_states_are_refused_word_for_word(
    lua: LuaHarness, algorithm: str, data: st.DataObject
) -> None:
    """From any drawn state, the store answers as the script does: the same reply, or the
    same refusal in the same words, with nothing written."""
    policies = data.draw(policy_sets(algorithm, "mem"), label="policies")
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS), label="start")
    state = data.draw(stored_states(algorithm, policies, now_ms), label="state")
    memory = MemoryHarness()
    await lua.flush()
    for store in (lua, memory):
        await load_state(store, state)
        await store.set_clock(now_ms)
    step = data.draw(steps_for(len(policies)), label="step")
    cost_scaled = resolve_cost(step, policies, [p.capacity_scaled for p in policies])
    args = script_args(algorithm, cost_scaled, step.apply, policies)
    before = memory.store.dump(now_ms)
    from_lua, from_store = await both(lua, memory, algorithm, keys, args)
    assert from_store == from_lua
    if isinstance(from_lua, str):
        assert from_lua.startswith("MODERATO_STATE "), from_lua
        assert memory.store.dump(now_ms) == before


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
    memory = MemoryHarness()
    await lua.flush()
    for store in (lua, memory):
        await load_state(store, state)
        await store.set_clock(now_ms)
    for step in data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=3)):
        cost_scaled = resolve_cost(step, policies, [p.capacity_scaled for p in policies])
        args = script_args("sliding_log", cost_scaled, step.apply, policies)
        before = memory.store.dump(now_ms)
        from_lua, from_store = await both(lua, memory, "sliding_log", keys, args)
        assert from_store == from_lua
        if isinstance(from_lua, str):
            assert memory.store.dump(now_ms) == before
        assert memory.store.dump(now_ms) == await redis_logs(lua, keys)


async def redis_logs(lua: LuaHarness, keys: list[str]) -> dict[bytes, tuple[Any, int]]:
    """The logs Redis holds, as MemoryStore.dump() shows them."""
    found: dict[bytes, tuple[Any, int]] = {}
    for key in (base + model.LOG_SUFFIX for base in keys):
        flat = await lua.execute("ZRANGE", key, 0, -1, "WITHSCORES")
        if flat:
            members = [(flat[i].decode(), int(flat[i + 1])) for i in range(0, len(flat), 2)]
            found[key.encode()] = (members, int(await lua.execute("PEXPIRETIME", key)))
    return found


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
        mutation = draw(
            st.sampled_from(["replace", "replace", "replace", "drop", "add", "keys", "burst"])
        )
        if mutation == "burst":
            # The burst layout, each burst at, just past or far past its refill bound (a
            # custom token refill rate beside a burst is refused too).
            bound_s = BURST_BOUNDS_S.get(algorithm, model.BUCKET_REFILL_BOUND_S)
            bursting = [
                dataclasses.replace(
                    policy,
                    burst_scaled=model.largest_burst_scaled(policy, bound_s)
                    + draw(st.sampled_from([0, 1, 2, model.MAX_CAPACITY_SCALED])),
                )
                for policy in policies
            ]
            args = script_args(algorithm, draw(st.integers(0, 5000)), True, bursting)
        elif mutation == "replace":
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
    memory = MemoryHarness()
    await memory.set_clock(lua.now_ms)
    from_lua, from_store = await both(lua, memory, algorithm, keys, args)
    assert from_store == from_lua
    if isinstance(from_lua, str):
        assert from_lua.startswith("MODERATO_ARG "), from_lua
        assert len(memory.store) == 0


SUFFIXES: list[Union[int, str]] = [
    *RESET_SUFFIXES, ":other", ":", "#", "log", ":#:", "::", ":a-b_C9", ":" + "a" * 31,
    ":" + "a" * 32, ":\u00e9", ": ", ":a.b", ":*", 5,
]  # fmt: skip


@SINGLE_CALLS
@given(data=st.data())
async def test_reset_agrees(lua: LuaHarness, data: st.DataObject) -> None:
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS))
    await lua.flush()
    memory = MemoryHarness()
    for store in (lua, memory):
        await store.set_clock(now_ms)
    state: model.State = {}
    # Some history on a few bases, by every algorithm, so every derived key exists.
    bases = [f"r:{{c}}:{window_s}" for window_s in (1, 60, 3600)]
    for algorithm in data.draw(st.lists(st.sampled_from(ALGORITHM_NAMES), max_size=6)):
        policies = [model.Policy(base, 5000, int(base.rsplit(":", 1)[1])) for base in bases]
        args = script_args(algorithm, 1000, True, policies)
        _, state = model.DECIDERS[algorithm](state, now_ms, 1000, True, policies)
        await lua.run(algorithm, bases, args)
        await memory.run(algorithm, bases, args)
    now_ms += data.draw(st.sampled_from([0, 1, 999, 1000, 59_999, 60_000, 3_600_000]))
    for store in (lua, memory):
        await store.set_clock(now_ms)
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
    from_lua, from_store = await both(lua, memory, "reset", keys, [*windows, *suffixes])
    assert from_store == from_lua
    if isinstance(from_lua, str):
        assert from_lua.startswith("MODERATO_ARG "), from_lua
    elif suffixes == list(RESET_SUFFIXES) and len(windows) == count:
        deleted, state = model.reset(state, now_ms, keys, [int(w) for w in windows])
        assert from_lua == deleted
        assert memory.store.dump(now_ms) == expected_dump(state, now_ms)


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
