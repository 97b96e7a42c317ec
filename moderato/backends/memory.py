"""Decisions made in process by the C store (``memory://``), with Redis's math.

``MemoryStore`` (csrc/memory.c) keeps the keys the Lua scripts keep in Redis
and runs the scripts' exact math on them, so for the same calls at the same
times this backend answers exactly as the Redis backend does. Its limits are
per process: several workers or replicas each enforce their own quota.

Time comes from one clock, ``MemoryBackend.clock`` (Unix milliseconds as an
int); tests replace it to make decisions deterministic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Callable, Optional
from urllib.parse import parse_qsl, urlsplit

from .. import _accel
from ..algorithms import RESET_SUFFIXES, Algorithm, ScriptArg
from ..errors import RateLimitConfigError
from ..plans import Plan
from ..policy import SCALE
from ..results import CheckResult
from .base import DirectDecisions, KeySpaceBound, Part
from .replies import ALLOWED, DecisionReply, decoded, refusal

logger = logging.getLogger("moderato")

DEFAULT_MAX_ENTRIES = 1_000_000

# The store sweeps a bounded slice of its table every so many decisions, so
# expired entries go without a background task: SWEEP_ENTRIES / SWEEP_EVERY
# entries looked at per decision, the table swept once per about four times as
# many decisions as it holds entries.
SWEEP_EVERY = 256
SWEEP_ENTRIES = 1024
# ``MemoryBackend.sweep()`` looks at this many entries per slice and lets the
# event loop run between slices (docs/internals.md gives the measured cost).
SWEEP_SLICE_ENTRIES = 2048

Clock = Callable[[], int]

_announced = threading.Lock()


def wall_clock_ms() -> int:
    """The default clock: Unix time in whole milliseconds, as Redis's TIME gives it."""
    return time.time_ns() // 1_000_000


def _announce_per_process_limits() -> None:
    # Once per process: the first backend takes the lock and never releases it.
    if _announced.acquire(blocking=False):
        logger.warning(
            "moderato: memory:// keeps its counters in this process; with several "
            "workers or replicas each one enforces its own quota (use redis:// for one "
            "shared limit)"
        )


def _store_error(script: str, error: ValueError) -> Exception:
    # The store raises the scripts' own refusals, mapped as the Redis backend maps them.
    # Anything else is this process's fault (its clock, an algorithm the store
    # lacks), not the caller's arguments: the backend could not decide.
    return refusal(script, str(error), foreign=f"memory:// {script}: ")


