"""What every algorithm is to Python: one registry entry, and the helpers entries share.

An entry names the algorithm (which is also its Lua script, lua/<name>.lua,
and its name in the C store, ``_accel.MemoryStore.decide``), its key tag, the
per-policy script arguments, its exact range and the state keys it derives
from a policy's base key (which reset deletes). Every script replies
``[allowed, deciding, (remaining_scaled, retry_ms, reset_ms) * policies]``
(docs/internals.md), decoded by ``_accel.check_result``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from ..errors import RateLimitConfigError
from ..policy import MAX_LIMIT, MAX_LONG_WINDOW_S, Policy, Rate

ScriptArg = Union[int, str]

PolicyArgs = Callable[[Rate], tuple[ScriptArg, ...]]
"""An algorithm's per-policy script arguments, after cost_scaled and apply."""

MaxLimit = Callable[[int], int]
"""An algorithm's exact range: the largest limit it decides exactly for a window (0: none)."""

WINDOW_INDEX = ":#"
"""A state suffix standing for ``<base>:<index>`` and ``<base>:<index - 1>``,
index = floor(now_ms / window_ms): the current and previous window's counters."""


def capacity_and_window(rate: Rate) -> tuple[ScriptArg, ...]:
    """The script arguments of most algorithms: capacity_scaled, window_s."""
    return (rate.capacity_scaled, rate.window_s)


def any_limit(window_s: int) -> int:
    """Counters and sums that never multiply by the window: every limit is exact."""
    return MAX_LIMIT


@dataclass(frozen=True)
class Algorithm:
    """An algorithm's registry entry; the defaults are what most algorithms take."""

    name: str
    """Its registry name, its Lua script (lua/<name>.lua) and its name in the C store."""
    key_tag: str
    """Short tag inside every key, so algorithms never share (and never WRONGTYPE) a key."""
    state_suffixes: tuple[str, ...]
    """The keys it keeps under a policy's base key: suffixes, or WINDOW_INDEX."""
    policy_args: PolicyArgs = capacity_and_window
    """A policy's script arguments, after cost_scaled and apply."""
    max_limit: MaxLimit = any_limit
    """The exact range: the largest limit decided exactly for a window."""
    burst_bound_s: int = 0
    """0: it takes no burst (its capacity is its limit). Else it takes one
    (a bucket holding more, or less, than the limit it refills per window),
    refilled within this many seconds counted in whole windows."""
    batch_parts: int = 16
    """The most of its checks one batched call decides (moderato/redis/grouping.py),
    each weighing ``scripts.BATCH_PART_UNITS`` (a repeat less: ``batch_repeat_units``):
    about 100 µs of Redis for one-policy checks on one key, admitted or denied
    (BENCHMARKS.md, "The bound of a batched call", "A batched call's bound with
    denials"); lua/batch.lua refuses more than ``scripts.MAX_BATCH_UNITS`` units."""
    batch_repeat_units: int = 1
    """A check's weight in a batched call when sent as the check before it again (the
    ``=`` marker), in units of which a check sent otherwise weighs
    ``scripts.BATCH_PART_UNITS``: a run's repeat costs Redis a fraction of a check in full
    (BENCHMARKS.md, "A hot run's repeats weigh less")."""

    def check_exact_range(self, policy: Policy) -> None:
        """Refuse a policy whose (limit, window) lies outside this algorithm's exact range."""
        for rate in policy.rates:
            largest = self.max_limit(rate.window_s)
            if rate.limit <= largest:
                continue
            if largest == 0:  # no limit fits: only a shorter window helps
                longest_s = self.longest_window_s(rate.limit)
                raise RateLimitConfigError(
                    f"rate '{policy.text}': a window of {rate.window_s} seconds is too long "
                    f"for {self.name}, whose exact range ends at windows of {longest_s} "
                    f"seconds ({longest_s * 10 // 86_400 / 10} days); shorten the window or "
                    "choose another algorithm"
                )
            raise RateLimitConfigError(
                f"rate '{policy.text}': the largest limit {self.name} decides exactly over "
                f"a window of {rate.window_s} seconds is {largest}, got {rate.limit}; lower the "
                "limit, shorten the window or choose another algorithm"
            )

    def check_burst(self, policy: Policy) -> None:
        """Refuse a burst that does not refill within burst_bound_s in whole windows
        (docs/internals.md, "Bursts"); a burst of an algorithm that takes none is
        refused by the plan, which knows the ones that do."""
        if policy.burst is None:
            return
        rate = policy.rates[0]
        largest = min(MAX_LIMIT, self.burst_bound_s // rate.window_s * rate.limit)
        if policy.burst > largest:
            raise RateLimitConfigError(
                f"rate {policy.described}: {self.name} refills a burst within "
                f"{self.burst_bound_s} seconds counted in whole windows (ceil(burst / "
                f"limit) windows of {rate.window_s} s), so the largest burst of "
                f"'{policy.text}' is {largest}, got {policy.burst}; lower the burst or "
                "raise the rate"
            )

    def longest_window_s(self, limit: int) -> int:
        """The longest window over which ``limit`` is in the exact range (0 if none).

        The range only narrows as windows grow, so a binary search finds it.
        """
        low, high = 0, MAX_LONG_WINDOW_S
        while low < high:
            middle = (low + high + 1) // 2
            if self.max_limit(middle) >= limit:
                low = middle
            else:
                high = middle - 1
        return low
