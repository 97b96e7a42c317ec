"""The Lua scripts against the exact reference model, on generated call sequences.

Each example runs a sequence of calls -- clock steps from 0 ms to several days,
costs from 0 (peeks) to above capacity, 1 to 3 policies with small and extreme
capacities and windows -- through the shipped scripts (clocked copies) on a
real Redis and through tests/reference_model.py. At every step the reply and
the whole stored state (values as stored, and absolute expiries) must be equal.

The new algorithms' models are also checked against each other: GCRA (exact
rational arrival times), the leaky bucket and the public token bucket are one
rate law stored three ways, so their replies agree call for call.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Callable, Union

import pytest
import pytest_asyncio
import reference_model as model
from differential_calls import (
    Step,
    capacities_scaled,
    policy_sets,
    refill_rates,
    resolve_cost,
    resolve_delta,
    steps_for,
    windows_s,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lua_harness import (
    DAY_MS,
    LuaHarness,
    Snapshot,
    clock_origin_ms,
    model_snapshot,
    open_harness,
)
from redis_servers import RedisServer

from moderato.errors import RedisReplyError

_BOUNDED = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
# Sequences of up to 25 calls; single calls from a drawn state are cheap, so they get more.
EXAMPLES = settings(max_examples=60, **_BOUNDED)  # type: ignore[arg-type]
STATE_EXAMPLES = settings(max_examples=150, **_BOUNDED)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


async def snapshot(lua: LuaHarness) -> Snapshot:
    """Like lua.snapshot(), with sorted sets too: {member: score as Redis prints it}."""
    keys = await lua.keys()
    if not keys:
        return {}
    kinds = [_text(kind) for kind in await lua.client.execute_many([("TYPE", k) for k in keys])]
    reads = {"string": ("GET",), "hash": ("HGETALL",), "zset": ("ZRANGE", 0, -1, "WITHSCORES")}
    commands: list[tuple[Union[str, int], ...]] = []
    for key, kind in zip(keys, kinds):
        assert kind in reads, f"unexpected {kind} key {key!r}"
        command, *rest = reads[kind]
        commands += [(command, key, *rest), ("PEXPIRETIME", key)]
    replies = await lua.client.execute_many(commands)
    found: Snapshot = {}
    for i, (key, kind) in enumerate(zip(keys, kinds)):
        raw, expire_at = replies[2 * i], replies[2 * i + 1]
        value: Union[str, dict[str, str]]
        if isinstance(raw, list):
            value = {_text(raw[j]): _text(raw[j + 1]) for j in range(0, len(raw), 2)}
        else:
            value = _text(raw)
        found[key] = (kind, value, int(expire_at))
    return found


def expected_snapshot(state: model.State) -> Snapshot:
    """model_snapshot(), plus the model's sorted sets."""
    plain = {k: e for k, e in state.items() if not isinstance(e.value, model.SortedSet)}
    expected = model_snapshot(plain)
    for key, entry in state.items():
        if isinstance(entry.value, model.SortedSet):
            members = {member: str(score) for member, score in entry.value.scores.items()}
            expiry = -1 if entry.expire_at_ms is None else entry.expire_at_ms
            expected[key] = ("zset", members, expiry)
    return expected


async def load_state(lua: LuaHarness, state: model.State) -> None:
    """lua.load_state(), plus the model's sorted sets."""
    await lua.load_state(
        {k: e for k, e in state.items() if not isinstance(e.value, model.SortedSet)}
    )
    for key, entry in state.items():
        if isinstance(entry.value, model.SortedSet):
            pairs: list[Union[str, int]] = []
            for member, score in entry.value.scores.items():
                pairs += [score, member]
            await lua.execute("ZADD", key, *pairs)
            if entry.expire_at_ms is not None:
                await lua.execute("PEXPIREAT", key, entry.expire_at_ms)


@dataclass(frozen=True)
class Scenario:
    start_offset_ms: int
    policies: tuple[model.Policy, ...]
    steps: tuple[Step, ...]


