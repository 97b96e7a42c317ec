"""The fixed window: a counter per window (lua/fixed_window.lua, csrc/store_fixed_window.c)."""

from __future__ import annotations

from .base import WINDOW_INDEX, Algorithm, any_limit, capacity_and_window

ALGORITHM = Algorithm(
    name="fixed_window",
    key_tag="fw",
    policy_args=capacity_and_window,
    max_limit=any_limit,
    state_suffixes=(WINDOW_INDEX,),
)
