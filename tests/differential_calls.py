"""What the differential tests draw and run: call sequences, stored states, and each
backend's calls and state, held against the reference model (tests/reference_model.py).

A sequence is a set of 1-3 policies and a list of steps; a step moves the clock
and makes one call, its clock step and cost given relative to the policies and
their state, resolved just before the call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Union

import reference_model as model
from decision_stores import DecisionStore, MemoryHarness
from hypothesis import strategies as st
from lua_harness import DAY_MS, LuaHarness, Snapshot, clock_origin_ms, model_snapshot

from moderato.algorithms import ALGORITHMS
from moderato.errors import RedisReplyError

windows_s = st.one_of(
    st.sampled_from([1, 2, 3, 7, 60, 3600, 86_400]),
    st.integers(1, 86_400),
    # The long-window path: days, a week, limits' month and year, GCRA's bound.
    st.sampled_from(
        [86_401, 94_906, 94_907, 172_800, 604_800, 2_592_000, 3_599_627, 3_599_628, 31_104_000]
    ),
)
capacities_scaled = st.one_of(
    st.sampled_from(
        [1, 999, 1000, 1001, 3000, 10_000, model.MAX_CAPACITY_SCALED, model.MAX_CAPACITY_SCALED - 1]
    ),
    # What public rates produce; small limits divide common windows, which is where the
    # float estimate of a refill time lands exactly on (and may round past) an integer.
    st.integers(1, 1000).map(lambda limit: limit * 1000),
    st.sampled_from([1, 2, 3, 4, 5, 6, 10, 12, 30, 100]).map(lambda limit: limit * 1000),
    st.integers(1, 30_000),
    st.integers(1, model.MAX_CAPACITY_SCALED),
)


def refill_rates(capacity_scaled: int) -> st.SearchStrategy[float]:
    lowest = capacity_scaled / model.MAX_WINDOW_S
    highest = float(model.MAX_CAPACITY_SCALED)
    return st.one_of(
        st.sampled_from([lowest, highest]),
        st.floats(min_value=lowest, max_value=highest, allow_nan=False, allow_infinity=False),
        # rates a caller would pick: whole units per second
        st.integers(1, 1000).map(float).filter(lambda rate: lowest <= rate <= highest),
    )


@st.composite
def policy_sets(draw: st.DrawFn, algorithm: str, prefix: str) -> tuple[model.Policy, ...]:
    """1-3 policies with distinct windows, keyed as the limiter keys them under ``prefix``."""
    count = draw(st.integers(1, 3))
    # Valid policies only (the refusals have tests of their own): GCRA's windows stop at
    # its bound, and past 26 h the buckets' capacity at the exact accrual's.
    windows_here = windows_s
    if algorithm == "gcra":
        windows_here = windows_s.filter(lambda window_s: window_s <= model.GCRA_MAX_WINDOW_S)
    windows = draw(st.lists(windows_here, min_size=count, max_size=count, unique=True))
    tag = ALGORITHMS[algorithm].key_tag
    # Half the sets of the algorithms that take a burst carry one (the burst layout: every
    # policy sends a burst_scaled, its capacity when it has none of its own).
    bursting = algorithm in BURST_BOUNDS_S and draw(st.booleans())
    policies = []
    for window_s in windows:
        capacity_scaled = draw(capacities_scaled)
        largest_exact = model.MAX_SAFE_INTEGER // (window_s * 1000)
        # GCRA takes any capacity; half the time it keeps to the buckets' range too, which
        # the three-formulations test needs.
        accrues = algorithm in ("token_bucket", "leaky_bucket") or (
            algorithm == "gcra" and draw(st.booleans())
        )
        long_window = window_s * 1000 > model.ACCRUAL_EXACT_WINDOW_MS
        if accrues and long_window and capacity_scaled > largest_exact:
            capacity_scaled = draw(
                st.one_of(st.sampled_from([largest_exact, 1000]), st.integers(1, largest_exact))
            )
        rate = None
        if algorithm == "token_bucket" and not bursting and draw(st.integers(0, 3)) == 0:
            rate = draw(refill_rates(capacity_scaled))
        burst = None
        if bursting and draw(st.integers(0, 3)) > 0:
            burst = draw(bursts_scaled(algorithm, capacity_scaled, window_s))
        key = f"{prefix}:{tag}:{{tenant:scope:client}}:{window_s}"
        policies.append(model.Policy(key, capacity_scaled, window_s, rate, burst))
    return tuple(policies)


BURST_BOUNDS_S = {
    "token_bucket": model.BUCKET_REFILL_BOUND_S,
    "leaky_bucket": model.BUCKET_REFILL_BOUND_S,
    "gcra": model.GCRA_REFILL_BOUND_S,
}
"""The algorithms that take a burst, and the bound its refill keeps to."""


def bursts_scaled(algorithm: str, capacity_scaled: int, window_s: int) -> st.SearchStrategy[int]:
    """Bursts for one policy: below, at and above its capacity, whole multiples of it and
    not, up to the largest its refill bound allows."""
    probe = model.Policy("", capacity_scaled, window_s)
    largest = model.largest_burst_scaled(probe, BURST_BOUNDS_S[algorithm])
    return st.one_of(
        st.sampled_from([1, capacity_scaled, largest, max(1, largest - 1)]),
        st.integers(1, largest),
        st.integers(1, 100).map(lambda times: min(largest, times * capacity_scaled)),
        st.integers(2, 50).map(lambda times: min(largest, times * capacity_scaled + 1)),
        st.integers(1, 9).map(lambda tenths: max(1, capacity_scaled * tenths // 10)),
    )


@dataclass(frozen=True)
class Step:
    """One call. Clock steps and costs may be relative to the policies and their state."""

    delta_ms: tuple[Any, ...]
    """("ms", n) or ("window", policy, numerator, denominator, jitter_ms)"""
    cost: tuple[Any, ...]
    """("scaled", n), or ("remaining" | "capacity", policy, (numerator, denominator), plus):
    that fraction of what the policy has left (or holds) just before the call, plus a nudge"""
    apply: bool


def steps_for(count: int) -> st.SearchStrategy[Step]:
    policy = st.integers(0, count - 1)
    fractions = st.sampled_from([(1, 1), (1, 2), (1, 3), (9, 10), (1, 10), (3, 2)])
    deltas = st.one_of(
        st.tuples(st.just("ms"), st.sampled_from([0, 1, 999, 1000, 1001])),
        st.tuples(st.just("ms"), st.integers(0, 3 * DAY_MS)),
        st.tuples(
            st.just("window"),
            policy,
            st.integers(1, 25),
            st.sampled_from([1, 2, 3, 10]),
            st.integers(-1, 1),
        ),
    )
    costs = st.one_of(
        st.tuples(st.just("scaled"), st.integers(1, 5000)),
        st.tuples(st.just("scaled"), st.just(model.MAX_SAFE_INTEGER)),
        st.tuples(st.just("remaining"), policy, fractions, st.integers(-1, 1)),
        st.tuples(st.just("capacity"), policy, fractions, st.integers(-1, 1)),
    )
    return st.builds(Step, deltas, costs, st.sampled_from([True, True, True, False]))


def resolve_delta(step: Step, policies: Sequence[model.Policy]) -> int:
    if step.delta_ms[0] == "ms":
        return int(step.delta_ms[1])
    _, index, numerator, denominator, jitter = step.delta_ms
    window_ms = policies[index].window_ms
    delta_ms = window_ms * int(numerator) // int(denominator)
    if window_ms > DAY_MS:
        # Past two windows every state reads as fresh; capping long-window jumps there keeps
        # 40 steps of a year-long window well before the year 2255 the clocks stop at.
        delta_ms = min(delta_ms, 2 * window_ms)
    return max(0, delta_ms + int(jitter))


def resolve_cost(step: Step, policies: Sequence[model.Policy], remaining: Sequence[int]) -> int:
    kind = step.cost[0]
    if kind == "scaled":
        cost = int(step.cost[1])
    else:
        _, index, (numerator, denominator), plus = step.cost
        whole = remaining[index] if kind == "remaining" else policies[index].bucket_scaled
        cost = max(1, whole * numerator // denominator + plus)
    # A peek may also ask about cost 0 (a usage read).
    if not step.apply and kind == "scaled" and cost == 1:
        return 0
    return cost


# -- stored states in each backend's representation --------------------------------------------

StoreValue = Union[int, dict[str, int], list[tuple[str, int]]]


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


async def redis_snapshot(lua: LuaHarness) -> Snapshot:
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
    """What redis_snapshot() must show for a model state: model_snapshot() and sorted sets."""
    plain = {k: e for k, e in state.items() if not isinstance(e.value, model.SortedSet)}
    expected = model_snapshot(plain)
    for key, entry in state.items():
        if isinstance(entry.value, model.SortedSet):
            members = {member: str(score) for member, score in entry.value.scores.items()}
            expiry = -1 if entry.expire_at_ms is None else entry.expire_at_ms
            expected[key] = ("zset", members, expiry)
    return expected


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


async def load_state(store: DecisionStore, state: model.State) -> None:
    """Writes a model state into the backend (Redis: decimal strings, absolute expiries)."""
    if isinstance(store, MemoryHarness):
        for key, entry in state.items():
            expiry = -1 if entry.expire_at_ms is None else entry.expire_at_ms
            store.store.load(key, store_value(entry.value), expiry)  # type: ignore[arg-type]
        return
    await store.load_state(
        {k: e for k, e in state.items() if not isinstance(e.value, model.SortedSet)}
    )
    for key, entry in state.items():
        if isinstance(entry.value, model.SortedSet):
            pairs: list[Union[str, int]] = []
            for member, score in entry.value.scores.items():
                pairs += [score, member]
            await store.execute("ZADD", key, *pairs)
            if entry.expire_at_ms is not None:
                await store.execute("PEXPIREAT", key, entry.expire_at_ms)


async def assert_holds(store: DecisionStore, state: model.State, now_ms: int, where: str) -> None:
    """The backend holds exactly the model's keys, values and expiries."""
    if isinstance(store, MemoryHarness):
        assert store.store.dump(now_ms) == expected_dump(state, now_ms), where
    else:
        assert await redis_snapshot(store) == expected_snapshot(state), where