@st.composite
def scenarios(draw: st.DrawFn, algorithm: str) -> Scenario:
    policies = draw(policy_sets(algorithm, "test"))
    steps = draw(st.lists(steps_for(len(policies)), min_size=1, max_size=25))
    start_offset_ms = draw(
        st.one_of(st.integers(0, 2 * DAY_MS), st.sampled_from([0, 999, DAY_MS - 1]))
    )
    return Scenario(start_offset_ms, policies, tuple(steps))


def script_args(
    algorithm: str, cost_scaled: int, apply: bool, policies: tuple[model.Policy, ...]
) -> list[str]:
    args = [str(cost_scaled), "1" if apply else "0"]
    for policy in policies:
        args += [str(policy.capacity_scaled), str(policy.window_s)]
        if algorithm == "token_bucket":
            rate = policy.refill_scaled_per_s
            args.append("" if rate is None else repr(rate))
    return args


def check_retry_hint(
    decide: Callable[..., tuple[list[int], model.State]],
    state: model.State,
    now_ms: int,
    cost_scaled: int,
    policies: tuple[model.Policy, ...],
    retry_ms: int,
) -> None:
    """A retry hint is exact with no other traffic: denied 1 ms before it, admitted at it."""
    before, _ = decide(state, now_ms + retry_ms - 1, cost_scaled, False, policies)
    at, _ = decide(state, now_ms + retry_ms, cost_scaled, False, policies)
    assert (before[0], at[0]) == (0, 1), (retry_ms, before, at)


async def run_scenario(lua: LuaHarness, algorithm: str, scenario: Scenario) -> None:
    await lua.flush()
    decide = model.DECIDERS[algorithm]
    policies = scenario.policies
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + scenario.start_offset_ms
    state: model.State = {}
    for number, step in enumerate(scenario.steps):
        now_ms += resolve_delta(step, policies)
        await lua.set_clock(now_ms)
        await lua.expire_due(now_ms)
        usage, _ = decide(state, now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3])
        before = model.expire(state, now_ms)
        expected, state = decide(state, now_ms, cost_scaled, step.apply, policies)
        reply = await lua.run(
            algorithm, keys, script_args(algorithm, cost_scaled, step.apply, policies)
        )
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        assert reply == expected, where
        assert await snapshot(lua) == expected_snapshot(state), where
        retry_ms = expected[3 + 3 * expected[1]]
        if expected[0] == 0 and retry_ms > 0:
            check_retry_hint(decide, before, now_ms, cost_scaled, policies, retry_ms)


@EXAMPLES
@given(scenario=scenarios("fixed_window"))
async def test_fixed_window_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "fixed_window", scenario)


@EXAMPLES
@given(scenario=scenarios("token_bucket"))
async def test_token_bucket_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "token_bucket", scenario)


@EXAMPLES
@given(scenario=scenarios("sliding_window"))
async def test_sliding_window_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "sliding_window", scenario)


@EXAMPLES
@given(scenario=scenarios("gcra"))
async def test_gcra_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "gcra", scenario)


@EXAMPLES
@given(scenario=scenarios("sliding_log"))
async def test_sliding_log_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "sliding_log", scenario)


@EXAMPLES
@given(scenario=scenarios("leaky_bucket"))
async def test_leaky_bucket_matches_model(lua: LuaHarness, scenario: Scenario) -> None:
    await run_scenario(lua, "leaky_bucket", scenario)


# -- from arbitrary stored state ---------------------------------------------------------
#
# Sequences only reach states a consistent history produces. These start from any state
# the scripts accept: counters above a (since lowered) capacity, buckets written under
# another capacity or rate, a base ahead of the clock, keys that lost their expiry, GCRA
# arrival times far ahead or behind, logs with entries ahead of the clock or running
# totals about to pass 2^53.


