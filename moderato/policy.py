"""Rates and costs, parsed and validated once, before any backend is contacted."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

from . import _accel
from .errors import RateLimitConfigError

# The contract's numbers come from csrc/contract.h, through the C module;
# tests/unit/test_algorithms.py checks every other language's copy against it.
SCALE: int = _accel.SCALE
"""Capacity and costs travel scaled by this factor (1/1000-unit precision)."""

MAX_LIMIT: int = _accel.MAX_LIMIT
"""Largest public limit: scaled capacity times a permille weight stays below 2**53."""

MAX_WINDOW_S: int = _accel.MAX_WINDOW_S
"""Longest window of the direct backend contract; every limit up to MAX_LIMIT is exact within it."""

MAX_LONG_WINDOW_S: int = _accel.MAX_LONG_WINDOW_S
"""Longest window a rate string may name (ten 360-day years): the long-window path.

Above a day each algorithm admits the limits its integer arithmetic keeps
exact for that window (docs/internals.md, "Long windows"); each algorithm's
``max_limit`` (moderato/algorithms/) is its range, and the scripts and
``memory://`` refuse the rest.
"""


@dataclass(frozen=True)
class Rate:
    """One policy: ``limit`` requests per ``window_s`` seconds."""

    limit: int
    window_s: int

    @property
    def capacity_scaled(self) -> int:
        return self.limit * SCALE

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    def __str__(self) -> str:
        return f"{self.limit}/{self.window_s} seconds"


@dataclass(frozen=True)
class Policy:
    """A parsed rate string: one or more rates decided together, atomically; or one rate
    with a burst (``with_burst``): a bucket that holds ``burst`` requests and refills the
    rate's limit per window."""

    text: str
    rates: tuple[Rate, ...]
    burst: Optional[int] = None
    """What the bucket holds, apart from the one rate's limit; None: the limit."""
    # Derived once here: every check reads them.
    windows_s: tuple[int, ...] = field(init=False, compare=False, repr=False)
    smallest_limit: int = field(init=False, compare=False, repr=False)
    """The most the tightest policy admits at once (its limit, or the burst): a cost
    above it can never fit."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows_s", tuple(rate.window_s for rate in self.rates))
        smallest = min(rate.limit for rate in self.rates) if self.burst is None else self.burst
        object.__setattr__(self, "smallest_limit", smallest)

    @property
    def described(self) -> str:
        """How messages name it: ``'10/second'``, or ``'10/second' with burst 50``."""
        return f"'{self.text}'" if self.burst is None else f"'{self.text}' with burst {self.burst}"

    def with_burst(self, burst: object) -> Policy:
        """This one-rate policy holding ``burst`` requests, refilled at its rate; itself
        when the burst is its limit (the same policy). RateLimitConfigError for a burst
        that is not an int 1..MAX_LIMIT, or a rate of several policies."""
        burst = validate_burst(burst)
        if len(self.rates) != 1:
            raise RateLimitConfigError(
                f"burst= applies to a rate of one policy, got '{self.text}' "
                f"({len(self.rates)} policies): give the bursting rate its own limit "
                "beside the others (several limits of one request are decided together, "
                "atomically), e.g. limit('10/second', burst=50) and limit('1000/hour')"
            )
        if burst == self.rates[0].limit:
            return self
        return Policy(text=self.text, rates=self.rates, burst=burst)


def parse_rate(text: str) -> tuple[Rate, ...]:
    """Parse ``"100/minute"``, ``"10 per second"``, ``"5/2 days"``, ``"1000/month"``,
    ``"5/min"`` or several joined by ``;``, ``,`` or ``|`` (limits' and throttled-py's grammar).

    Raises ``ValueError`` naming the input and the accepted grammar. Algorithms'
    exact ranges are checked when a policy is planned, not here.
    """
    return tuple(Rate(limit, window_s) for limit, window_s in _accel.parse_rate(text))


@lru_cache(maxsize=4096)
def policy_for(text: str) -> Policy:
    """The cached Policy for a rate string; bad rates become RateLimitConfigError."""
    if not isinstance(text, str):
        raise RateLimitConfigError(
            f"rate must be a string such as '100/minute', got {type(text).__name__}"
        )
    try:
        rates = parse_rate(text)
    except ValueError as exc:
        raise RateLimitConfigError(str(exc)) from None
    return Policy(text=text, rates=rates)


def validate_burst(burst: object) -> int:
    """A burst is an int 1..MAX_LIMIT; bools, floats and everything else are configuration
    errors."""
    if isinstance(burst, bool) or not isinstance(burst, int):
        raise RateLimitConfigError(
            f"burst must be a positive integer (the most requests admitted at once), "
            f"got {type(burst).__name__} {burst!r:.80}"
        )
    if not 1 <= burst <= MAX_LIMIT:
        raise RateLimitConfigError(f"burst must be 1..{MAX_LIMIT}, got {burst}")
    return burst


def validate_cost(cost: object) -> int:
    """A cost is a positive int; bools, floats and everything else are configuration errors."""
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise RateLimitConfigError(
            f"cost must be a positive integer, got {type(cost).__name__} {cost!r}"
        )
    if cost < 1:
        raise RateLimitConfigError(f"cost must be a positive integer, got {cost}")
    return cost


def cost_scaled(cost: int) -> int:
    """Scale a validated cost; any cost above every possible capacity is clamped.

    Clamping keeps the argument inside Lua's exact integer range while still
    exceeding the largest capacity, so the decision stays a permanent denial.
    """
    return min(cost, MAX_LIMIT + 1) * SCALE