# -- calls -------------------------------------------------------------------------------------


def script_args(
    algorithm: str, cost_scaled: int, apply: bool, policies: Sequence[model.Policy]
) -> list[Union[int, str]]:
    # Ints and strs, as the limiter sends them (and the Redis client encodes them).
    args: list[Union[int, str]] = [cost_scaled, 1 if apply else 0]
    return args + model.script_fields(algorithm, policies)


async def run_call(
    store: DecisionStore, name: str, keys: list[str], args: Sequence[Union[int, str]]
) -> Union[list[int], int, str]:
    """The script's (or the store's) reply, or its refusal's message."""
    try:
        reply: Union[list[int], int] = await store.run(name, keys, args)
    except RedisReplyError as error:
        return error.message
    return reply


def same_outcome(reply: Union[list[int], int, str], expected: Union[list[int], str]) -> bool:
    if isinstance(expected, str):  # the model raises; its message is its own
        return isinstance(reply, str) and reply.startswith(expected + " ")
    return reply == expected


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


def check_retry_hint(
    decide: Callable[..., tuple[list[int], model.State]],
    state: model.State,
    now_ms: int,
    cost_scaled: int,
    policies: Sequence[model.Policy],
    retry_ms: int,
) -> None:
    """A retry hint is exact with no other traffic: denied 1 ms before it, admitted at it."""
    before, _ = decide(state, now_ms + retry_ms - 1, cost_scaled, False, policies)
    at, _ = decide(state, now_ms + retry_ms, cost_scaled, False, policies)
    assert (before[0], at[0]) == (0, 1), (retry_ms, before, at)