class MemoryBackend(DirectDecisions, KeySpaceBound):
    """The Backend protocol over one in-process ``MemoryStore``.

    ``max_entries`` caps the table (least recently used entries are evicted
    beyond it); ``clock`` returns Unix milliseconds (default: the wall clock).
    Safe from several threads and event loops: each store call is atomic
    under the GIL (csrc/memory.c: no method releases it or runs Python code
    while the table changes; the module does not declare itself free of the
    GIL, so a free-threaded interpreter turns the GIL on when it loads it,
    unless told otherwise with PYTHON_GIL=0).
    Both RateLimiters use it: the asyncio one and the blocking one
    (``reset_now``, ``delete_matching_now``).
    """

    synchronous = True
    """Decides without waiting: the limiter calls ``check_now``."""

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Optional[Clock] = None
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise RateLimitConfigError(
                f"memory:// max_entries must be a positive integer, got {max_entries!r}"
            )
        self.store = _accel.MemoryStore(
            max_entries, sweep_every=SWEEP_EVERY, sweep_entries=SWEEP_ENTRIES
        )
        self.clock: Clock = clock if clock is not None else wall_clock_ms
        _announce_per_process_limits()

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        """``memory://`` or ``memory://?max_entries=N``."""
        parts = urlsplit(url)
        if parts.scheme != "memory" or parts.netloc or parts.path not in ("", "/"):
            raise RateLimitConfigError(
                f"invalid memory URL {url!r}: expected 'memory://' or 'memory://?max_entries=N'"
            )
        max_entries = DEFAULT_MAX_ENTRIES
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            if name != "max_entries":
                raise RateLimitConfigError(
                    f"invalid memory URL {url!r}: unknown option {name!r} (only max_entries)"
                )
            if not value.isdigit() or not value.isascii() or int(value) < 1:
                raise RateLimitConfigError(
                    f"invalid memory URL {url!r}: max_entries must be a positive integer"
                )
            max_entries = int(value)
        return cls(max_entries)

    def check_now(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> CheckResult:
        """One decision (or peek) on ``decision_keys``' keys, decoded."""
        args = (
            plan.unit_args if cost_scaled == SCALE and apply else plan.arguments(cost_scaled, apply)
        )
        clock = self.clock
        # decide_now's work, inline: this is every check's path.
        try:
            reply: DecisionReply = self.store.decide(
                plan.script_name, keys, args, None if clock is wall_clock_ms else clock()
            )
        except ValueError as error:
            raise _store_error(plan.script_name, error) from None
        try:
            result: CheckResult = _accel.check_result(reply, plan.result_shape)
        except (TypeError, ValueError):
            return decoded(plan, reply)  # raises the BackendError that names the script
        return result

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def decide_now(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        """The raw decision in the scripts' argument layout (long windows included), at once.

        ``check_now`` uses it: the store never waits, so the limiter need not
        either. Direct callers use ``decide``, which holds the direct contract.
        """
        clock = self.clock
        # The store reads the wall clock itself (None) unless a test replaced it.
        now_ms = None if clock is wall_clock_ms else clock()
        try:
            reply: DecisionReply = self.store.decide(algorithm.name, keys, args, now_ms)
        except ValueError as error:
            raise _store_error(algorithm.name, error) from None
        return reply

    async def direct_reply(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> object:
        return self.decide_now(algorithm, keys, args)

    async def decide_together(self, parts: Sequence[Part]) -> list[DecisionReply]:
        return self.decide_together_now(parts)

    def decide_together_now(self, parts: Sequence[Part]) -> list[DecisionReply]:
        """decide_together(), synchronously, as lua/together.lua does it in Redis.

        One instant for every part; the parts but the last are peeked, the last
        decides and charges when they all fit, then they are charged. Nothing
        runs in between (the store never waits), so nothing else is decided
        between a peek and its charge.
        """
        now_ms = self.clock()
        replies: list[DecisionReply] = []
        others_fit = True
        for algorithm, keys, arguments in parts[:-1]:
            reply = self._decide_at(algorithm, keys, (arguments[0], 0, *arguments[2:]), now_ms)
            replies.append(reply)
            others_fit = others_fit and reply[ALLOWED] == 1
        algorithm, keys, arguments = parts[-1]
        apply = 1 if others_fit else 0
        last = self._decide_at(algorithm, keys, (arguments[0], apply, *arguments[2:]), now_ms)
        if others_fit and last[ALLOWED] == 1:
            replies = [
                self._decide_at(algorithm, keys, (arguments[0], 1, *arguments[2:]), now_ms)
                for algorithm, keys, arguments in parts[:-1]
            ]
        replies.append(last)
        return replies

    def _decide_at(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg], now_ms: int
    ) -> DecisionReply:
        try:
            reply: DecisionReply = self.store.decide(algorithm.name, keys, args, now_ms)
        except ValueError as error:
            raise _store_error(algorithm.name, error) from None
        return reply

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        return self.reset_now(keys, windows_s)

    async def delete_matching(self, pattern: bytes) -> int:
        return self.delete_matching_now(pattern)

    async def announce_reset(self) -> None:
        """Nothing: this process's store is the only one, and remembers no denials."""

    def announce_reset_now(self) -> None:
        """Nothing (``announce_reset``)."""

    # -- the blocking RateLimiter's interface (BlockingBackend): the same calls --

    def reset_now(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        try:
            # reset.lua's ARGV: the registry's suffixes follow the windows, as for Redis.
            return self.store.reset(keys, [*windows_s, *RESET_SUFFIXES], self.clock())
        except ValueError as error:
            raise _store_error("reset", error) from None

    def delete_matching_now(self, pattern: bytes) -> int:
        return self.store.delete_matching(pattern, self.clock())

    def connect_now(self) -> None:
        pass

    def close_now(self) -> None:
        pass

    def sweep_now(self, slice_entries: int = SWEEP_SLICE_ENTRIES) -> int:
        """``sweep()``, blocking: between two slices the GIL goes to any thread
        waiting for it."""
        dropped = 0
        for slice_dropped in self._sweep_slices(slice_entries):
            dropped += slice_dropped
            time.sleep(0)
        return dropped

    async def sweep(self, slice_entries: int = SWEEP_SLICE_ENTRIES) -> int:
        """One pass over the table, ``slice_entries`` entries at a time, the event
        loop running between slices; returns how many entries were dropped.

        Decisions made meanwhile are exact as ever: the sweep drops only what
        decides as a missing key would. Entries that decisions use or add during
        the pass move ahead of it, so it looks at them too: traffic lengthens a
        pass, never makes it miss an entry.
        """
        dropped = 0
        for slice_dropped in self._sweep_slices(slice_entries):
            dropped += slice_dropped
            await asyncio.sleep(0)
        return dropped

    def _sweep_slices(self, slice_entries: int) -> Iterator[int]:
        """One pass from the least recently used entry: each item is what one
        slice dropped. The slice size is checked before the first."""
        if (
            isinstance(slice_entries, bool)
            or not isinstance(slice_entries, int)
            or slice_entries < 1
        ):
            raise RateLimitConfigError(
                f"memory:// sweep slice_entries must be a positive integer, got {slice_entries!r}"
            )
        return self._slices(slice_entries)

    def _slices(self, slice_entries: int) -> Iterator[int]:
        store = self.store
        passes = store.table_stats()["sweep_passes"]
        yield store.sweep(self.clock(), slice_entries, True)
        while store.table_stats()["sweep_passes"] == passes:
            yield store.sweep(self.clock(), slice_entries)
