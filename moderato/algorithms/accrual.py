"""The exact range the token and the leaky bucket share (lua/accrual.lua, csrc/store_bucket.c)."""

from __future__ import annotations

from .. import _accel
from ..policy import MAX_LIMIT, SCALE
from .base import Algorithm, PolicyArgs, capacity_and_window

BUCKET_BURST_BOUND_S: int = _accel.MAX_LONG_WINDOW_S
"""A bucket's burst refills within ten 360-day years (the longest window), in whole windows."""

MAX_SAFE_INTEGER: int = _accel.MAX_SAFE_INTEGER
"""2**53: every integer up to here is exact in a Lua number."""

ACCRUAL_EXACT_WINDOW_MS: int = _accel.ACCRUAL_EXACT_WINDOW_MS
"""Largest window_ms whose squared size stays within 2**53: window_ms * (window_ms - 1) <= 2**53."""


def accrual_max_limit(window_s: int) -> int:
    """credit = elapsed_ms * (C mod W) // W must stay within 2**53.

    With elapsed_ms <= W and C mod W < W that holds for any C while W * (W - 1)
    <= 2**53 (every window up to 26 hours); beyond, C <= 2**53 // W keeps C < W,
    so the product is at most W * C <= 2**53.
    """
    window_ms = window_s * 1000
    if window_ms <= ACCRUAL_EXACT_WINDOW_MS:
        return MAX_LIMIT
    return min(MAX_LIMIT, MAX_SAFE_INTEGER // window_ms // SCALE)


def bucket_algorithm(
    name: str,
    key_tag: str,
    state_suffixes: tuple[str, ...],
    policy_args: PolicyArgs = capacity_and_window,
) -> Algorithm:
    """A bucket's registry entry: this exact range, and a burst refilled within
    BUCKET_BURST_BOUND_S."""
    return Algorithm(
        name,
        key_tag,
        state_suffixes,
        policy_args,
        max_limit=accrual_max_limit,
        burst_bound_s=BUCKET_BURST_BOUND_S,
    )
