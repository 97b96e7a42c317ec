"""A circuit breaker for the backend: fail fast while Redis is known to be down.

After ``failure_threshold`` consecutive backend failures the breaker opens:
checks fail at once (or bypass, under fail-open) for ``cooldown_s`` instead of
each waiting out a timeout. Then one check is let through as a probe; its
success closes the breaker, its failure opens it for another cool-down.

On a Redis Cluster each node fails on its own (a paused primary, a slot being
migrated), so the limiter keeps one breaker per primary (``BreakerSet``): the
failures of one node open only that node's breaker, and checks whose keys
live elsewhere go on being decided. A single server has one breaker. A
CLUSTERDOWN answer is the cluster's state, not the answering node's
failure: like any error reply, it opens no breaker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

from .redis.cluster_map import grown

logger = logging.getLogger("moderato")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


STATE_SEVERITY = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown_s: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Optional[Callable[[str], None]] = None,
        node: Optional[str] = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if cooldown_s <= 0:
            raise ValueError(f"cooldown_s must be positive, got {cooldown_s}")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        # The cluster node this breaker guards (None: the whole backend).
        self.node = node
        self._lock = threading.Lock()  # one limiter may serve several event loops
        self.state = CLOSED
        self._failures = 0
        # Closed with no failure counted: success() has nothing to do, so every
        # check's path may skip calling it (kept in step by success, failure, _set).
        self.settled = True
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
            self.settled = True

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            self._probing = False
            self.settled = False
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

    def like(
        self, node: Optional[str], on_change: Optional[Callable[[str], None]]
    ) -> CircuitBreaker:
        """A new, closed breaker with this one's settings, for ``node``."""
        return CircuitBreaker(
            self.failure_threshold,
            self.cooldown_s,
            clock=self._clock,
            on_change=on_change,
            node=node,
        )

    def describe(self) -> str:
        """``backend circuit breaker`` or, for one node, ``... for node host:port``."""
        if self.node is None:
            return "backend circuit breaker"
        return f"backend circuit breaker for node {self.node}"

    def _set(self, state: str) -> None:
        previous, self.state = self.state, state
        self.settled = state == CLOSED and self._failures == 0
        if state == OPEN:
            logger.warning(
                "moderato: %s opened after %d consecutive failures; checks fail fast for %.2f s",
                self.describe(),
                self._failures,
                self.cooldown_s,
            )
        elif state == CLOSED:
            logger.warning("moderato: %s closed (was %s)", self.describe(), previous)
        if self._on_change is not None:
            self._on_change(state)


class BreakerSet:
    """The backend-wide breaker plus one breaker per cluster node, made on first use.

    ``for_node(None)`` is the backend-wide one: a single server's only
    breaker, and on a cluster the one for calls whose node is not known yet
    (no slot map loaded). ``on_change`` gets the most severe state of them
    all (open, then half-open, then closed) whenever one changes.
    """

    def __init__(
        self, settings: CircuitBreaker, on_change: Optional[Callable[[str], None]] = None
    ) -> None:
        """Breakers with the ``settings`` breaker's threshold, cooldown and clock."""
        self._on_change = on_change
        self._lock = threading.Lock()
        self.default = settings.like(None, self._changed)
        # Copy on write under _lock: the check path reads it without locking.
        self._by_node: dict[str, CircuitBreaker] = {}

    def for_node(self, node: Optional[str]) -> CircuitBreaker:
        if node is None:
            return self.default
        breaker = self._by_node.get(node)
        if breaker is not None:
            return breaker
        with self._lock:
            self._by_node = grown(
                self._by_node, node, lambda: self.default.like(node, self._changed)
            )
            return self._by_node[node]

    def nodes(self) -> dict[str, str]:
        """{node: state} of every per-node breaker made so far."""
        return {node: breaker.state for node, breaker in self._by_node.items()}

    def worst_state(self) -> str:
        states = [self.default.state, *(b.state for b in self._by_node.values())]
        return max(states, key=STATE_SEVERITY.__getitem__)

    def _changed(self, _state: str) -> None:
        if self._on_change is not None:
            self._on_change(self.worst_state())