# -- sequences from an empty store -------------------------------------------------------------


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


async def run_scenario(store: DecisionStore, algorithm: str, scenario: Scenario) -> None:
    """Every step's reply and the whole stored state are the model's; a denial's retry
    hint is exact by the model."""
    await store.flush()
    decide = model.DECIDERS[algorithm]
    policies = scenario.policies
    keys = [policy.key for policy in policies]
    now_ms = clock_origin_ms() + scenario.start_offset_ms
    state: model.State = {}
    for number, step in enumerate(scenario.steps):
        now_ms += resolve_delta(step, policies)
        await store.set_clock(now_ms)
        await store.expire_due(now_ms)
        usage, _ = decide(state, now_ms, 0, False, policies)
        cost_scaled = resolve_cost(step, policies, usage[2::3])
        before = model.expire(state, now_ms)
        expected, state = decide(state, now_ms, cost_scaled, step.apply, policies)
        reply = await store.run(
            algorithm, keys, script_args(algorithm, cost_scaled, step.apply, policies)
        )
        where = f"step {number} at +{now_ms - clock_origin_ms()} ms, cost {cost_scaled}: {step}"
        assert reply == expected, where
        await assert_holds(store, state, now_ms, where)
        retry_ms = expected[3 + 3 * expected[1]]
        if expected[0] == 0 and retry_ms > 0:
            check_retry_hint(decide, before, now_ms, cost_scaled, policies, retry_ms)


# -- states no history produces ----------------------------------------------------------------
#
# Sequences only reach states a consistent history produces. These are any state the
# scripts accept, and some they refuse: counters above a (since lowered) capacity or
# out of range, buckets written under another capacity or rate, a base ahead of the
# clock, keys that lost their expiry, GCRA arrival times far ahead or behind, logs with
# entries ahead of the clock, running totals about to pass 2^53, or unreadable members.


