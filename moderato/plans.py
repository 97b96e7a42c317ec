"""What a check needs from its rate string and algorithm, worked out once per pair.

A check names its rate as text and its algorithm by name; parsing the one,
looking up the other, deriving the scripts' per-policy arguments and the shape
of the result takes longer than the C store's whole decision. So the limiter
keeps a Plan per ``(rate, algorithm)`` pair it has seen and a check costs one
dict lookup.
"""

from __future__ import annotations

import threading
from typing import Optional

from .algorithms import Algorithm, ScriptArg, get_algorithm
from .errors import RateLimitConfigError
from .policy import SCALE, Policy, policy_for
from .results import CheckResult, PolicyState

ResultShape = tuple[type, type, str, str, tuple[tuple[int, int], ...]]
"""``_accel.check_result``'s plan: the result classes, rate text, algorithm, (limit, window_s)s."""

# Rates are usually written in code, a handful per application; a service
# that builds them per tenant could make many. Past this many pairs the cache
# starts over rather than grow without bound.
MAX_PLANS = 4096


class Plan:
    """A rate string and an algorithm, ready for the backend and for the result."""

    __slots__ = ("algorithm", "policy", "result_shape", "script_args", "script_name", "unit_args")

    def __init__(self, policy: Policy, algorithm: Algorithm) -> None:
        algorithm.check_exact_range(policy)
        self.policy = policy
        self.algorithm = algorithm
        self.script_args: tuple[ScriptArg, ...] = tuple(
            arg for rate in policy.rates for arg in algorithm.policy_args(rate)
        )
        self.script_name = algorithm.name
        # The whole argument list of the commonest call (cost 1, applied), built
        # once: a check of another cost or a peek builds its own.
        self.unit_args: tuple[ScriptArg, ...] = (SCALE, 1, *self.script_args)
        self.result_shape: ResultShape = (
            CheckResult,
            PolicyState,
            policy.text,
            algorithm.name,
            tuple((rate.limit, rate.window_s) for rate in policy.rates),
        )


class Plans:
    """Plans by ``(rate, algorithm name)``; ``None`` as the name means the default."""

    def __init__(self, default: Algorithm) -> None:
        self.default = default
        self._plans: dict[tuple[str, Optional[str]], Plan] = {}
        self.defaults: dict[str, Plan] = {}
        """The plans of the default algorithm by rate text alone: the commonest
        check's lookup, without a tuple to build and hash (read without the lock)."""
        self._lock = threading.Lock()

    def get(self, rate: object, algorithm: object) -> Plan:
        """The plan for this pair; RateLimitConfigError for a bad rate or algorithm name."""
        try:
            return self._plans[rate, algorithm]  # type: ignore[index]
        except (KeyError, TypeError):  # new, or unhashable (and so invalid)
            pass
        if not isinstance(rate, str):
            raise RateLimitConfigError(
                f"rate must be a string such as '100/minute', got {type(rate).__name__}"
            )
        chosen = self.default if algorithm is None else get_algorithm(algorithm)
        plan = Plan(policy_for(rate), chosen)
        with self._lock:
            if len(self._plans) >= MAX_PLANS:
                self._plans = {}
                self.defaults.clear()  # in place: limiters hold this very dict
            self._plans[rate, algorithm] = plan  # type: ignore[index]
            if algorithm is None:
                self.defaults[rate] = plan
        return plan
