"""Every process's figures in Redis: each publishes its own, the dashboard reads them all.

With a Redis backend, every process with a recorder publishes once a second
(an asyncio limiter's from a task on its loop, a blocking limiter's from a
daemon thread), in ONE script call (publish.lua): its snapshot as a small hash that expires
``ttl_s`` after its last publication (so a stopped process drops out within
that time), its entry in the index of live processes, and what it decided
since its previous publication, added into per-minute hashes that every
process shares (``<second>:<outcome>`` -> count), kept for the dashboard's 15
minutes. A dashboard in any process reads the index, every live process's
hash and the series: what it shows is the whole fleet's.

Keys (one hash tag, so on a Redis Cluster they all live on one node)::

    <prefix>:dashboard:{<prefix>}:processes          sorted set: id -> expiry (ms)
    <prefix>:dashboard:{<prefix>}:process:<id>       hash: the snapshot's fields
    <prefix>:dashboard:{<prefix>}:series:<minute>    hash: "<second>:<outcome>" -> count

The third part is never two characters, so no rate-limit key and no reset
pattern (``<prefix>:??:{...}``) can meet them.

Publishing goes to the backend's client directly, not through the limiter:
its failures never reach the circuit breaker or the failure log that guard
the checks; a publication that fails is retried with the next one (its
series increments kept until they are sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from ..scripts import Script, without_comments
from .recorder import OUTCOME_COUNT, DecisionRecorder
from .snapshot import ProcessView, backend_secrets, process_snapshot, read_snapshot

if TYPE_CHECKING:
    from .snapshot import AnyLimiter

logger = logging.getLogger("moderato.dashboard")

PUBLISH_INTERVAL_S = 1.0
PROCESS_TTL_S = 5.0
SERIES_BUCKET_S = 60
SERIES_TTL_S = 900 + 2 * SERIES_BUCKET_S
STOP_WAIT_S = 3.0
"""How long closing a limiter waits for its publisher's last publication: two
publications (the one under way, the last) at the default timeouts (connect 1 s,
command 0.5 s)."""


PUBLISH_LUA = b"""
-- One process's dashboard figures, published in one call (moderato/dashboard/fleet.py).
--
-- KEYS[1]     the process's hash (replaced whole, expires after ttl_ms)
-- KEYS[2]     the sorted set of live processes: id -> the time its hash expires
-- KEYS[3...]  the series hashes touched (one per minute): "<second>:<outcome>" -> count
--
-- ARGV: ttl_ms, process id, series_ttl_ms, the number of hash fields N,
-- then N field/value pairs, then for each series key: its number of
-- increments M, then M field/amount pairs.
--
-- Every key shares one hash tag, so on a cluster the call runs on one node.

local ttl_ms = tonumber(ARGV[1])
local process_id = ARGV[2]
local series_ttl_ms = tonumber(ARGV[3])
local field_count = tonumber(ARGV[4])
if not ttl_ms or not series_ttl_ms or not field_count or ttl_ms < 1 or series_ttl_ms < 1 then
  return redis.error_reply('MODERATO_ARG dashboard publish: bad arguments')
end

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

redis.call('DEL', KEYS[1])
if field_count > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 5, 4 + 2 * field_count))
end
redis.call('PEXPIRE', KEYS[1], ttl_ms)

-- The index lists who published recently; entries of stopped processes fall out.
redis.call('ZADD', KEYS[2], now_ms + ttl_ms, process_id)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
redis.call('PEXPIRE', KEYS[2], ttl_ms)

