"""One multiplexed RESP2 connection: auto-pipelining, FIFO replies, cheap timeouts.

How a command travels:

- ``send(payload)`` appends the encoded command to a write buffer and a future to
  ``_pending`` (a FIFO deque). The first command of a loop turn schedules one
  ``_flush`` with ``loop.call_soon``; the flush joins the buffer and hands it to
  the transport in ONE ``transport.write``: every command issued during one loop
  turn leaves together (auto-pipelining, one syscall for many callers).
- A read that answers commands schedules that flush itself, behind the
  wake-ups of the tasks it answered: a task that sends its next command as
  soon as it has a reply (a sequential caller; every task woken by one read)
  has it written in the same loop turn, not one turn later. asyncio offers
  no "end of this turn" callback, so without this the write waits for a turn
  of its own: a sequential caller's command took three loop turns (each an
  epoll_wait and the loop's bookkeeping) where two do. The flush runs after
  those tasks, so their commands still leave in one write; a read that no
  command follows costs one empty flush.
- Redis answers in order, so ``buffer_updated`` feeds hiredis' Reader and resolves
  ``_pending`` from the left. A future whose caller was cancelled or timed out is
  already done: its reply is dropped, but its slot stays in the deque until that
  reply arrives, so every later reply still meets its own caller.
- Timeouts cost nothing per command. The commands of one loop turn form a
  *batch* with one deadline (the turn's time plus the command timeout), and the
  flush records one ``(deadline, last sequence number)`` pair per batch; all
  commands share one timeout, so deadlines grow along the deque and one
  ``loop.call_at`` timer per connection, armed for the oldest unanswered batch,
  is enough. When it fires it fails the overdue futures with RedisConnectionError
  (their slots stay) and re-arms itself. If the oldest command stays unanswered
  for ``STALL_FACTOR`` times the timeout the server is presumed gone (paused,
  partitioned): the connection is dropped so the client reconnects instead of
  queueing behind a dead peer forever. (Measured against asyncio.wait_for per
  command: that adds ~5 us of CPU per command, twice the client's whole cost.)
- At connect the RESP2 handshake (AUTH, SELECT, CLIENT SETNAME, whichever apply,
  else a PING; then ROLE when the connection was given a ``role``) is written in
  one go; commands issued meanwhile are batched and timed as usual but held back
  until every handshake reply is OK, so a failed SELECT can never let a command
  run in the wrong database, a server that reports another role than the one
  required (a demoted primary) never gets one, and a slow connect never holds a
  command past its own timeout.
- A script is sent by its SHA1 (EVALSHA). When Redis no longer has it (a
  restart, a failover, SCRIPT FLUSH) every call of it in flight is answered
  NOSCRIPT, which means it did not run. The first such reply queues one
  ``SCRIPT LOAD`` of the script; that call and every other one answered
  NOSCRIPT behind it are re-sent once, still as EVALSHA, and reach Redis after
  the load (one connection, one order). A cold cache under a burst of N calls
  thus costs one load and N small commands, not N copies of the source. A
  call answered NOSCRIPT again (the load was refused, or the cache was flushed
  once more) is re-sent as EVAL, whose source cannot be missing.
- Losing the connection fails every pending future with RedisConnectionError naming the
  server and the reason; the connection is then dead for good (the client opens
  a new one). A command that never left this process (still in the write
  buffer, or held back while connecting) fails with CommandNotSentError
  instead: only such a command is certainly safe to retry. One that was
  written may have run (a script may have charged) even though its reply was
  lost, cut short or garbled.
- A connection belongs to the process that opened it (``pid``). In a child
  made by ``fork()`` it is abandoned, never closed or shut down: the socket
  and the event loop's epoll instance are shared with the parent (see
  forks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any, Callable, Optional, Protocol, cast

import hiredis

from .._accel import ConnectionCore
from ._encoding import Arg, encode_command, encode_evalsha
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .handshake import greeting, open_transport, refused_steps
from .url import RedisAddress

__all__ = ["STALL_FACTOR", "CommandNotSentError", "RedisConnection", "ScriptLike"]

# The oldest unanswered command may wait this many command timeouts before the
# connection is presumed dead. Above 1 so that one slow command (a big script,
# a DEBUG SLEEP) fails only its own callers and not the whole pipeline; small so
# that a paused or partitioned server is given up quickly.
STALL_FACTOR = 2.0
# A timer may fire this early (the loop's clock granularity); a deadline within
# it counts as reached rather than re-arming for a few microseconds.
_DEADLINE_SLACK_S = 0.001

# How often one script call may be re-sent as EVALSHA after NOSCRIPT replies;
# the next NOSCRIPT sends its source (EVAL). Once behind a SCRIPT LOAD, once
# behind another call's EVAL (the load was refused, or the cache was flushed
# again meanwhile): a cache flushed over and over cannot keep a call going round.
_EVALSHA_RESENDS = 2

# Large enough for a full batch of small replies in one read; bigger replies
# simply take several reads.
_READ_BUFFER_BYTES = 64 * 1024

# Futures are made directly: loop.create_future() is a Python-level wrapper
# around this same call for asyncio's loops (and uvloop's), and costs ~100 ns
# more per command.
_Future = asyncio.Future

_CONNECTING = 0
_READY = 1
_CLOSED = 2


class CommandNotSentError(RedisConnectionError):
    """The command was never written to the server, so it certainly did not run.

    Retrying it cannot apply it twice; any other RedisConnectionError of a command
    (a timeout, a lost connection, a malformed reply) leaves that unknown.
    """


class ScriptLike(Protocol):
    """A Lua script as EVALSHA needs it: its SHA1 (40 hex digits) and its source."""

    @property
    def sha(self) -> str: ...

    @property
    def source(self) -> bytes: ...


# An EVALSHA in flight, what re-sending it after a NOSCRIPT reply takes:
# (sequence: its place in the pipeline, the count of commands queued up to it;
# the script; its keys; its args; how often it was re-sent after NOSCRIPT
# already). A plain tuple: a NamedTuple's constructor is a Python-level call.
_ScriptCall = tuple[int, ScriptLike, Sequence[Arg], Sequence[Arg], int]


def _monotonic_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop.time()`` is asyncio's own, ``time.monotonic()``, on a platform
    where that is CLOCK_MONOTONIC (Linux: the clock connection_core.c reads)."""
    return sys.platform.startswith("linux") and (
        getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Read the outcome of a future nobody awaits, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


# Called once when the connection closes: (connection, error or None if closed
# by the client, healthy = it had connected: handshake done).
CloseCallback = Callable[["RedisConnection", Optional[RedisClientError], bool], None]


class RedisConnection(ConnectionCore, asyncio.BufferedProtocol):
    """A single connection to one Redis server, used from one event loop.

    The steps every command and every read take (``send_script``, ``_queue``,
    ``_schedule_flush``, ``_flush``, ``get_buffer``, ``buffer_updated``) are
    its C base's, ``_accel.ConnectionCore`` (csrc/connection_core.c), as are
    the attributes they read and write (the deque of futures, the write
    buffer, the batches, the flags); the rest is here and reads the same
    attributes.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        address: RedisAddress,
        *,
        command_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        client_name: str | None = None,
        role: str | None = None,
        on_close: CloseCallback | None = None,
    ) -> None:
        self._loop = loop
        # What the C steps call, looked up once: a future of this loop, the type of
        # an error reply, and the loop's scheduling and clock.
        self._future_type = _Future
        self._reply_error = RedisReplyError
        self._call_soon = loop.call_soon
        self._call_at = loop.call_at
        # None when the loop's clock is time.monotonic() (asyncio's own loops, whose
        # time() is BaseEventLoop.time): C reads that clock without the Python call.
        self._loop_time = None if _monotonic_loop(loop) else loop.time
        # What a flush of two or more new commands calls first (the client sets it to
        # grouping.group_checks for this connection), or None.
        self._group: Callable[[], None] | None = None
        # The batched scripts this connection has loaded (grouping.py loads one before
        # its first batched call).
        self._loaded_forms: set[str] = set()
        self.address = address
        self._label = str(address)
        self._command_timeout_s = float(command_timeout_s)
        self._stall_s = command_timeout_s * (STALL_FACTOR - 1.0)
        self._ssl_context = ssl_context
        self._client_name = client_name if client_name is not None else address.client_name
        # The role ROLE must report before any command is sent ("master"), if any.
        self._role = role
        self._on_close = on_close
        # The process that opened it: only that one may close or shut down its socket.
        self.pid = os.getpid()

        self._state = _CONNECTING
        # True while commands may be queued (connecting or ready): the client's
        # fast path reads this one attribute.
        self.usable = True
        self._healthy = False
        self._transport: asyncio.Transport | None = None
        self._reader = hiredis.Reader(replyError=RedisReplyError)
        # Reads land here (recv_into) and are copied into the Reader at once, so
        # one buffer serves every read. A plain Protocol would make asyncio
        # allocate a fresh 256 KiB bytes object per read, which glibc serves with
        # mmap/mremap/munmap: three extra syscalls per reply batch, measured at
        # about a quarter of sequential throughput.
        self._read_buffer = bytearray(_READ_BUFFER_BYTES)
        # get_buffer() hands asyncio a memoryview, never the bytearray itself:
        # asyncio's TLS layer (3.11+) fills one buffer with several TLS records by
        # reading into ``buf[offset:]``, which for a bytearray is a copy (the
        # bytes land in it and are lost, corrupting the reply stream) but for a
        # memoryview is a window onto the same memory. Plain sockets (recv_into)
        # and 3.9/3.10's TLS layer (slice assignment) accept either.
        self._read_view = memoryview(self._read_buffer)
        self._pending: deque[asyncio.Future[Any]] = deque()
        # A check sent unencoded (send_script(None, ...), when _group joins the turns)
        # is None here until the turn's flush: the flush encodes it unless it was
        # joined into a batched call, whose own encoding would waste its own.
        self._write_buffer: list[bytes] = []
        # How many payloads at the head of _write_buffer already belong to a batch:
        # non-zero only while connecting, when batches are held back.
        self._held = 0
        # True when no flush is scheduled: the next send() schedules one. A read
        # schedules one too (see the module doc), so a flush may be due with no
        # command queued yet.
        self._flush_due = True
        # True while commands of this loop turn are queued here, their write
        # still to come: the client's pick() sends the turn's other commands here.
        self.batch_open = False
        self._batch_deadline = 0.0
        # Commands closed into batches so far (not the handshake, whose replies
        # come before any of theirs). With the commands not yet in a batch and
        # len(_pending) it tells how many were answered, which is also the
        # sequence number of the latest one answered (see _answered()).
        self._batched_total = 0
        # One (deadline, _batched_total after it) pair per batch not yet known to
        # be answered; deadlines never decrease along the deque.
        self._batches: deque[tuple[float, int]] = deque()
        # Once ready, a stall is judged from no earlier than this (a batch queued
        # while connecting may have passed its deadline before it could be sent).
        self._stall_floor = 0.0
        # Commands with a sequence number up to this one have been failed by a timeout.
        self._expired_upto = 0
        # One record per EVALSHA sent by send_script() (or re-sent after NOSCRIPT)
        # and not yet known to be answered: what a NOSCRIPT reply needs to re-send it.
        self._scripts: deque[_ScriptCall] = deque()
        # SHA1 -> sequence number of the latest command queued that caches that
        # script (a SCRIPT LOAD, or an EVAL): a call sent before it and answered
        # NOSCRIPT is re-sent behind it without loading again.
        self._loads: dict[str, int] = {}
        self._timer = None
        self._connect_task: asyncio.Task[None] | None = None
        self._ready_waiters: list[asyncio.Future[None]] = []
        self.error: RedisClientError | None = None

    def __repr__(self) -> str:
        state = ("connecting", "ready", "closed")[self._state]
        return f"<RedisConnection {self._label} {state} pending={len(self._pending)}>"

    @property
    def transport(self) -> asyncio.Transport | None:
        """The underlying transport while connected (for diagnostics and tests)."""
        return self._transport

    @property
    def pending_count(self) -> int:
        """Commands sent or queued whose reply has not arrived (timed-out slots included)."""
        return len(self._pending)

    # -- the hot path ------------------------------------------------------------

    def send(self, payload: bytes) -> asyncio.Future[Any]:
        """Queue one encoded command; the future resolves to its reply.

        An error reply resolves it with RedisReplyError; a timeout or a lost
        connection with RedisConnectionError.
        """
        if not self.usable:
            raise self._closed_error(sent=False)
        future: asyncio.Future[Any] = _Future(loop=self._loop)
        self._queue(future, payload)
        return future

    def send_many(self, payloads: list[bytes]) -> list[asyncio.Future[Any]]:
        """Queue several encoded commands at once; one future per command, in order."""
        if not self.usable:
            raise self._closed_error(sent=False)
        loop = self._loop
        futures: list[asyncio.Future[Any]] = [_Future(loop=loop) for _ in payloads]
        self._pending.extend(futures)
        self._write_buffer.extend(payloads)
        if payloads and not self.batch_open:
            self.batch_open = True
            if self._flush_due:
                self._schedule_flush()
        return futures

    def _write_out(self) -> None:
        buffer = self._write_buffer
        transport = self._transport
        if buffer and transport is not None:
            # join() of a single bytes object returns it without copying.
            transport.write(buffer[0] if len(buffer) == 1 else b"".join(buffer))
            buffer.clear()
        self._held = 0

    def _queued_total(self) -> int:
        """Commands queued so far (not the handshake): the sequence number of the latest."""
        return self._batched_total + len(self._write_buffer) - self._held

    def _answered(self) -> int:
        """Replies received so far (negative while handshake replies are awaited)."""
        return self._batched_total + len(self._write_buffer) - self._held - len(self._pending)

    def _read_failed(self, error: BaseException) -> None:
        """What a read raised (buffer_updated, in C): a reply nobody asked for or
        malformed RESP aborts the connection; anything else is raised on."""
        if isinstance(error, IndexError):
            self._abort(RedisConnectionError(f"{self._label} sent a reply nobody asked for"))
        elif isinstance(error, hiredis.ProtocolError):
            self._abort(RedisConnectionError(f"{self._label} sent malformed RESP: {error}"))
        else:
            raise error

    def _resend_after_noscript(self, future: asyncio.Future[Any]) -> bool:
        """Re-send the script call just answered NOSCRIPT, for the same future.

        Behind a SCRIPT LOAD of its script: the one queued since this call was
        sent, else a new one. After ``_EVALSHA_RESENDS`` re-sends, as EVAL.
        False if that reply was not for a call sent by send_script().
        """
        # The reply's future was just popped: the answered count is its number.
        answered = self._answered()
        scripts = self._scripts
        while scripts and scripts[0][0] < answered:
            scripts.popleft()
        if not scripts or scripts[0][0] != answered:
            return False
        sequence, script, keys, args, resends = scripts.popleft()
        loaded_after_sending = self._loads.get(script.sha, 0) > sequence
        if not loaded_after_sending and resends == 0:
            # The first NOSCRIPT of this script since it was last loaded here.
            self._load(script)
        elif not loaded_after_sending or resends >= _EVALSHA_RESENDS:
            # The load did not take (refused, or the cache flushed again): this
            # call carries the source, and the calls answered NOSCRIPT after
            # it follow as EVALSHA.
            self._queue(
                future,
                encode_command("EVAL", script.source, len(keys), *keys, *args),
            )
            self._loads[script.sha] = self._queued_total()
            return True
        # The future takes the new command's slot at the end of the pipeline.
        self._queue(future, encode_evalsha(script.sha, keys, args))
        scripts.append((self._queued_total(), script, keys, args, resends + 1))
        return True

    def _load(self, script: ScriptLike) -> None:
        """Queue ``SCRIPT LOAD`` of ``script``; its reply is awaited by nobody.

        An error (no ``script|load`` in the ACL, say) shows in the calls behind
        it, answered NOSCRIPT once more and then re-sent with the source.
        """
        loaded: asyncio.Future[Any] = _Future(loop=self._loop)
        loaded.add_done_callback(_retrieve)
        self._queue(loaded, encode_command("SCRIPT", "LOAD", script.source))
        self._loads[script.sha] = self._queued_total()

    # -- timeouts ----------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        state = self._state
        if state == _CLOSED:
            return
        pending = self._pending
        answered = self._answered()
        batches = self._batches
        while batches and batches[0][1] <= answered:
            batches.popleft()
        if not batches:
            return  # all answered; the next flush re-arms
        now = self._loop.time() + _DEADLINE_SLACK_S
        # While connecting, the connect timeout is the judge of a dead server.
        stall_at = max(batches[0][0], self._stall_floor) + self._stall_s
        if state == _READY and now >= stall_at:
            waited_s = self._command_timeout_s * STALL_FACTOR
            self._abort(
                RedisConnectionError(
                    f"{self._label} sent no reply for {waited_s:g} s; "
                    "connection dropped (server paused, overloaded or unreachable?)"
                )
            )
            return

        expired = max(self._expired_upto, answered)
        next_deadline: float | None = None
        for deadline, last in batches:
            if deadline > now:
                next_deadline = deadline
                break
            if last > expired:
                for index in range(expired - answered, last - answered):
                    future = pending[index]
                    if not future.done():
                        future.set_exception(self._timeout_error())
                expired = last
        self._expired_upto = expired

        when = stall_at if state == _READY else None
        if next_deadline is not None and (when is None or next_deadline < when):
            when = next_deadline
        if when is not None:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _timeout_error(self) -> RedisClientError:
        if self._state == _CONNECTING:
            return RedisConnectionError(
                f"{self._label} was still connecting after {self._command_timeout_s:g} s "
                "(command timeout)"
            )
        return RedisConnectionError(
            f"{self._label} did not reply within {self._command_timeout_s:g} s (command timeout)"
        )

    # -- connecting --------------------------------------------------------------

    def start(self, connect_timeout_s: float) -> None:
        """Begin connecting in the background; commands may be sent meanwhile."""
        if self._connect_task is None and self._state == _CONNECTING:
            self._connect_task = self._loop.create_task(self._connect(connect_timeout_s))

    async def wait_ready(self) -> None:
        """Return once the handshake succeeded; raise RedisConnectionError if connecting failed."""
        if self._state == _READY:
            return
        if self._state == _CLOSED:
            raise self._closed_error()
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._ready_waiters.append(waiter)
        await waiter

    async def _connect(self, connect_timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self._open_and_greet(), connect_timeout_s)
        except asyncio.CancelledError:
            # Only close() cancels this task; it has already failed everything.
            self._abort(RedisConnectionError(f"connecting to {self._label} was cancelled"))
            raise
        except asyncio.TimeoutError:
            self._abort(
                RedisConnectionError(
                    f"cannot connect to {self._label}: no answer within "
                    f"{connect_timeout_s:g} s (connect timeout)"
                )
            )
        except RedisClientError as error:
            self._abort(error)
        except (OSError, ssl.SSLError, EOFError) as error:
            reason = str(error) or type(error).__name__
            self._abort(RedisConnectionError(f"cannot connect to {self._label}: {reason}"))
        else:
            self._become_ready()
        finally:
            self._connect_task = None

    async def _open_and_greet(self) -> None:
        loop = self._loop
        await open_transport(loop, lambda: self, self.address, self._ssl_context)
        if self._state == _CLOSED:  # lost between connection_made and here
            raise self._closed_error()

        steps, payloads = greeting(self.address, self._client_name, role=self._role)
        futures = [loop.create_future() for _ in steps]
        # Commands sent while connecting already wait in _pending: the handshake
        # goes first on the wire, so its futures go first in the deque.
        self._pending.extendleft(reversed(futures))
        assert self._transport is not None
        self._transport.write(b"".join(payloads))
        # gather() collects every outcome, so no future's exception goes unretrieved.
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, RedisReplyError):
                raise outcome
        refused_steps(self._label, steps, outcomes, role=self._role)

    def _become_ready(self) -> None:
        if self._state != _CONNECTING:
            return
        self._state = _READY
        self._healthy = True
        self._stall_floor = self._loop.time() + self._command_timeout_s
        for waiter in self._ready_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._ready_waiters.clear()
        if self._flush_due:
            # The batches held back while connecting (their deadlines run from
            # when they were issued). If a flush is scheduled instead, it writes
            # them together with this turn's commands.
            self._write_out()

    # -- asyncio protocol callbacks ----------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._state == _CLOSED:  # closed while the connect was in flight
            transport.close()
            return
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Lets the kernel notice a peer that vanished while we sat idle.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._state == _CLOSED:
            return
        reason = "closed by the server" if exc is None else str(exc) or type(exc).__name__
        self._fail(RedisConnectionError(f"connection to {self._label} lost: {reason}"))

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost fails what is pending

    # -- closing -----------------------------------------------------------------

    async def close(self) -> None:
        """Close the connection; whatever is still pending fails with RedisConnectionError."""
        self.close_nowait()

    def close_nowait(self) -> None:
        """Close without waiting (safe from loop callbacks); see close()."""
        self._end(None)

    def discard(self) -> None:
        """Release a connection whose event loop is already closed.

        Nothing can be scheduled on a closed loop, so the futures are dropped
        as they are and the socket is shut down directly; the file descriptor
        goes when the transport is garbage-collected.
        """
        if self.pid != os.getpid():
            self.abandon()
            return
        self._state = _CLOSED
        self.usable = False
        self._flush_due = False
        self._held = 0
        self._pending.clear()
        self._write_buffer.clear()
        self._batches.clear()
        self._scripts.clear()
        self._timer = None
        transport, self._transport = self._transport, None
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):  # already disconnected
                    sock.shutdown(socket.SHUT_RDWR)

    def abandon(self) -> None:
        """Let go of a connection inherited across ``fork()``, touching nothing shared.

        The socket is the parent's too (a shutdown would end its connection,
        a TLS close alert would corrupt its stream), and so is the loop's
        epoll instance (unregistering the socket would unregister it for the
        parent). The parent's pending commands are not failed either: their
        callbacks belong to the parent. The child's copy of the descriptor
        closes when the transport is collected, which the parent never sees.
        """
        self._state = _CLOSED
        self.usable = False
        self._flush_due = False
        self._held = 0
        self._pending = deque()
        self._write_buffer.clear()
        self._batches.clear()
        self._scripts.clear()
        self._ready_waiters.clear()
        self._timer = None  # if it ever fires here, it finds the connection closed
        self._connect_task = None
        self._transport = None
        self.error = RedisConnectionError(
            f"connection to {self._label} was opened by process {self.pid}; "
            "it is not used after fork()"
        )

    def _abort(self, error: RedisClientError) -> None:
        self._end(error)

    def _end(self, error: RedisClientError | None) -> None:
        """Closed by us (``error`` None: the transport flushes what it holds) or aborted
        (the transport drops it); in a fork()ed child, only let go of the socket."""
        if self._state == _CLOSED:
            return
        if self.pid != os.getpid():
            self.abandon()
            return
        transport = self._transport
        self._fail(error)
        if transport is not None:
            if error is None:
                transport.close()
            else:
                transport.abort()

    def _fail(self, error: RedisClientError | None) -> None:
        """Mark closed and fail everything pending; ``error`` None means closed by us."""
        self._state = _CLOSED
        self.usable = False
        self._flush_due = False
        self._held = 0
        self.error = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = self._connect_task
        if task is not None and task is not asyncio.current_task(self._loop):
            task.cancel()
        pending = self._pending
        self._pending = deque()
        # Each payload still in the write buffer is the command of one future at
        # the tail of _pending (send() appends to both): those never left.
        sent_count = len(pending) - len(self._write_buffer)
        self._write_buffer.clear()
        self._batches.clear()
        self._scripts.clear()
        self._transport = None
        # A fresh exception per future: one instance raised in many tasks would
        # collect all their tracebacks.
        for index, future in enumerate(pending):
            if not future.done():
                future.set_exception(self._closed_error(sent=index < sent_count))
        for waiter in self._ready_waiters:
            if not waiter.done():
                waiter.set_exception(self._closed_error())
        self._ready_waiters.clear()
        if self._on_close is not None:
            self._on_close(self, error, self._healthy)

    def _closed_error(self, *, sent: bool = True) -> RedisClientError:
        """The error of a command failed by the closing; ``sent``: it was written out."""
        kind = RedisConnectionError if sent else CommandNotSentError
        if self.error is not None:
            return kind(str(self.error))
        return kind(f"connection to {self._label} was closed by the client")
