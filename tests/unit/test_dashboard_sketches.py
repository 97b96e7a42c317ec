"""moderato/dashboard/sketches.py: heavy hitters and latency histogram, against brute force."""

from __future__ import annotations

import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from moderato.dashboard.sketches import (
    BUCKET_COUNT,
    HeavyHitters,
    LatencyHistogram,
    bucket_bounds,
    bucket_of,
    merge_hitters,
    percentile_s,
)


@settings(max_examples=200, deadline=None)
@given(
    stream=st.lists(st.integers(min_value=0, max_value=40), max_size=400),
    capacity=st.integers(min_value=1, max_value=12),
)
def test_heavy_hitters_keep_every_frequent_item_within_the_bound(
    stream: list[int], capacity: int
) -> None:
    hitters = HeavyHitters(capacity)
    for item in stream:
        hitters.add(str(item))
    true = Counter(str(item) for item in stream)
    bound = len(stream) // (capacity + 1)
    assert hitters.total == len(stream)
    assert hitters.error_bound() == bound
    assert len(hitters.counts) <= capacity
    for item, count in true.items():
        kept = hitters.counts.get(item, 0)
        assert count - bound <= kept <= count  # never above, at most the bound below
        if count > bound:
            assert item in hitters.counts


def test_a_flood_among_many_distinct_identities_stays_on_top() -> None:
    rng = random.Random(7)
    hitters = HeavyHitters(16)
    stream = ["flooder"] * 3000 + [f"10.0.{rng.randrange(256)}.{n}" for n in range(20_000)]
    rng.shuffle(stream)
    for item in stream:
        hitters.add(item)
    top = max(hitters.counts.items(), key=lambda pair: pair[1])
    assert top[0] == "flooder"
    assert 3000 - 23_000 // 17 <= top[1] <= 3000
    assert len(hitters.counts) <= 16


def test_merged_hitters_add_up_per_item_and_keep_the_largest() -> None:
    merged = merge_hitters([{"a": 5, "b": 1}, {"a": 2, "c": 4}, {"b": 1}], capacity=2)
    assert merged == [("a", 7), ("c", 4)]
    assert merge_hitters([], 3) == []


def test_bucket_bounds_hold_their_durations_within_one_sixteenth() -> None:
    rng = random.Random(3)
    for _ in range(5000):
        seconds = math.exp(rng.uniform(math.log(2e-6), math.log(30.0)))
        low, high = bucket_bounds(bucket_of(seconds))
        assert low <= seconds < high
        assert (high - low) / low <= 1 / 16 + 1e-12
    assert bucket_of(0.0) == 0 and bucket_of(-1.0) == 0 and bucket_of(1e-9) == 0
    assert bucket_of(1e6) == BUCKET_COUNT - 1
    # Buckets are in order of duration, and cover the range without a gap.
    for index in range(BUCKET_COUNT - 1):
        assert bucket_bounds(index)[1] == bucket_bounds(index + 1)[0]


def test_percentiles_are_read_within_the_bucket_resolution() -> None:
    rng = random.Random(11)
    samples = [rng.lognormvariate(math.log(0.0008), 0.6) for _ in range(20_000)]
    histogram = LatencyHistogram()
    for sample in samples:
        histogram.add(sample)
    ordered = sorted(samples)
    for fraction in (0.5, 0.9, 0.99):
        true = ordered[math.ceil(fraction * len(ordered)) - 1]
        read = percentile_s(histogram.sparse(), fraction)
        assert read is not None
        assert abs(read - true) / true <= 0.07
    assert percentile_s({}, 0.5) is None
    assert sum(histogram.sparse().values()) == 20_000
    histogram.clear()
    assert histogram.sparse() == {}