@st.composite
def gcra_fields(draw: st.DrawFn, policy: model.Policy, now_ms: int) -> dict[str, int]:
    now_us, window_us = now_ms * 1000, policy.window_ms * 1000
    # How far the TAT may run ahead: a window, or burst * window / capacity with a burst.
    tolerance_us = policy.bucket_scaled * window_us // policy.capacity_scaled
    tat = draw(
        st.one_of(
            st.integers(now_us - window_us, now_us + window_us),  # behind, or within a window
            st.integers(now_us + window_us - 2, now_us + window_us + 2),
            st.integers(now_us, now_us + tolerance_us),
            st.integers(now_us + tolerance_us - 2, now_us + tolerance_us + 2),
            st.integers(now_us - 3 * DAY_MS * 1000, now_us + 3 * DAY_MS * 1000),
            st.sampled_from([0, now_us, model.MAX_SAFE_INTEGER, -1]),
        )
    )
    capacity = policy.capacity_scaled
    frac = draw(
        st.one_of(
            st.just(0),
            st.integers(0, capacity - 1),
            st.sampled_from([capacity - 1, capacity]),
            st.integers(capacity, model.MAX_SAFE_INTEGER + 1),
        )
    )
    return {"tat": max(-1, tat), "frac": frac}


@st.composite
def log_sets(
    draw: st.DrawFn, policy: model.Policy, now_ms: int, anywhere: bool = False
) -> model.SortedSet:
    """A log around the window, entries ahead of the clock, totals near 2^53; sometimes
    with a member the scripts cannot read: the newest (where the model reads members as
    the script does), or, with anywhere, at any instant, and totals that do not chain."""
    window_ms, capacity = policy.window_ms, policy.capacity_scaled
    instants = sorted(
        draw(
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
    )
    costs = [
        draw(st.one_of(st.integers(1, max(1, capacity // 4)), st.integers(1, capacity)))
        for _ in instants
    ]
    slack = draw(st.one_of(st.integers(0, 3), st.integers(0, 2 * capacity)))
    near_limit = model.MAX_SAFE_INTEGER - sum(costs) - slack
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


@st.composite
def stored_states(
    draw: st.DrawFn,
    algorithm: str,
    policies: Sequence[model.Policy],
    now_ms: int,
    anywhere: bool = False,
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
            st.sampled_from([-1, model.MAX_SAFE_INTEGER + 1]),  # out of range: refused
        )
        # With a burst the bucket holds more (or less) than a window refills.
        bucket = policy.bucket_scaled
        refill_windows = -(-bucket // capacity)
        if draw(st.integers(0, 4)) == 0:
            continue  # nothing stored yet
        if algorithm == "gcra":
            fields = draw(gcra_fields(policy, now_ms))
            state[policy.key + model.GCRA_SUFFIX] = model.Entry(fields, draw(expiry))
            continue
        if algorithm == "sliding_log":
            log = draw(log_sets(policy, now_ms, anywhere))
            state[policy.key + model.LOG_SUFFIX] = model.Entry(log, draw(expiry))
            continue
        if algorithm in ("fixed_window", "sliding_window"):
            index = now_ms // window_ms
            for window_index in (index, index - 1):
                if draw(st.booleans()):
                    key = f"{policy.key}:{window_index}"
                    state[key] = model.Entry(draw(amounts), draw(expiry))
            continue
        # Where the clock stands from the stored base: within the first window, in the
        # second (one whole-window rebase), later, behind the base, or days on.
        elapsed_ms = draw(
            st.one_of(
                st.integers(0, window_ms - 1),
                st.integers(window_ms, 2 * window_ms - 1),
                st.integers(2 * window_ms, 3 * window_ms),
                st.integers(0, (refill_windows + 1) * window_ms),
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
        # Past 2^53 every value is refused alike; memory:// holds 64-bit integers.
        consistent = min(consistent, model.MAX_SAFE_INTEGER + 1)
        # Branches are chosen with plain draws: one_of() over strategies that may be
        # equal (hypothesis caches and merges them) makes generation depend on that cache.
        credited = [consistent, consistent, draw(amounts), model.MAX_SAFE_INTEGER - 1000][
            draw(st.integers(0, 3))
        ]
        tokens = draw(
            st.one_of(
                st.just(0),
                st.integers(0, bucket // 10),
                st.integers(0, bucket),
                st.sampled_from([capacity, bucket]),
                st.integers(bucket, model.MAX_SAFE_INTEGER),
                st.sampled_from([-1, model.MAX_SAFE_INTEGER + 1]),
            )
        )
        base = draw(amounts) if draw(st.integers(0, 4)) == 0 else now_ms - elapsed_ms
        if algorithm == "leaky_bucket":
            # The dual: the same draws as level (0 empty ... capacity full, or above) and drained.
            fields = {"level": tokens, "base": base, "drained": credited}
            state[policy.key + model.LEAKY_SUFFIX] = model.Entry(fields, draw(expiry))
            continue
        fields = {"tokens": tokens, "base": base, "credited": credited}
        state[policy.key + model.BUCKET_SUFFIX] = model.Entry(fields, draw(expiry))
    return state
