"""Properties of the reference model itself (tests/reference_model.py), which the
differential tests hold both backends to: no server, the model alone."""

from __future__ import annotations

import pytest
import reference_model as model
from differential_calls import (
    bursts_scaled,
    capacities_scaled,
    policy_sets,
    refill_rates,
    resolve_cost,
    resolve_delta,
    steps_for,
    windows_s,
)
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lua_harness import DAY_MS


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
    """Refilling at t1 and then t2 gives what refilling once at t2 gives (with a burst too).

    This is why a denial need not save the refilled bucket (ALGORITHMS.md notes
    that a denial loses no progress): the scripts write only on admission.
    """
    rate = data.draw(refill_rates(capacity_scaled)) if custom else None
    burst = None
    if not custom and data.draw(st.booleans()):
        burst = data.draw(bursts_scaled("token_bucket", capacity_scaled, window_s))
    policy = model.Policy("k", capacity_scaled, window_s, rate, burst)
    start_ms = 1_700_000_000_000
    tokens = data.draw(st.integers(0, policy.bucket_scaled))
    bucket, _ = model.refill(policy, model.Bucket(tokens, start_ms, 0), start_ms)
    first_ms = start_ms + data.draw(st.integers(0, 3 * window_s * 1000))
    second_ms = first_ms + data.draw(st.integers(0, 3 * window_s * 1000))
    saved, _ = model.refill(policy, bucket, first_ms)
    twice = model.refill(policy, saved, second_ms)
    once = model.refill(policy, bucket, second_ms)
    # The same tokens and the same future; the base may differ by whole windows.
    assert twice[0].tokens_scaled == once[0].tokens_scaled
    for need in (0, 1, policy.bucket_scaled - once[0].tokens_scaled):
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
    public rule). On any consistent history their replies are the same, call for call,
    with a burst too.
    """
    deciders = [model.gcra, model.leaky_bucket, model.token_bucket]
    policies = data.draw(policy_sets("gcra", "test"), label="policies")
    policies = tuple(
        model.Policy(p.key, p.capacity_scaled, p.window_s, None, p.burst_scaled) for p in policies
    )
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
