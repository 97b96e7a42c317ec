"""What a check needs from its rate string and algorithm, worked out once per pair.

A check names its rate as text and its algorithm by name; parsing the one,
looking up the other, deriving the scripts' per-policy arguments and the shape
of the result takes longer than the C store's whole decision. So the limiter
keeps a Plan per ``(rate, algorithm)`` pair it has seen (and per ``(rate,
algorithm, burst)`` for a burst) and a check costs one dict lookup.
"""

from __future__ import annotations

import threading
from typing import Optional

from .algorithms import ALGORITHMS, Algorithm, ScriptArg, get_algorithm
from .errors import RateLimitConfigError
from .policy import SCALE, Policy, policy_for
from .results import CheckResult, PolicyState

ResultShape = tuple[type, type, str, str, tuple[tuple[int, ...], ...]]
"""``_accel.check_result``'s plan: the result classes, rate text, algorithm, and per policy
(limit, window_s), or (burst, window_s, refill) for a burst."""

# Rates are usually written in code, a handful per application; a service
# that builds them per tenant could make many. Past this many pairs the cache
# starts over rather than grow without bound.
MAX_PLANS = 4096

BURST_ALGORITHMS = tuple(name for name, entry in ALGORITHMS.items() if entry.burst_bound_s)
"""The algorithms that take a burst: those that refill a bucket."""


class Plan:
    """A rate string and an algorithm, ready for the backend and for the result."""

    __slots__ = (
        "algorithm",
        "key_tag",
        "policy",
        "result_shape",
        "script_args",
        "script_name",
        "unit_args",
        "windows_s",
    )

    def __init__(self, policy: Policy, algorithm: Algorithm) -> None:
        algorithm.check_exact_range(policy)
        algorithm.check_burst(policy)
        self.policy = policy
        self.algorithm = algorithm
        # What every check's keys are built from (KeySpace.plan_keys), read once here.
        self.key_tag = algorithm.key_tag
        self.windows_s = policy.windows_s
        args = [arg for rate in policy.rates for arg in algorithm.policy_args(rate)]
        limits: tuple[tuple[int, ...], ...]
        if policy.burst is None:
            limits = tuple((rate.limit, rate.window_s) for rate in policy.rates)
        else:
            # The bucket holds the burst (the result's limit) and refills the rate's limit.
            (rate,) = policy.rates
            args.append(policy.burst * SCALE)
            limits = ((policy.burst, rate.window_s, rate.limit),)
        self.script_args: tuple[ScriptArg, ...] = tuple(args)
        self.script_name = algorithm.name
        # The whole argument list of the commonest call (cost 1, applied), built
        # once: a check of another cost or a peek builds its own.
        self.unit_args = self.arguments(SCALE, True)
        self.result_shape: ResultShape = (
            CheckResult,
            PolicyState,
            policy.text,
            algorithm.name,
            limits,
        )

    def arguments(self, cost_scaled: int, apply: bool) -> tuple[ScriptArg, ...]:
        """The decision script's arguments for one check of ``cost_scaled`` (``apply``
        False: a peek); a backend takes ``unit_args`` for a unit cost, applied."""
        return (cost_scaled, 1 if apply else 0, *self.script_args)


def check_burst_algorithm(algorithm: Algorithm) -> None:
    """Refuse a burst for an algorithm that takes none."""
    if not algorithm.burst_bound_s:
        takes = ", ".join(BURST_ALGORITHMS)
        raise RateLimitConfigError(
            f"burst= needs an algorithm that refills a bucket ({takes}); {algorithm.name} "
            "counts requests per window, so its capacity is its limit. Choose one of "
            "those, or cap bursts with a second, shorter policy: '6000/hour;100/minute'"
        )


def burst_policy(policy: Policy, algorithm: Algorithm, burst: object) -> Policy:
    """``policy`` with ``burst`` for ``algorithm``: refused on an algorithm that takes
    none, then as ``Policy.with_burst`` refuses."""
    check_burst_algorithm(algorithm)
    return policy.with_burst(burst)


class Plans:
    """Plans by ``(rate, algorithm name)``, or ``(rate, algorithm name, burst)``; ``None``
    as the name means the default."""

    def __init__(self, default: Algorithm) -> None:
        self.default = default
        self._plans: dict[tuple[str, Optional[str]], Plan] = {}
        self.defaults: dict[str, Plan] = {}
        """The plans of the default algorithm by rate text alone: the commonest
        check's lookup, without a tuple to build and hash (read without the lock)."""
        self._burst_plans: dict[tuple[str, Optional[str], int], Plan] = {}
        self._lock = threading.Lock()

    def get(self, rate: object, algorithm: object, burst: object = None) -> Plan:
        """The plan for this pair (and burst); RateLimitConfigError for a bad rate,
        algorithm name or burst."""
        if burst is not None:
            return self._with_burst(rate, algorithm, burst)
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

    def _with_burst(self, rate: object, algorithm: object, burst: object) -> Plan:
        # Only an int is looked up: to a dict, True is 1 and 50.0 is 50.
        if type(burst) is int:
            try:
                return self._burst_plans[rate, algorithm, burst]  # type: ignore[index]
            except (KeyError, TypeError):
                pass
        if not isinstance(rate, str):
            raise RateLimitConfigError(
                f"rate must be a string such as '100/minute', got {type(rate).__name__}"
            )
        chosen = self.default if algorithm is None else get_algorithm(algorithm)
        plan = Plan(burst_policy(policy_for(rate), chosen, burst), chosen)
        with self._lock:
            if len(self._burst_plans) >= MAX_PLANS:
                self._burst_plans = {}
            self._burst_plans[rate, algorithm, burst] = plan  # type: ignore[index]
        return plan
