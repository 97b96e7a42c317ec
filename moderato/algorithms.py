"""The registry of algorithms: everything that varies by algorithm hangs off one entry.

An entry names the algorithm, its key tag, its Lua script (lua/),
the per-policy script arguments, the state keys it derives from a base key
(which reset deletes), the layout of its reply, and its in-process
implementation (the C store's name for it). scripts.py, reset and the
memory store derive from this table; nothing else in the package branches on
an algorithm's name. docs/architecture.md's checklist for adding one is
enforced by tests/test_algorithms.py.
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


WINDOW_INDEX = ":#"
"""A state suffix standing for ``<base>:<index>`` and ``<base>:<index - 1>``,
index = floor(now_ms / window_ms): the current and previous window's counters."""

DECISION_REPLY = "decision"
"""``[allowed, deciding, (remaining_scaled, retry_ms, reset_ms) * policies]``
(docs/internals.md), decoded by ``_accel.check_result``."""


@dataclass(frozen=True)
class Algorithm:
    name: str
    key_tag: str
    """Short tag inside every key, so algorithms never share (and never WRONGTYPE) a key."""
    script: str
    """Its Lua script: lua/<script>.lua."""
    policy_args: Callable[[Rate], tuple[ScriptArg, ...]]
    max_limit: MaxLimit
    """The exact range: the largest limit decided exactly for a window (policy.py)."""
    state_suffixes: tuple[str, ...]
    """The keys it keeps under a policy's base key: suffixes, or WINDOW_INDEX."""
    reply: str = DECISION_REPLY
    """Its reply's layout."""
    in_process: str = ""
    """Its name in the C store (``_accel.MemoryStore.decide``); default: ``name``."""

    def __post_init__(self) -> None:
        if not self.in_process:
            object.__setattr__(self, "in_process", self.name)


ALGORITHMS: dict[str, Algorithm] = {
    algorithm.name: algorithm
    for algorithm in (
        Algorithm(
            "fixed_window", "fw", "fixed_window", _capacity_and_window, any_limit, (WINDOW_INDEX,)
        ),
        # ":bucket" is the state of releases before v2, still deleted by reset.
        Algorithm(
            "token_bucket",
            "tb",
            "token_bucket",
            _token_bucket_args,
            accrual_max_limit,
            (":bucket:v2", ":bucket"),
        ),
        Algorithm(
            "sliding_window",
            "sw",
            "sliding_window",
            _capacity_and_window,
            any_limit,
            (WINDOW_INDEX,),
        ),
        Algorithm("gcra", "gc", "gcra", _capacity_and_window, gcra_max_limit, (":gcra",)),
        Algorithm("sliding_log", "sl", "sliding_log", _capacity_and_window, any_limit, (":log",)),
        Algorithm(
            "leaky_bucket",
            "lb",
            "leaky_bucket",
            _capacity_and_window,
            accrual_max_limit,
            (":leaky",),
        ),
    )
}

RESET_SUFFIXES: tuple[str, ...] = tuple(
    dict.fromkeys(
        suffix for algorithm in ALGORITHMS.values() for suffix in algorithm.state_suffixes
    )
)
"""What reset deletes under each base key (the base itself too): every algorithm's state."""

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
