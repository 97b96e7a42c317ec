"""GCRA: a theoretical arrival time in microseconds (lua/gcra.lua, csrc/store_gcra.c)."""

from __future__ import annotations

from .. import _accel
from ..policy import MAX_LIMIT
from .base import Algorithm

GCRA_MAX_WINDOW_S: int = _accel.GCRA_MAX_WINDOW_S
"""Largest GCRA window: now_us + 2 * window_us + 1 <= 2**53 up to now_ms = 9 * 10**12 (2255)."""


def gcra_max_limit(window_s: int) -> int:
    """Times in microseconds; a TAT reaches now + 2 windows, any capacity is exact."""
    return MAX_LIMIT if window_s <= GCRA_MAX_WINDOW_S else 0


ALGORITHM = Algorithm(
    name="gcra",
    key_tag="gc",
    state_suffixes=(":gcra",),
    max_limit=gcra_max_limit,
    # A burst's tolerance, burst * window / limit, stays within GCRA's longest window.
    burst_bound_s=GCRA_MAX_WINDOW_S,
)