@st.composite
def gcra_fields(draw: st.DrawFn, policy: model.Policy, now_ms: int) -> dict[str, int]:
    now_us, window_us = now_ms * 1000, policy.window_ms * 1000
    tat = draw(
        st.one_of(
            st.integers(now_us - window_us, now_us + window_us),  # behind, or within a window
            st.integers(now_us + window_us - 2, now_us + window_us + 2),
            st.integers(now_us - 3 * DAY_MS * 1000, now_us + 3 * DAY_MS * 1000),
            st.sampled_from([0, now_us, model.MAX_SAFE_INTEGER]),
        )
    )
    capacity = policy.capacity_scaled
    frac = draw(
        st.one_of(
            st.just(0),
            st.integers(0, capacity - 1),
            st.sampled_from([capacity - 1, capacity]),
            st.integers(capacity, model.MAX_SAFE_INTEGER),
        )
    )
    return {"tat": max(0, tat), "frac": frac}


@st.composite
def log_sets(draw: st.DrawFn, policy: model.Policy, now_ms: int) -> model.SortedSet:
    """A well-formed log: instants around the window, running totals that chain."""
    window_ms = policy.window_ms
    instants = draw(
        st.lists(
            st.one_of(
                st.integers(now_ms - 2 * window_ms, now_ms),
                st.sampled_from([now_ms - window_ms, now_ms - window_ms + 1, now_ms]),
                st.integers(now_ms + 1, now_ms + 5000),  # ahead: the clock stepped back
            ),
            min_size=1,
            max_size=8,
        )
    )
    capacity = policy.capacity_scaled
    costs = [
        draw(st.one_of(st.integers(1, max(1, capacity // 4)), st.integers(1, capacity)))
        for _ in instants
    ]
    slack = draw(st.one_of(st.integers(0, 3), st.integers(0, 2 * capacity)))
    near_limit = model.MAX_SAFE_INTEGER - sum(costs) - slack
    offset = draw(st.one_of(st.just(0), st.integers(0, 10**12), st.just(max(0, near_limit))))
    scores: dict[str, int] = {}
    total = offset
    for at_ms, cost in zip(sorted(instants), costs):
        total += cost
        scores[model.log_member(total, cost)] = at_ms
    return model.SortedSet(scores)


@st.composite
def broken_logs(draw: st.DrawFn, policy: model.Policy, now_ms: int) -> model.SortedSet:
    """A log whose newest member the scripts cannot read."""
    good = dict(draw(log_sets(policy, now_ms)).scores)
    newest = max(good.values())
    bad = draw(st.sampled_from(["12:5", "x", "0000000000000005:6", "0000000000000005:0"]))
    good[bad] = newest + 1
    return model.SortedSet(good)


@st.composite
def stored_states(
    draw: st.DrawFn, algorithm: str, policies: tuple[model.Policy, ...], now_ms: int
) -> model.State:
    state: model.State = {}
    expiry = st.one_of(st.none(), st.integers(now_ms, now_ms + 3 * DAY_MS))
    for policy in policies:
        capacity = policy.capacity_scaled
        window_ms = policy.window_ms
        amounts = st.one_of(
            st.integers(0, capacity),
            st.sampled_from([0, capacity]),
            st.integers(0, model.MAX_SAFE_INTEGER),
        )
        if algorithm == "gcra":
            if draw(st.integers(0, 4)):
                fields = draw(gcra_fields(policy, now_ms))
                state[policy.key + model.GCRA_SUFFIX] = model.Entry(fields, draw(expiry))
            continue
        if algorithm == "sliding_log":
            log = draw(
                st.one_of(
                    st.none(),
                    log_sets(policy, now_ms),
                    log_sets(policy, now_ms),
                    log_sets(policy, now_ms),
                    broken_logs(policy, now_ms),
                )
            )
            if log is not None:
                state[policy.key + model.LOG_SUFFIX] = model.Entry(log, draw(expiry))
            continue
        if algorithm not in ("token_bucket", "leaky_bucket"):
            index = now_ms // window_ms
            for window_index in (index, index - 1):
                if draw(st.booleans()):
                    key = f"{policy.key}:{window_index}"
                    state[key] = model.Entry(draw(amounts), draw(expiry))
            continue
        if not draw(st.integers(0, 4)):
            continue  # no bucket yet
        # Where the clock stands from the stored base: within the first window, in the
        # second (one whole-window rebase), later, behind the base, or days on.
        elapsed_ms = draw(
            st.one_of(
                st.integers(0, window_ms - 1),
                st.integers(window_ms, 2 * window_ms - 1),
                st.integers(2 * window_ms, 3 * window_ms),
                st.integers(-5000, -1),
                st.integers(0, 3 * DAY_MS),
            )
        )
        # When the bucket was last written: any time up to now, often the latest possible
        # (a high credited with few tokens is the state a one-window rebase leaves non-full).
        latest_ms = max(0, min(elapsed_ms, window_ms - 1))
        credited_elapsed_ms = draw(
            st.one_of(
                st.integers(0, latest_ms),
                st.integers(latest_ms - latest_ms // 10, latest_ms),
            )
        )
        if policy.refill_scaled_per_s is None:
            consistent = credited_elapsed_ms * capacity // window_ms
        else:
            consistent = math.floor(
                float(credited_elapsed_ms) * policy.refill_scaled_per_s / 1000.0
            )
        credited = draw(
            st.one_of(
                st.just(consistent),
                st.just(consistent),
                st.integers(0, model.MAX_SAFE_INTEGER),
                st.just(model.MAX_SAFE_INTEGER - 1000),
            )
        )
        tokens = draw(
            st.one_of(
                st.just(0),
                st.integers(0, capacity // 10),
                st.integers(0, capacity),
                st.just(capacity),
                st.integers(capacity, model.MAX_SAFE_INTEGER),
            )
        )
        if algorithm == "leaky_bucket":
            # The dual: the same draws as level (0 empty ... capacity full, or above) and drained.
            fields = {"level": tokens, "base": now_ms - elapsed_ms, "drained": credited}
            state[policy.key + model.LEAKY_SUFFIX] = model.Entry(fields, draw(expiry))
            continue
        fields = {"tokens": tokens, "base": now_ms - elapsed_ms, "credited": credited}
        state[policy.key + model.BUCKET_SUFFIX] = model.Entry(fields, draw(expiry))
    return state


async def run_from_state(lua: LuaHarness, algorithm: str, data: st.DataObject) -> None:
    decide = model.DECIDERS[algorithm]
    policies = data.draw(policy_sets(algorithm, "test"), label="policies")
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + data.draw(st.integers(0, 2 * DAY_MS), label="start")
    state = data.draw(stored_states(algorithm, policies, now_ms), label="state")
    await lua.flush()
    await load_state(lua, state)
    for number, step in enumerate(
        data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=3), label="steps")
    ):
        now_ms += resolve_delta(step, policies) if number else 0
        await lua.set_clock(now_ms)
        await lua.expire_due(now_ms)
        try:
            usage, _ = decide(state, now_ms, 0, False, policies)
            cost_scaled = resolve_cost(step, policies, usage[2::3])
        except model.ModelStateError:
            cost_scaled = 1
        args = script_args(algorithm, cost_scaled, step.apply, policies)
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        try:
            expected, state = decide(state, now_ms, cost_scaled, step.apply, policies)
        except model.ModelStateError:
            before = await lua.dump()
            with pytest.raises(RedisReplyError, match=r"^MODERATO_STATE "):
                await lua.run(algorithm, keys, args)
            assert await lua.dump() == before, where
            return
        reply = await lua.run(algorithm, keys, args)
        assert reply == expected, where
        assert await snapshot(lua) == expected_snapshot(state), where


@STATE_EXAMPLES
@given(data=st.data())
async def test_fixed_window_matches_model_from_any_state(
    lua: LuaHarness, data: st.DataObject
) -> None:
    await run_from_state(lua, "fixed_window", data)


@STATE_EXAMPLES
@given(data=st.data())
async def test_token_bucket_matches_model_from_any_state(
    lua: LuaHarness, data: st.DataObject
) -> None:
    await run_from_state(lua, "token_bucket", data)


@STATE_EXAMPLES
@given(data=st.data())
async def test_sliding_window_matches_model_from_any_state(
    lua: LuaHarness, data: st.DataObject
) -> None:
    await run_from_state(lua, "sliding_window", data)


@STATE_EXAMPLES
@given(data=st.data())
async def test_gcra_matches_model_from_any_state(lua: LuaHarness, data: st.DataObject) -> None:
    await run_from_state(lua, "gcra", data)


@STATE_EXAMPLES
@given(data=st.data())
async def test_sliding_log_matches_model_from_any_state(
    lua: LuaHarness, data: st.DataObject
) -> None:
    await run_from_state(lua, "sliding_log", data)


@STATE_EXAMPLES
@given(data=st.data())
async def test_leaky_bucket_matches_model_from_any_state(
    lua: LuaHarness, data: st.DataObject
) -> None:
    await run_from_state(lua, "leaky_bucket", data)


# -- properties of the model itself --------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    capacity_scaled=capacities_scaled,
    window_s=windows_s,
    custom=st.booleans(),
    data=st.data(),
)
def test_token_refill_depends_on_time_alone(
    capacity_scaled: int, window_s: int, custom: bool, data: st.DataObject
) -> None:
    """Refilling at t1 and then t2 gives what refilling once at t2 gives.

    This is why a denial need not save the refilled bucket (ALGORITHMS.md notes
    that a denial loses no progress): the scripts write only on admission.
    """
    rate = data.draw(refill_rates(capacity_scaled)) if custom else None
    policy = model.Policy("k", capacity_scaled, window_s, rate)
    start_ms = 1_700_000_000_000
    tokens = data.draw(st.integers(0, capacity_scaled))
    bucket, _ = model.refill(policy, model.Bucket(tokens, start_ms, 0), start_ms)
    first_ms = start_ms + data.draw(st.integers(0, 3 * window_s * 1000))
    second_ms = first_ms + data.draw(st.integers(0, 3 * window_s * 1000))
    saved, _ = model.refill(policy, bucket, first_ms)
    twice = model.refill(policy, saved, second_ms)
    once = model.refill(policy, bucket, second_ms)
    # The same tokens and the same future; the base may differ by whole windows.
    assert twice[0].tokens_scaled == once[0].tokens_scaled
    for need in (0, 1, capacity_scaled - once[0].tokens_scaled):
        assert twice[0].base_ms + model.wait_end_after_base_ms(
            policy, twice[0], twice[1], need
        ) == once[0].base_ms + model.wait_end_after_base_ms(policy, once[0], once[1], need)


@pytest.mark.parametrize("window_s", [1, 7, 60, 86_400])
def test_sliding_weight_falls_with_each_second(window_s: int) -> None:
    weights = [model.previous_weight_permille(window_s, s) for s in range(window_s)]
    assert weights[0] == 1000
    assert all(a >= b for a, b in zip(weights, weights[1:]))
    assert weights[-1] == 1000 // window_s


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_gcra_leaky_and_token_bucket_models_agree(data: st.DataObject) -> None:
    """One rate law, three formulations: exact rational arrival times (GCRA), an integer
    level drained per ms (leaky bucket) and integer tokens credited per ms (token bucket,
    public rule). On any consistent history their replies are the same, call for call.
    """
    deciders = [model.gcra, model.leaky_bucket, model.token_bucket]
    policies = data.draw(policy_sets("gcra", "test"), label="policies")
    policies = tuple(model.Policy(p.key, p.capacity_scaled, p.window_s) for p in policies)
    # Windows above 26 h: the buckets decide exactly only within their capacity range.
    try:
        for policy in policies:
            model.exact_accrual(policy)
    except model.ModelArgumentError:
        assume(False)
    steps = data.draw(st.lists(steps_for(len(policies)), min_size=1, max_size=40), label="steps")
    now_ms = 1_700_000_000_000 + data.draw(st.integers(0, DAY_MS), label="start")
    states: list[model.State] = [{}, {}, {}]
    for step in steps:
        now_ms += resolve_delta(step, policies)
        usage, _ = model.gcra(states[0], now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3])
        replies = []
        for i, decide in enumerate(deciders):
            reply, states[i] = decide(states[i], now_ms, cost_scaled, step.apply, policies)
            replies.append(reply)
        assert replies[0] == replies[1] == replies[2], (step, cost_scaled, replies)
