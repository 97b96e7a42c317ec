"""What one process has decided, counted as it happens, for the dashboard.

The limiter calls ``decided`` or ``failed`` once per check when a recorder is
attached (``limiter.recorder``, a moderato.recording.CheckRecorder, set by the
Dashboard); with none attached the check path does not call anything. Each
call is O(1) and allocates nothing for an identity already counted on a limit
already seen: a float compare, a handful of integer increments, two dict
lookups, a table lookup for the latency, and for a denial one more lookup in
the heavy hitters. What it keeps is bounded whatever the traffic:

- decisions per second by outcome over the last ``history_s`` seconds (a ring);
- decisions by outcome per limit (rate, algorithm, scope, burst), up to
  ``max_limit_rows`` limits, the rest counted in one row for "other scopes";
- the most-denied identities (HeavyHitters, ``top_capacity`` counters), over
  the current and the previous ``hitters_epoch_s``;
- check latency (LatencyHistogram), over the current and previous ``latency_epoch_s``;
- the last ``max_errors`` backend errors (repeats of one message counted in place).

Counts are exact whichever threads record: the blocking limiter's checks
come from many threads at once (a thread pool, a threaded WSGI server), and
an asyncio limiter may be shared by several threads' loops. Every count is
changed, and every reading taken, under one lock: a ``+= 1`` is a read, an
add and a store, and two threads between them would lose an increment.
Uncontended, the lock adds ~1,400 instructions to a call (6,819 -> 8,220 for
``decided`` alone, callgrind, benchmarks/recorder_threads.py); ``on_second``
runs under it, so it must not record.

Time: the decision's own end, read from ``time.perf_counter`` (the latency
needs it anyway) and placed on the wall clock by an offset measured once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from .sketches import (
    BUCKET_COUNT,
    FAST_BITS,
    FAST_BUCKETS,
    FAST_LATENCY_US,
    SUB_BUCKETS,
    HeavyHitters,
    LatencyHistogram,
)

if TYPE_CHECKING:
    from ..plans import Plan
    from ..results import CheckResult

OUTCOMES = ("allowed", "denied", "permanent", "bypassed", "error", "shadow_denied")
"""What a check can end in, in the order every count list uses."""
ALLOWED, DENIED, PERMANENT, BYPASSED, ERROR, SHADOW_DENIED = range(len(OUTCOMES))
OUTCOME_COUNT = len(OUTCOMES)

OTHER_SCOPES = "(other scopes)"
"""The scope of the row that counts limits seen after ``max_limit_rows`` were."""

LimitKey = tuple[str, str, str, Optional[int]]
"""A limit as the dashboard names it: (rate, algorithm, scope, burst or None)."""


class DecisionRecorder:
    """Counts one process's decisions; see the module docstring."""

    def __init__(
        self,
        *,
        history_s: int = 900,
        top_capacity: int = 64,
        max_limit_rows: int = 512,
        max_errors: int = 10,
        hitters_epoch_s: int = 300,
        latency_epoch_s: int = 60,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.history_s = history_s
        self.max_limit_rows = max_limit_rows
        self.hitters_epoch_s = hitters_epoch_s
        self.latency_epoch_s = latency_epoch_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._top_capacity = top_capacity
        self._max_errors = max_errors
        self.on_second: Optional[Callable[[], None]] = None
        """Called (from the check path) when a decision opens a new second: the
        publisher makes sure it runs, without a timer of its own in the check path."""
        self._start()
        _recorders.add(self)

    def _start(self) -> None:
        """Everything counted from zero, under a new process id (also after a fork)."""
        # A new lock after a fork too: another thread may have held the parent's then.
        self._lock = threading.Lock()
        self.process_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.pid = os.getpid()
        self.started_s = self._wall_clock()
        self._offset_s = self.started_s - self._clock()
        # One second back: the first decision opens a second, which starts the publisher.
        self._second = int(self._clock() + self._offset_s) - 1
        self._second_ends_s = self._second + 1 - self._offset_s
        """When the current second ends, on the check path's clock (one float compare)."""
        self._ring = [0] * (self.history_s * OUTCOME_COUNT)
        self._slot = (self._second % self.history_s) * OUTCOME_COUNT
        self.totals = [0] * OUTCOME_COUNT
        """Every decision since the start, by outcome (added up when a second closes)."""
        self._limits: dict[Plan, dict[object, list[int]]] = {}
        self._limit_rows = 0
        self._other_scopes: dict[Plan, list[int]] = {}
        self.hitters = HeavyHitters(self._top_capacity)
        self.previous_hitters = HeavyHitters(self._top_capacity)
        self.latency = LatencyHistogram()
        self.previous_latency = LatencyHistogram()
        self._latency_counts = self.latency.counts
        self._hitters_epoch = self._second // self.hitters_epoch_s
        self._latency_epoch = self._second // self.latency_epoch_s
        self.errors: deque[list[Any]] = deque(maxlen=self._max_errors)

    # -- the check path ------------------------------------------------------------

    def decided(
        self, plan: Plan, key: object, scope: object, result: CheckResult, started_s: float
    ) -> None:
        """A check the backend decided (``started_s``: ``time.perf_counter()`` before it)."""
        now_s = self._clock()
        if result.allowed:
            if result.shadow_denied:
                outcome = SHADOW_DENIED
            else:  # a bypass of several checks decided as one comes here, not to failed()
                outcome = BYPASSED if result.bypassed else ALLOWED
        else:
            outcome = PERMANENT if result.retry_after is None else DENIED
        # sketches.latency_bucket, inlined: a call fewer per check.
        elapsed_us = int((now_s - started_s) * 1e6)
        if elapsed_us < FAST_LATENCY_US:
            index = FAST_BUCKETS[elapsed_us] if elapsed_us >= 0 else 0
        else:
            shift = elapsed_us.bit_length() - FAST_BITS
            index = min(FAST_BUCKETS[elapsed_us >> shift] + shift * SUB_BUCKETS, BUCKET_COUNT - 1)
        # A row, once made, stays: found without the lock (a dict read is atomic).
        rows = self._limits.get(plan)
        counts = rows.get(scope) if rows is not None else None
        # Only the counting holds the lock, as briefly as it can: a thread the
        # interpreter switches out while holding it stalls every other recording thread.
        # acquire() and release() rather than ``with``: half the instructions (~1,000
        # against ~2,000 on CPython 3.11), and try/finally costs nothing until it raises.
        lock = self._lock
        lock.acquire()
        try:
            if now_s >= self._second_ends_s:
                self._advance(now_s)
            if counts is None:
                counts = self._new_row(plan, scope)
            if not result.allowed:
                self.hitters.add(key)  # type: ignore[arg-type]  # a check's key: str or bytes
            self._ring[self._slot + outcome] += 1
            counts[outcome] += 1
            self._latency_counts[index] += 1
        finally:
            lock.release()

    def failed(self, plan: Plan, scope: object, error: BaseException, bypassed: bool) -> None:
        """A check the backend could not decide: let through (fail-open) or raised."""
        now_s = self._clock()
        outcome = BYPASSED if bypassed else ERROR
        with self._lock:
            if now_s >= self._second_ends_s:
                self._advance(now_s)
            self._ring[self._slot + outcome] += 1
            self._new_row(plan, scope)[outcome] += 1
            self._note_error(error)

    # -- off the check path ---------------------------------------------------------

    def _new_row(self, plan: Plan, scope: object) -> list[int]:
        """The counts of a limit (made if it is seen for the first time), or of the
        overflow row. Called holding the lock: another thread may have made it since
        the caller looked."""
        rows = self._limits.setdefault(plan, {})
        counts = rows.get(scope)
        if counts is not None:
            return counts
        if self._limit_rows >= self.max_limit_rows or type(scope) is not str:
            counts = self._other_scopes.get(plan)
            if counts is None:
                counts = self._other_scopes[plan] = [0] * OUTCOME_COUNT
            return counts
        counts = rows[scope] = [0] * OUTCOME_COUNT
        self._limit_rows += 1
        return counts

    def _advance(self, now_s: float) -> None:
        """A decision in a new second: close the seconds since the last one."""
        current = self._second
        second = int(now_s + self._offset_s)
        if second <= current:
            return  # another thread's decision, a moment late: counted in this second
        ring, width = self._ring, OUTCOME_COUNT
        totals = self.totals
        closed = ring[self._slot : self._slot + width]
        for outcome in range(width):
            totals[outcome] += closed[outcome]
        for skipped in range(current + 1, min(second, current + self.history_s) + 1):
            start = (skipped % self.history_s) * width
            ring[start : start + width] = [0] * width
        self._second = second
        self._second_ends_s = second + 1 - self._offset_s
        self._slot = (second % self.history_s) * width
        if second // self.hitters_epoch_s != self._hitters_epoch:
            self._hitters_epoch = second // self.hitters_epoch_s
            self.previous_hitters, self.hitters = self.hitters, self.previous_hitters
            self.hitters.clear()
        if second // self.latency_epoch_s != self._latency_epoch:
            self._latency_epoch = second // self.latency_epoch_s
            self.previous_latency, self.latency = self.latency, self.previous_latency
            self.latency.clear()
            self._latency_counts = self.latency.counts
        if self.on_second is not None:
            self.on_second()

    def _note_error(self, error: BaseException) -> None:
        kind, message = type(error).__name__, str(error)
        now_s = self._wall_clock()
        errors = self.errors
        if errors and errors[-1][1] == kind and errors[-1][2] == message:
            errors[-1][0] = now_s
            errors[-1][3] += 1
        else:
            errors.append([now_s, kind, message, 1])

    # -- reading ----------------------------------------------------------------

    @property
    def current_second(self) -> int:
        """The wall-clock second the recorder counts in now (the last decision's)."""
        return self._second

    def now_second(self) -> int:
        """The wall-clock second it is (by the recorder's clock)."""
        return int(self._clock() + self._offset_s)

    def counts_at(self, second: int) -> list[int]:
        """The decisions of one second by outcome (zeros outside the ring's reach)."""
        with self._lock:
            return self._counts_at(second)

    def _counts_at(self, second: int) -> list[int]:
        if second > self._second or second <= self._second - self.history_s:
            return [0] * OUTCOME_COUNT
        start = (second % self.history_s) * OUTCOME_COUNT
        return self._ring[start : start + OUTCOME_COUNT]

    def series(self, last_second: int, length_s: int) -> list[list[int]]:
        """Per outcome, the decisions of each second up to ``last_second``, oldest first."""
        columns: list[list[int]] = [[] for _ in OUTCOMES]
        with self._lock:
            for second in range(last_second - length_s + 1, last_second + 1):
                for outcome, count in enumerate(self._counts_at(second)):
                    columns[outcome].append(count)
        return columns

    def all_totals(self) -> list[int]:
        """Every decision since the start, the current second's included."""
        with self._lock:
            current = self._ring[self._slot : self._slot + OUTCOME_COUNT]
            return [total + now for total, now in zip(self.totals, current)]

    def limit_rows(self) -> list[tuple[LimitKey, list[int]]]:
        """((rate, algorithm, scope, burst), counts by outcome) of every limit seen."""
        # Threads that met a rate first at the same instant may each have planned it:
        # two plans of one limit, whose rows are added up here.
        found: dict[LimitKey, list[int]] = {}
        with self._lock:
            for plan, rows in self._limits.items():
                rate, algorithm, burst = plan.policy.text, plan.algorithm.name, plan.policy.burst
                named = [((rate, algorithm, str(scope), burst), row) for scope, row in rows.items()]
                other = self._other_scopes.get(plan)
                if other is not None:
                    named.append(((rate, algorithm, OTHER_SCOPES, burst), other))
                for limit, counts in named:
                    total = found.get(limit)
                    if total is None:
                        found[limit] = list(counts)
                    else:
                        found[limit] = [a + b for a, b in zip(total, counts)]
        return list(found.items())

    def top_denied(self) -> dict[Union[str, bytes], int]:
        """Denials per identity over the current and previous epochs (heavy hitters)."""
        with self._lock:
            merged = dict(self.previous_hitters.counts)
            for item, count in self.hitters.counts.items():
                merged[item] = merged.get(item, 0) + count
        return merged

    def denial_error_bound(self) -> int:
        with self._lock:
            return self.previous_hitters.error_bound() + self.hitters.error_bound()

    def latency_buckets(self) -> dict[int, int]:
        """Check latency over the current and previous epochs, non-empty buckets by index."""
        with self._lock:
            merged = self.previous_latency.sparse()
            for index, count in self.latency.sparse().items():
                merged[index] = merged.get(index, 0) + count
        return merged

    def last_errors(self) -> list[list[Any]]:
        """The last errors, oldest first: [at_s, kind, message, count] each (copies)."""
        with self._lock:
            return [list(entry) for entry in self.errors]

    def after_fork_in_child(self) -> None:
        self._start()


_recorders: weakref.WeakSet[DecisionRecorder] = weakref.WeakSet()


def _in_child() -> None:
    # A forked worker is a process of its own: it starts counting from zero
    # under its own id, rather than report its parent's decisions as its own.
    for recorder in list(_recorders):
        recorder.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
