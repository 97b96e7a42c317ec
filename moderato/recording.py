"""What the limiter tells a recorder about each check, when one is attached.

``RateLimiter.recorder`` is None by default, and the check path then calls
nothing. The operator's dashboard (moderato.dashboard) attaches its
DecisionRecorder; anything with these two methods can be attached instead.
Both are called on the check path, so they must be cheap and must not raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .plans import Plan
    from .results import CheckResult


class CheckRecorder(Protocol):
    def decided(
        self, plan: Plan, key: object, scope: object, result: CheckResult, started_s: float
    ) -> None:
        """A check the backend decided (a bypass of checks decided together included);
        ``started_s`` is ``time.perf_counter()`` taken before it."""

    def failed(self, plan: Plan, scope: object, error: BaseException, bypassed: bool) -> None:
        """A check the backend could not decide: let through (fail-open) or raised."""
