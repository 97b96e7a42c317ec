"""The sliding log: every admission in a sorted set, with running totals
(lua/sliding_log.lua, csrc/store_sliding_log.c)."""

from __future__ import annotations

from .base import Algorithm, any_limit, capacity_and_window

ALGORITHM = Algorithm(
    name="sliding_log",
    key_tag="sl",
    policy_args=capacity_and_window,
    max_limit=any_limit,
    state_suffixes=(":log",),
)
