"""memory://'s sweep (MemoryStore.sweep) never changes a decision, on generated call
sequences of every algorithm of the registry: no server, the C store alone."""

from __future__ import annotations

import pytest
import reference_model as model
from differential_calls import policy_sets, resolve_cost, resolve_delta, script_args, steps_for
from hypothesis import given, settings
from hypothesis import strategies as st
from lua_harness import clock_origin_ms

from moderato import _accel
from moderato.algorithms import ALGORITHMS

ALGORITHM_NAMES = tuple(ALGORITHMS)


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
