"""The leaky bucket: a level drained at one capacity per window, the token bucket's dual
(lua/leaky_bucket.lua, csrc/store_leaky_bucket.c)."""

from __future__ import annotations

from .accrual import accrual_max_limit
from .base import Algorithm, capacity_and_window

ALGORITHM = Algorithm(
    name="leaky_bucket",
    key_tag="lb",
    policy_args=capacity_and_window,
    max_limit=accrual_max_limit,
    state_suffixes=(":leaky",),
)
