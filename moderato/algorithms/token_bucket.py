"""The token bucket: tokens refilled at one capacity per window (lua/token_bucket.lua,
csrc/store_token_bucket.c)."""

from __future__ import annotations

from ..policy import Rate
from .accrual import bucket_algorithm
from .base import ScriptArg


def policy_args(rate: Rate) -> tuple[ScriptArg, ...]:
    # An empty refill rate selects the exact public rule: one capacity per window.
    return (rate.capacity_scaled, rate.window_s, "")


ALGORITHM = bucket_algorithm(
    name="token_bucket",
    key_tag="tb",
    # ":bucket" is the state of releases before v2, still deleted by reset.
    state_suffixes=(":bucket:v2", ":bucket"),
    policy_args=policy_args,
)