local at = 5 + 2 * field_count
for index = 3, #KEYS do
  local increments = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, increments do
    redis.call('HINCRBY', KEYS[index], ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('PEXPIRE', KEYS[index], series_ttl_ms)
end
return now_ms
"""


def _script(name: str, lua: bytes) -> Script:
    source = without_comments(lua)
    return Script(name=name, source=source, sha=hashlib.sha1(source).hexdigest())


PUBLISH_SCRIPT = _script("dashboard_publish", PUBLISH_LUA)


class FleetKeys:
    """The dashboard's keys under one key prefix (see the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.base = f"{prefix}:dashboard:{{{prefix}}}"
        self.index = f"{self.base}:processes"

    def process(self, process_id: str) -> str:
        return f"{self.base}:process:{process_id}"

    def series(self, minute: int) -> str:
        return f"{self.base}:series:{minute}"


def remote_client(limiter: AnyLimiter) -> Any:
    """The backend's Redis client (an asyncio one for the asyncio limiter, a blocking one
    for the blocking limiter), or None for a backend in this process (memory://)."""
    backend = limiter.backend
    if getattr(backend, "synchronous", False):  # memory://, either limiter's
        return None
    return getattr(backend, "client", None)


class _Publications:
    """What a publisher sends and remembers, whichever way it runs (a task, a thread)."""

    def __init__(
        self,
        recorder: DecisionRecorder,
        limiter: AnyLimiter,
        client: Any,
        *,
        interval_s: float = PUBLISH_INTERVAL_S,
        ttl_s: float = PROCESS_TTL_S,
    ) -> None:
        self.recorder = recorder
        self.limiter = limiter
        self.client = client
        self.keys = FleetKeys(limiter.key_prefix)
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.publications = 0
        """Publications sent and answered (for tests and the benchmark)."""
        self._secrets = backend_secrets(limiter)
        self._sent_second = recorder.current_second
        self._sent_counts = recorder.counts_at(self._sent_second)
        self._failing = False
        self._process_id = recorder.process_id

    def _publication(self) -> tuple[list[Union[str, bytes]], list[Union[str, int]], int, list[int]]:
        """The publish script's keys and arguments, and the watermark they bring us to."""
        recorder = self.recorder
        if recorder.process_id != self._process_id:  # forked: a new process, counted afresh
            self._process_id = recorder.process_id
            self._sent_second = recorder.current_second
            self._sent_counts = [0] * OUTCOME_COUNT
        fields = process_snapshot(recorder, self.limiter, time.time(), self._secrets)
        increments, sent_second, sent_counts = self._increments()
        keys: list[Union[str, bytes]] = [
            self.keys.process(recorder.process_id),
            self.keys.index,
        ]
        arguments: list[Union[str, int]] = [
            self.ttl_ms,
            recorder.process_id,
            SERIES_TTL_S * 1000,
            len(fields),
        ]
        for name, value in fields.items():
            arguments += [name, value]
        for minute, pairs in sorted(increments.items()):
            keys.append(self.keys.series(minute))
            arguments.append(len(pairs))
            for pair in pairs:
                arguments += pair
        return keys, arguments, sent_second, sent_counts

    def _answered(
        self, error: Optional[Exception], sent_second: int, sent_counts: list[int]
    ) -> bool:
        """Note how a publication went (logged once per outage); True when Redis took it."""
        if error is not None:
            if not self._failing:
                self._failing = True
                logger.warning("moderato dashboard: publishing to Redis failed: %s", error)
            return False
        if self._failing:
            self._failing = False
            logger.warning("moderato dashboard: publishing to Redis works again")
        self._sent_second, self._sent_counts = sent_second, sent_counts
        self.publications += 1
        return True

    def _increments(self) -> tuple[dict[int, list[tuple[str, int]]], int, list[int]]:
        """What was decided since the last publication, by minute; and the new watermark."""
        recorder = self.recorder
        current = recorder.current_second
        first = max(self._sent_second, current - recorder.history_s + 1)
        by_minute: dict[int, list[tuple[str, int]]] = {}
        counts = self._sent_counts
        for second in range(first, current + 1):
            counts = recorder.counts_at(second)
            already = self._sent_counts if second == self._sent_second else None
            for outcome, count in enumerate(counts):
                delta = count - (already[outcome] if already is not None else 0)
                if delta > 0:
                    by_minute.setdefault(second // SERIES_BUCKET_S, []).append(
                        (f"{second}:{outcome}", delta)
                    )
        return by_minute, current, list(counts)


class Publisher(_Publications):
    """Publishes one recorder's figures once a second from a task of its own.

    The task starts on the event loop of the first check (or dashboard
    request) that finds it not running, and again on another loop if that
    one has closed. ``close()`` (the limiter's, through ``on_close``) ends it
    after one last publication.
    """

    _task: Optional[asyncio.Task[None]] = None
    _wake: Optional[asyncio.Event] = None
    _stopped: Optional[asyncio.Task[None]] = None

    def ensure_running(self) -> None:
        """Start the publishing task on the running loop unless it already runs."""
        task = self._task
        if task is not None and not task.done() and not task.get_loop().is_closed():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        # Made here, on the loop that runs the task (Python 3.9's Event binds to a loop
        # when it is made), so close() can wake it before the task first runs.
        self._wake = wake = asyncio.Event()
        self._task = loop.create_task(self._run(wake), name="moderato-dashboard-publisher")

    def stop(self) -> None:
        """Cancel the task at once, with no last publication (tests publish by hand).

        A publication the task has under way ends as its cancellation does, a loop
        turn or more later; the next ``publish_once()`` waits for that, so it starts
        from what that one sent and never sends the same decisions again."""
        task = self._task
        if task is not None and not task.get_loop().is_closed():
            task.cancel()
            self._stopped = task
        self._task = None

    async def close(self, wait_s: float = STOP_WAIT_S) -> None:
        """End the task after one last publication (what was decided since the one
        before), awaited for at most ``wait_s``: past that it is cancelled, and what it
        had not sent is not sent. A task on another loop is told to end and not
        awaited. A later second's first check starts it again."""
        task, wake = self._task, self._wake
        self._task = self._wake = None
        if task is None or wake is None or task.done():
            return
        loop = task.get_loop()
        if loop.is_closed():
            return
        if loop is not asyncio.get_running_loop():
            loop.call_soon_threadsafe(wake.set)
            return
        wake.set()
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=wait_s)

    async def _run(self, wake: asyncio.Event) -> None:
        while not wake.is_set():
            started_s = time.monotonic()
            await self.publish_once()
            pause_s = max(0.0, self.interval_s - (time.monotonic() - started_s))
            with contextlib.suppress(asyncio.TimeoutError):  # the pause ended unwoken
                await asyncio.wait_for(wake.wait(), pause_s)
        # Woken by close(): the decisions since the last publication, the current
        # second's among them, would otherwise never reach the fleet's series.
        await self.publish_once()

    async def publish_once(self) -> bool:
        """Send one publication; False (logged once per outage) when Redis did not take it."""
        stopped, self._stopped = self._stopped, None
        if (
            stopped is not None
            and not stopped.done()
            and stopped is not asyncio.current_task()
            and stopped.get_loop() is asyncio.get_running_loop()
        ):
            await asyncio.wait({stopped})
        keys, arguments, sent_second, sent_counts = self._publication()
        call = self.client.evalsha(PUBLISH_SCRIPT, keys, arguments)
        try:
            await call
        except asyncio.CancelledError:
            if isinstance(call, asyncio.Future):
                # moderato's own client queued the call before returning its future,
                # and writes a queued command even when its caller is cancelled (as
                # stop() cancels this task): Redis takes it, and sending these counts
                # again would add them twice. (Another client's coroutine may be
                # cancelled before it sent anything: those counts are sent again.)
                self._sent_second, self._sent_counts = sent_second, sent_counts
            raise
        except Exception as error:  # the client's own errors: Redis did not take it
            return self._answered(error, sent_second, sent_counts)
        return self._answered(None, sent_second, sent_counts)


