"""What a decision tells the caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PolicyState:
    """One policy's view of a decision (several policies can be decided at once)."""

    limit: int
    window_seconds: int
    remaining: Optional[int]
    """Whole unit-cost requests that still fit, rounded down; None when unknown (bypass)."""
    retry_after: Optional[int]
    """Seconds until the cost fits (rounded up); 0 when admitted; None if it never will."""
    reset_at: Optional[float]
    """Unix time from the backend's clock; None for a permanent denial or a bypass."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    The top-level fields describe the deciding policy: on a denial the one
    that must be waited on longest, on an admission the one with the fewest
    requests left (the one that headers report).
    """

    allowed: bool
    limit: int
    remaining: Optional[int]
    retry_after: Optional[int]
    reset_at: Optional[float]
    window_seconds: int
    rate: str
    algorithm: str
    policies: tuple[PolicyState, ...] = ()
    bypassed: bool = False
    """True when the backend could not decide and fail-open let the request through."""
    shadow_denied: bool = False
    """True when the limit denied the request but shadow mode let it through."""

    @property
    def permanent(self) -> bool:
        """A denial that waiting cannot fix: the cost exceeds the policy's capacity."""
        return not self.allowed and self.retry_after is None

    @property
    def status_code(self) -> int:
        if self.allowed:
            return 200
        return 422 if self.permanent else 429
