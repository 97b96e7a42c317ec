"""Failure logs that neither an outage nor a bad client can flood.

The first failure is written at once, saying what it means; what follows is
counted and written as at most one summary line per interval. Metrics (when
enabled) still count every event: these logs are for a person to read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable, Optional

from .options import seconds_option

DEFAULT_INTERVAL_S = 10.0

# At most this many distinct (callback, exception type) pairs get their own
# traceback; past it, new pairs are only counted (the set stays bounded).
MAX_TRACEBACKS = 256

backend_logger = logging.getLogger("moderato.backend")
callback_logger = logging.getLogger("moderato.callbacks")

OUTAGE_COUNTS = ("bypassed", "denied", "errors")


class OutageLog:
    """What a limiter logs while its backend cannot decide.

    Events: a check let through (``bypassed``, fail-open), a check refused
    (``denied``: BackendError raised, a 503 over HTTP) and a backend call that
    failed (``errors``; calls the open circuit breaker refused are not
    errors). The first event of an outage is logged at once (WARNING), then
    at most one summary per ``interval_s`` with the counts since the last
    summary, and one line when the backend answers again. An outage that
    starts within ``interval_s`` of the previous line is not announced
    again: its counts join the next summary, so a backend that flaps cannot
    flood the log either.
    """

    def __init__(
        self,
        *,
        fail_open: bool,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = seconds_option("failure_log_interval_s", interval_s)
        self.clock = clock
        self._consequence = (
            "failing open: checks are let through uncounted by the quota"
            if fail_open
            else "failing closed: checks raise BackendError (503 over HTTP)"
        )
        self._lock = threading.Lock()  # one limiter may serve several event loops
        self.active = False  # read without the lock on every successful call
        self._announced = False
        self._started_at = 0.0
        self._last_line_at: Optional[float] = None
        self._pending: Counter[str] = Counter()
        self._last_error = ""

    def failed(self, event: str, error: BaseException) -> None:
        """Count one event (one of OUTAGE_COUNTS); log it if a line is due."""
        with self._lock:
            now = self.clock()
            self._pending[event] += 1
            self._last_error = f"{type(error).__name__}: {error}"
            beginning = not self.active
            if beginning:
                self.active, self._announced, self._started_at = True, False, now
            if self._last_line_at is not None and now - self._last_line_at < self.interval_s:
                return
            self._last_line_at = now
            if beginning:
                self._announced = True
                backend_logger.warning(
                    "moderato: the backend could not decide (%s), %s; further failures "
                    "are summarised at most every %g s",
                    self._last_error,
                    self._consequence,
                    self.interval_s,
                )
            else:
                backend_logger.warning(
                    "moderato: the backend is still failing after %.1f s; since the last "
                    "report: %s; last error: %s",
                    now - self._started_at,
                    self._counts(),
                    self._last_error,
                )

    def recovered(self) -> None:
        """The backend answered: close the outage (one line, if it was announced)."""
        with self._lock:
            if not self.active:
                return
            self.active = False
            if not self._announced:
                return  # its counts wait for the next line
            now = self.clock()
            self._last_line_at = now
            backend_logger.warning(
                "moderato: the backend is answering again after %.1f s of failures; "
                "since the last report: %s",
                now - self._started_at,
                self._counts(),
            )

    def _counts(self) -> str:
        text = ", ".join(f"{self._pending[name]} {name}" for name in OUTAGE_COUNTS)
        self._pending.clear()
        return text


class CallbackFailureLog:
    """What the HTTP integration logs when a key, tenant, cost, rate or exempt callback raises.

    Each (callback, exception type) is logged once with its traceback
    (ERROR); its repeats are counted and written as at most one summary line
    per ``interval_s``, so a client that makes a callback fail on every
    request cannot flood the log.
    """

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = seconds_option("interval_s", interval_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str, str]] = set()
        self._repeats: Counter[tuple[str, str, str]] = Counter()
        self._last_line_at = 0.0

    def failed(self, name: str, callback: object, error: BaseException) -> None:
        cause = (name, _callable_name(callback), type(error).__qualname__)
        with self._lock:
            now = self.clock()
            if cause not in self._seen and len(self._seen) < MAX_TRACEBACKS:
                self._seen.add(cause)
                self._last_line_at = now  # the repeats' first summary is an interval away
                callback_logger.error(
                    "moderato: the %s callback %s raised %s; the request was refused "
                    "(RateLimitCallbackError, 503). Repeats are summarised at most every %g s",
                    name,
                    cause[1],
                    cause[2],
                    self.interval_s,
                    exc_info=error,
                )
                return
            self._repeats[cause] += 1
            if now - self._last_line_at < self.interval_s:
                return
            self._last_line_at = now
            summary = "; ".join(
                f"{count} x {callback_name} callback {function} raised {exception}"
                for (callback_name, function, exception), count in sorted(self._repeats.items())
            )
            self._repeats.clear()
            callback_logger.error("moderato: callback failures since the last report: %s", summary)

    def clear(self) -> None:
        """Forget what was logged (tests start from a clean slate with it)."""
        with self._lock:
            self._seen.clear()
            self._repeats.clear()
            self._last_line_at = 0.0


def _callable_name(callback: object) -> str:
    if isinstance(callback, str):
        return callback
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    module = getattr(callback, "__module__", None)
    return f"{module}.{name}" if module else str(name)