class ThreadPublisher(_Publications):
    """Publishes a blocking limiter's recorder once a second from a daemon thread.

    A blocking process has no event loop to run a task on. The thread starts
    with the first check that opens a second (``recorder.on_second``), so a
    process that never checks starts none; after a fork the child's first
    such check starts its own. Being a daemon, it never keeps the process
    alive: a process that exits stops publishing, and drops out of the
    fleet when its hash expires (``ttl_s``). ``close()`` (the limiter's,
    through ``on_close``) ends it after one last publication.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self._abandoned = threading.Event()

    def ensure_running(self) -> None:
        """Start the publishing thread unless it already runs (in this process: a forked
        child has none). Called as the recorder's ``on_second``, under its lock, so two
        threads never start one each."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        self._stopping = stopping = threading.Event()
        self._abandoned = abandoned = threading.Event()
        thread = threading.Thread(
            target=self._run,
            args=(stopping, abandoned),
            name="moderato-dashboard-publisher",
            daemon=True,
        )
        thread.start()
        self._thread = thread

    def stop(self) -> None:
        """Stop the thread with no last publication (it ends within one interval); a
        later second's first check starts it again."""
        self._abandoned.set()
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.interval_s + 1.0)

    def close(self, wait_s: float = STOP_WAIT_S) -> None:
        """End the thread after one last publication (what was decided since the one
        before), joined for at most ``wait_s``; past that it is told to send nothing
        more, and ends with the publication it is in. A later second's first check
        starts it again."""
        thread, self._thread = self._thread, None
        self._stopping.set()
        if thread is None or thread is threading.current_thread():
            return
        thread.join(wait_s)
        if thread.is_alive():
            self._abandoned.set()

    def _run(self, stopping: threading.Event, abandoned: threading.Event) -> None:
        while not stopping.is_set():
            started_s = time.monotonic()
            self.publish_once()
            stopping.wait(max(0.0, self.interval_s - (time.monotonic() - started_s)))
        # Told to stop by close(): the decisions since the last publication, the current
        # second's among them, would otherwise never reach the fleet's series. Not once
        # close() has given up waiting: the connections may be closed by then, and a
        # publication would open one again.
        if not abandoned.is_set():
            self.publish_once()

    def publish_once(self) -> bool:
        """Send one publication; False (logged once per outage) when Redis did not take it."""
        keys, arguments, sent_second, sent_counts = self._publication()
        try:
            self.client.evalsha(PUBLISH_SCRIPT, keys, arguments)
        except Exception as error:  # the client's own errors: Redis did not take it
            return self._answered(error, sent_second, sent_counts)
        return self._answered(None, sent_second, sent_counts)


