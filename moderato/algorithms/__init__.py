"""The registry of algorithms: one module each, one line each below.

Everything Python knows about an algorithm is in its module
(``moderato/algorithms/<name>.py``): its registry entry (``base.Algorithm``),
its script arguments, its exact range and its state keys. scripts.py, reset
and the memory store derive from this table; nothing else in the package
branches on an algorithm's name. docs/architecture.md's checklist for adding
one is enforced by tests/unit/test_algorithms.py.
"""

from __future__ import annotations

from ..errors import RateLimitConfigError
from ..habits import algorithm_hint
from . import fixed_window, gcra, leaky_bucket, sliding_log, sliding_window, token_bucket
from .base import WINDOW_INDEX, Algorithm, ScriptArg


def _registry(*algorithms: Algorithm) -> dict[str, Algorithm]:
    registry = {algorithm.name: algorithm for algorithm in algorithms}
    tags = {algorithm.key_tag for algorithm in algorithms}
    if len(registry) != len(algorithms) or len(tags) != len(algorithms):
        raise RuntimeError("every algorithm needs its own name and key tag")
    # reset() without a rate finds an identity's keys with the SCAN pattern
    # `<prefix>:??:{...}:*`, which only two-character tags satisfy.
    if any(len(tag) != 2 for tag in tags):
        raise RuntimeError("every algorithm's key tag must be two characters long")
    return registry


ALGORITHMS: dict[str, Algorithm] = _registry(
    fixed_window.ALGORITHM,
    token_bucket.ALGORITHM,
    sliding_window.ALGORITHM,
    gcra.ALGORITHM,
    sliding_log.ALGORITHM,
    leaky_bucket.ALGORITHM,
)

RESET_SUFFIXES: tuple[str, ...] = tuple(
    dict.fromkeys(
        suffix for algorithm in ALGORITHMS.values() for suffix in algorithm.state_suffixes
    )
)
"""What reset deletes under each base key (the base itself too): every algorithm's state."""

DEFAULT_ALGORITHM = "fixed_window"


def get_algorithm(name: object) -> Algorithm:
    algorithm = ALGORITHMS.get(name) if isinstance(name, str) else None
    if algorithm is None:
        known = ", ".join(repr(n) for n in ALGORITHMS)
        hint = algorithm_hint(name, ALGORITHMS)
        raise RateLimitConfigError(f"unknown algorithm {name!r}{hint}; expected one of {known}")
    return algorithm


__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "RESET_SUFFIXES",
    "WINDOW_INDEX",
    "Algorithm",
    "ScriptArg",
    "get_algorithm",
]
