"""The leaky bucket: a level drained at one capacity per window, the token bucket's dual
(lua/leaky_bucket.lua, csrc/store_leaky_bucket.c)."""

from __future__ import annotations

from .accrual import bucket_algorithm

ALGORITHM = bucket_algorithm(name="leaky_bucket", key_tag="lb", state_suffixes=(":leaky",))
