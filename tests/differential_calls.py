"""The call sequences both differential tests draw: Lua against the model, and memory://
against Lua and the model.

A sequence is a set of 1-3 policies and a list of steps; a step moves the clock
and makes one call, its clock step and cost given relative to the policies and
their state, resolved just before the call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import reference_model as model
from hypothesis import strategies as st
from lua_harness import DAY_MS

from moderato.algorithms import ALGORITHMS

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
        if algorithm == "token_bucket" and draw(st.integers(0, 3)) == 0:
            rate = draw(refill_rates(capacity_scaled))
        key = f"{prefix}:{tag}:{{tenant:scope:client}}:{window_s}"
        policies.append(model.Policy(key, capacity_scaled, window_s, rate))
    return tuple(policies)


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
        whole = remaining[index] if kind == "remaining" else policies[index].capacity_scaled
        cost = max(1, whole * numerator // denominator + plus)
    # A peek may also ask about cost 0 (a usage read).
    if not step.apply and kind == "scaled" and cost == 1:
        return 0
    return cost
