"""A circuit breaker for the backend: fail fast while Redis is known to be down.

After ``failure_threshold`` consecutive backend failures the breaker opens:
checks fail at once (or bypass, under fail-open) for ``cooldown_s`` instead of
each waiting out a timeout. Then one check is let through as a probe; its
success closes the breaker, its failure opens it for another cool-down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

logger = logging.getLogger("moderato")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown_s: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Optional[Callable[[str], None]] = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if cooldown_s <= 0:
            raise ValueError(f"cooldown_s must be positive, got {cooldown_s}")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()  # one limiter may serve several event loops
        self.state = CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False

    def allow(self) -> bool:
        """May a call go to the backend now? (While half-open, only the single probe may.)"""
        if self.state == CLOSED:
            return True
        with self._lock:
            if self.state == OPEN and self._clock() - self._opened_at >= self.cooldown_s:
                self._set(HALF_OPEN)
            if self.state == HALF_OPEN and not self._probing:
                self._probing = True
                return True
            return self.state == CLOSED

    def retry_in_s(self) -> float:
        return max(0.0, self.cooldown_s - (self._clock() - self._opened_at))

    def success(self) -> None:
        if self.state == CLOSED and self._failures == 0:
            return
        with self._lock:
            self._failures = 0
            self._probing = False
            if self.state != CLOSED:
                self._set(CLOSED)

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            self._probing = False
            if self.state == HALF_OPEN or (
                self.state == CLOSED and self._failures >= self.failure_threshold
            ):
                self._opened_at = self._clock()
                self._set(OPEN)

    def abandon(self) -> None:
        """The call was cancelled: it proved nothing, so let another call probe."""
        if self._probing:
            with self._lock:
                self._probing = False

    def _set(self, state: str) -> None:
        previous, self.state = self.state, state
        if state == OPEN:
            logger.warning(
                "moderato: backend circuit breaker opened after %d consecutive failures; "
                "checks fail fast for %.2f s",
                self._failures,
                self.cooldown_s,
            )
        elif state == CLOSED:
            logger.warning("moderato: backend circuit breaker closed (was %s)", previous)
        if self._on_change is not None:
            self._on_change(state)
