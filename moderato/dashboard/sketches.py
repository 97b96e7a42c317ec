"""Bounded summaries the recorder keeps: heavy hitters and a latency histogram.

Both take O(1) work per observation (the heavy hitters' amortised) and hold a
fixed amount of memory however many identities or decisions they see, so a
flood of distinct clients cannot grow a process. Both merge: the dashboard
adds up the summaries of every process it sees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Union

Item = Union[str, bytes]


class HeavyHitters:
    """The most frequent items of a stream, within ``capacity`` counters (Misra-Gries).

    Every item seen more than ``total / (capacity + 1)`` times is kept, and each
    kept count is at most that much below the true one (never above it). A new
    item met with every counter taken lowers them all by one and drops those
    that reach zero: each such step undoes earlier increments, so the cost is
    O(1) per item amortised.
    """

    __slots__ = ("capacity", "counts", "total")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.counts: dict[Item, int] = {}
        self.total = 0
        """Every item added, kept or not: the error bound is total / (capacity + 1)."""

    def add(self, item: Item) -> None:
        self.total += 1
        counts = self.counts
        count = counts.get(item)
        if count is not None:
            counts[item] = count + 1
        elif len(counts) < self.capacity:
            counts[item] = 1
        else:
            self.counts = {kept: n - 1 for kept, n in counts.items() if n > 1}

    def error_bound(self) -> int:
        """How far below its true count any kept count may be."""
        return self.total // (self.capacity + 1)

    def clear(self) -> None:
        self.counts = {}
        self.total = 0


def merge_hitters(summaries: Iterable[Mapping[str, int]], capacity: int) -> list[tuple[str, int]]:
    """Counts of several summaries added item by item, the ``capacity`` largest first.

    Each input count is a lower bound of its item's count in its stream, so
    their sum is a lower bound of the item's count over every stream.
    """
    merged: dict[str, int] = {}
    for summary in summaries:
        for item, count in summary.items():
            merged[item] = merged.get(item, 0) + count
    ranked = sorted(merged.items(), key=lambda pair: (-pair[1], pair[0]))
    return ranked[:capacity]


# Bucket layout: SUB_BUCKETS per power of two, from 2**MIN_EXPONENT s (about
# 1 us) to 2**MAX_EXPONENT s (64 s); a bucket is at most 1/16 of its value wide,
# so a percentile read from it is within about 3% of the true one.
SUB_BUCKETS = 16
MIN_EXPONENT = -20
MAX_EXPONENT = 6
BUCKET_COUNT = (MAX_EXPONENT - MIN_EXPONENT) * SUB_BUCKETS


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a duration (durations beyond either end go to the ends)."""
    mantissa, exponent = math.frexp(seconds)  # seconds = mantissa * 2**exponent, 0.5 <= m < 1
    if exponent <= MIN_EXPONENT or seconds <= 0.0:
        return 0
    if exponent > MAX_EXPONENT:
        return BUCKET_COUNT - 1
    return (exponent - MIN_EXPONENT - 1) * SUB_BUCKETS + int((mantissa - 0.5) * 2 * SUB_BUCKETS)


FAST_BITS = 13
FAST_LATENCY_US = 1 << FAST_BITS
"""Durations below this many microseconds (8.2 ms: most checks) are bucketed by one table
lookup; longer ones by the same table, scaled (a bucket is a fixed share of an octave)."""
FAST_BUCKETS = tuple(bucket_of((us + 0.5) * 1e-6) for us in range(FAST_LATENCY_US))
"""The bucket of each whole microsecond, taken at its middle."""


def latency_bucket(seconds: float) -> int:
    """The bucket the recorder counts a check's duration in, read to the microsecond:
    ``bucket_of`` by table lookups (DecisionRecorder.decided inlines this)."""
    elapsed_us = int(seconds * 1e6)
    if elapsed_us < FAST_LATENCY_US:
        return FAST_BUCKETS[elapsed_us] if elapsed_us >= 0 else 0
    shift = elapsed_us.bit_length() - FAST_BITS
    return min(FAST_BUCKETS[elapsed_us >> shift] + shift * SUB_BUCKETS, BUCKET_COUNT - 1)


def bucket_bounds(index: int) -> tuple[float, float]:
    """The durations, in seconds, bucket ``index`` holds: [low, high)."""
    octave, sub = divmod(index, SUB_BUCKETS)
    base = math.ldexp(1.0, octave + MIN_EXPONENT)
    return base * (1 + sub / SUB_BUCKETS), base * (1 + (sub + 1) / SUB_BUCKETS)


class LatencyHistogram:
    """Counts of durations in BUCKET_COUNT fixed logarithmic buckets."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * BUCKET_COUNT

    def add(self, seconds: float) -> None:
        self.counts[latency_bucket(seconds)] += 1

    def clear(self) -> None:
        self.counts = [0] * BUCKET_COUNT

    def sparse(self) -> dict[int, int]:
        """The non-empty buckets, by index."""
        return {index: count for index, count in enumerate(self.counts) if count}


def percentile_s(buckets: Mapping[int, int], fraction: float) -> float | None:
    """The duration below which ``fraction`` of the counted durations lie, read as the
    middle of its bucket; None when nothing was counted."""
    total = sum(buckets.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(fraction * total))
    seen = 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen >= rank:
            low, high = bucket_bounds(index)
            return (low + high) / 2
    return None  # pragma: no cover - the loop always reaches the total
