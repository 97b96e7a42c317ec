"""The registry of algorithms: each is a name, a key tag, a Lua script and its arguments.

Adding an algorithm means adding one entry here (and its script); nothing else
in the package branches on the algorithm's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from .errors import RateLimitConfigError
from .policy import MaxLimit, Rate, accrual_max_limit, any_limit, gcra_max_limit

ScriptArg = Union[int, str]


def _capacity_and_window(rate: Rate) -> tuple[ScriptArg, ...]:
    return (rate.capacity_scaled, rate.window_s)


def _token_bucket_args(rate: Rate) -> tuple[ScriptArg, ...]:
    # An empty refill rate selects the exact public rule: one capacity per window.
    return (rate.capacity_scaled, rate.window_s, "")


@dataclass(frozen=True)
class Algorithm:
    name: str
    key_tag: str
    """Short tag inside every key, so algorithms never share (and never WRONGTYPE) a key."""
    script: str
    policy_args: Callable[[Rate], tuple[ScriptArg, ...]]
    max_limit: MaxLimit
    """The exact range: the largest limit decided exactly for a window (policy.py)."""


ALGORITHMS: dict[str, Algorithm] = {
    algorithm.name: algorithm
    for algorithm in (
        Algorithm("fixed_window", "fw", "fixed_window", _capacity_and_window, any_limit),
        Algorithm("token_bucket", "tb", "token_bucket", _token_bucket_args, accrual_max_limit),
        Algorithm("sliding_window", "sw", "sliding_window", _capacity_and_window, any_limit),
        Algorithm("gcra", "gc", "gcra", _capacity_and_window, gcra_max_limit),
        Algorithm("sliding_log", "sl", "sliding_log", _capacity_and_window, any_limit),
        Algorithm("leaky_bucket", "lb", "leaky_bucket", _capacity_and_window, accrual_max_limit),
    )
}

# reset() without a rate finds an identity's keys with the SCAN pattern
# `<prefix>:??:{...}:*`, which only two-character tags satisfy.
if any(len(algorithm.key_tag) != 2 for algorithm in ALGORITHMS.values()):
    raise RuntimeError("every algorithm's key tag must be two characters long")

DEFAULT_ALGORITHM = "fixed_window"


def get_algorithm(name: object) -> Algorithm:
    algorithm = ALGORITHMS.get(name) if isinstance(name, str) else None
    if algorithm is None:
        known = ", ".join(repr(n) for n in ALGORITHMS)
        raise RateLimitConfigError(f"unknown algorithm {name!r}; expected one of {known}")
    return algorithm
