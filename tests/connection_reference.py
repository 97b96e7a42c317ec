"""The Python steps csrc/connection_core.c replaced: the oracle ConnectionCore is
tested against.

These are moderato/redis/connection.py's per-command methods as they were before
they moved to C (``send_script``, ``_queue``, ``_schedule_flush``, ``_flush``,
``get_buffer``, ``buffer_updated``), unchanged but for the names they import.
``ReferenceConnection`` puts them in front of the C ones; the client's tests run
with it as well as with RedisConnection (tests/redis/test_connection_core.py,
and the ``connection_class`` fixture), and the results must be the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import hiredis

from moderato.redis._encoding import Arg, encode_evalsha
from moderato.redis.connection import RedisConnection, ScriptLike
from moderato.redis.errors import RedisConnectionError, RedisReplyError

_Future = asyncio.Future
_READY = 1
_CLOSED = 2


class ReferenceCore:
    """The per-command steps in Python, over the same attributes (RedisConnection's
    and its C base's, set by RedisConnection.__init__)."""

    def send_script(
        self,
        payload: bytes | None,
        script: ScriptLike,
        keys: Sequence[Arg],
        args: Sequence[Arg],
    ) -> asyncio.Future[Any]:
        """Queue an encoded ``EVALSHA script.sha keys args``; the future resolves to its reply.

        Should Redis answer NOSCRIPT (SCRIPT FLUSH, a restart, a failover), the
        script is loaded once on this connection and the command sent again
        (see the module doc); the same future gets that reply, so the caller
        never sees the NOSCRIPT. The re-sent command has its own timeout.

        ``payload`` None: queued unencoded when the connection joins its turns (the
        flush encodes it unless it is joined), else encoded now.
        """
        # send(), _queue() and _queued_total() written out: this is every check's path.
        if not self.usable:
            raise self._closed_error(sent=False)
        if payload is None and self._group is None:
            payload = encode_evalsha(script.sha, keys, args)
        future: asyncio.Future[Any] = _Future(loop=self._loop)
        self._pending.append(future)
        buffer = self._write_buffer
        buffer.append(payload)
        if not self.batch_open:
            self.batch_open = True
            if self._flush_due:
                self._schedule_flush()
        self._scripts.append(
            (self._batched_total + len(buffer) - self._held, script, keys, args, 0)
        )
        return future

    def _queue(self, future: asyncio.Future[Any], payload: bytes) -> None:
        """Put one command at the end of the pipeline, answered through ``future``."""
        self._pending.append(future)
        self._write_buffer.append(payload)
        if not self.batch_open:
            self.batch_open = True
            if self._flush_due:
                self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Schedule the one write of this loop turn (none is: _flush_due)."""
        self._flush_due = False
        loop = self._loop
        # Measured from the first command of the batch (or from the read that
        # scheduled it, a little earlier), so no caller of this batch waits
        # longer than the timeout.
        self._batch_deadline = loop.time() + self._command_timeout_s
        loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Once per loop turn that sent commands: close them into a batch and write.

        While connecting the batch is only recorded (its deadline still runs from
        when it was issued) and held back; _become_ready writes it.
        """
        state = self._state
        if state == _CLOSED:
            return  # the flag stays down: nothing is sent any more
        self._flush_due = True
        self.batch_open = False
        buffer = self._write_buffer
        new = len(buffer) - self._held
        if state == _READY and new > 1 and self._group is not None:
            # It may join the new commands into fewer (moderato/redis/grouping.py).
            self._group()
            new = len(buffer) - self._held
        if new > 0:
            self._encode_left()
        if new > 0:
            batched_total = self._batched_total + new
            self._batched_total = batched_total
            batches = self._batches
            scripts = self._scripts
            if batches or scripts:
                # Forget what is answered in full; keeps both deques short under load.
                answered = batched_total - len(self._pending)
                while batches and batches[0][1] <= answered:
                    batches.popleft()
                while scripts and scripts[0][0] <= answered:
                    scripts.popleft()
            batches.append((self._batch_deadline, batched_total))
            if self._timer is None:
                self._timer = self._loop.call_at(self._batch_deadline, self._on_timer)
        if state == _READY:
            # _write_out() written out: one call fewer per loop turn.
            transport = self._transport
            if buffer and transport is not None:
                transport.write(buffer[0] if len(buffer) == 1 else b"".join(buffer))
                buffer.clear()
            self._held = 0
        else:
            self._held = len(buffer)

    def _encode_left(self) -> None:
        """The turn's checks queued unencoded and not joined, each encoded from its
        record (numbered by its place in the pipeline)."""
        buffer = self._write_buffer
        held = self._held
        records = {record[0]: record for record in self._scripts}
        for at in range(held, len(buffer)):
            if buffer[at] is None:
                _, script, keys, args, _ = records[self._batched_total + at - held + 1]
                buffer[at] = encode_evalsha(script.sha, keys, args)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_view

    def buffer_updated(self, nbytes: int) -> None:
        reader = self._reader
        # hiredis reads any buffer; its stub only names str and bytes.
        reader.feed(self._read_buffer, 0, nbytes)  # type: ignore[arg-type]
        pending = self._pending
        try:
            reply = reader.gets()
            if reply is False:
                return  # a part of a reply: nobody to wake yet
            while reply is not False:
                future = pending.popleft()
                # Done means cancelled or timed out: the reply only frees the slot.
                if not future.done():
                    if type(reply) is not RedisReplyError:
                        future.set_result(reply)
                    elif not (
                        self._scripts
                        and reply.message.startswith("NOSCRIPT")
                        and self._resend_after_noscript(future)
                    ):
                        future.set_exception(reply)
                reply = reader.gets()
            if self._flush_due and self._state == _READY:
                # Behind the wake-ups just scheduled: what the answered tasks send
                # next leaves in this loop turn (see the module doc). Its deadline
                # runs from now, a little before they send.
                self._flush_due = False
                loop = self._loop
                self._batch_deadline = loop.time() + self._command_timeout_s
                loop.call_soon(self._flush)
        except IndexError:
            self._abort(RedisConnectionError(f"{self._label} sent a reply nobody asked for"))
        except hiredis.ProtocolError as error:
            self._abort(RedisConnectionError(f"{self._label} sent malformed RESP: {error}"))


class ReferenceConnection(ReferenceCore, RedisConnection):
    """A RedisConnection whose per-command steps are the Python ones above."""
