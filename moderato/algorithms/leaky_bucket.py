"""The leaky bucket: a level drained at one capacity per window, the token bucket's dual
(lua/leaky_bucket.lua, csrc/store_leaky_bucket.c)."""

from __future__ import annotations

from .accrual import BUCKET_BURST_BOUND_S, accrual_max_limit
from .base import Algorithm

ALGORITHM = Algorithm(
    name="leaky_bucket",
    key_tag="lb",
    state_suffixes=(":leaky",),
    max_limit=accrual_max_limit,
    burst_bound_s=BUCKET_BURST_BOUND_S,
)