class FleetReading:
    """What the dashboard read from Redis: the live processes and the fleet's series."""

    def __init__(self, processes: list[ProcessView], series: dict[int, list[int]]) -> None:
        self.processes = processes
        self.series = series
        """Decisions by outcome per wall-clock second."""


async def read_fleet(client: Any, keys: FleetKeys, now_s: float, window_s: int) -> FleetReading:
    """Every live process's snapshot and the series of the last ``window_s`` seconds."""
    members = await client.execute("ZRANGE", keys.index, 0, -1)
    ids = [_text(member) for member in members or ()]
    last_minute = int(now_s) // SERIES_BUCKET_S
    minutes = (
        range(last_minute - window_s // SERIES_BUCKET_S - 1, last_minute + 1)
        if window_s
        else range(0)
    )
    replies = await asyncio.gather(
        *(client.execute("HGETALL", keys.process(process_id)) for process_id in ids),
        *(client.execute("HGETALL", keys.series(minute)) for minute in minutes),
    )
    processes = []
    for reply in replies[: len(ids)]:
        view = read_snapshot(_as_mapping(reply))
        if view is not None:
            processes.append(view)
    series: dict[int, list[int]] = {}
    for reply in replies[len(ids) :]:
        for name, value in _as_mapping(reply).items():
            second_text, _, outcome_text = name.partition(":")
            try:
                second, outcome, count = int(second_text), int(outcome_text), int(value)
            except ValueError:
                continue
            if 0 <= outcome < OUTCOME_COUNT:
                series.setdefault(second, [0] * OUTCOME_COUNT)[outcome] += count
    return FleetReading(processes, series)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _as_mapping(reply: Any) -> dict[str, str]:
    """HGETALL's reply as a dict of text: a flat list (RESP2) or a dict (redis-py)."""
    if isinstance(reply, Mapping):
        return {_text(name): _text(value) for name, value in reply.items()}
    if isinstance(reply, Sequence) and not isinstance(reply, (bytes, str)):
        items = list(reply)
        return {_text(items[i]): _text(items[i + 1]) for i in range(0, len(items) - 1, 2)}
    return {}
