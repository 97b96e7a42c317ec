"""The sliding window: this window's counter plus the previous one's, weighted by what is
left of it (lua/sliding_window.lua, csrc/store_sliding_window.c)."""

from __future__ import annotations

from .base import WINDOW_INDEX, Algorithm, any_limit, capacity_and_window

ALGORITHM = Algorithm(
    name="sliding_window",
    key_tag="sw",
    policy_args=capacity_and_window,
    max_limit=any_limit,
    state_suffixes=(WINDOW_INDEX,),
)
