"""One blocking RESP2 connection to one Redis server, used by one thread at a time.

A command is written whole, then its reply is read whole before the
connection goes back to the pool, so a connection in the pool is always in
step: the next reply read on it is the next command's. Anything that
interrupts that (a timeout, a lost or refused connection, a malformed reply,
even KeyboardInterrupt) closes the connection for good; the pool opens
another. That is the blocking counterpart of the asyncio connection's
guarantee that every reply meets its own caller.

- Bytes: commands are encoded by the C encoders (``_accel``) and replies
  framed by hiredis' Reader, as on the asyncio client.
- Time: connecting (TCP, TLS, the greeting) gets ``connect_timeout_s``; a
  command gets ``command_timeout_s`` from when it is written until its
  reply is complete, however many reads that takes.
- NOSCRIPT: a script Redis no longer has (a restart, a failover, SCRIPT
  FLUSH) did not run. ``SCRIPT LOAD`` and the call again go in one write,
  on the same connection; a call answered NOSCRIPT once more (the load was
  refused, or the cache flushed again meanwhile) is sent as EVAL, whose
  source cannot be missing. Each round trip has its own command timeout.
- fork(): a connection belongs to the process that opened it (``pid``).
  Closing it releases only this process's copy of the descriptor (never a
  ``shutdown()``), so a child that closes what it inherited leaves the
  parent's connection working.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import struct
import sys
from collections.abc import Sequence
from time import monotonic
from typing import Any, Optional

import hiredis

from .._encoding import Arg, encode_command, encode_evalsha
from ..connection import CommandNotSentError, ScriptLike
from ..errors import RedisClientError, RedisConnectionError, RedisReplyError
from ..handshake import greeting, refused_steps
from ..url import RedisAddress

__all__ = ["BlockingConnection"]

# Kernel timeouts (SO_RCVTIMEO, SO_SNDTIMEO on a blocking socket) where struct
# timeval is two longs and a timed-out call fails with EAGAIN: Linux. Elsewhere,
# and for TLS (whose reads retry on EAGAIN), Python's socket timeouts.
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")
# What a timed-out send or receive raises: socket.timeout (Python's timeouts) or
# BlockingIOError, EAGAIN (the kernel's).
_TIMEOUTS = (socket.timeout, BlockingIOError)

# Large enough for a decision's reply (and most others) in one read.
_READ_BUFFER_BYTES = 64 * 1024
_HAS_POLL = hasattr(select, "poll")


class BlockingConnection:
    """A connection, opened and greeted in the constructor (RedisConnectionError if not)."""

    __slots__ = (
        "_buffer",
        "_command_timeout_s",
        "_kernel_timeouts",
        "_label",
        "_poller",
        "_reader",
        "_retimed",
        "_sock",
        "address",
        "budget_s",
        "generation",
        "idle_since",
        "pid",
    )

    def __init__(
        self,
        address: RedisAddress,
        *,
        connect_timeout_s: float,
        command_timeout_s: float,
        ssl_context: Optional[ssl.SSLContext] = None,
        client_name: Optional[str] = None,
        role: Optional[str] = None,
        generation: int = 0,
    ) -> None:
        self.address = address
        self._label = str(address)
        self._command_timeout_s = command_timeout_s
        # The pool's generation when opened: a pool closed meanwhile closes it on return.
        self.generation = generation
        self.pid = os.getpid()
        self.idle_since = 0.0
        # Set by the pool for one command that waited for this connection: its time left.
        self.budget_s: Optional[float] = None
        self._reader = hiredis.Reader(replyError=RedisReplyError)
        # True while the socket's timeout is not the command timeout (a long reply's
        # last reads, a command that waited for its connection, the greeting).
        self._retimed = True
        self._kernel_timeouts = False  # Python's timeouts while connecting
        self._buffer = bytearray(_READ_BUFFER_BYTES)
        deadline = monotonic() + connect_timeout_s
        try:
            self._sock = _open_socket(address, connect_timeout_s, ssl_context)
        except (OSError, ValueError) as error:  # ssl.SSLError and socket.timeout are OSErrors
            message = _connect_failure(self._label, error, connect_timeout_s)
            raise CommandNotSentError(message) from None
        try:
            steps, payloads = greeting(address, client_name, role=role)
            self._sock.sendall(b"".join(payloads))
            replies = [self._read_reply(deadline) for _ in steps]
            refused_steps(self._label, steps, replies, role=role)
            self._kernel_timeouts = _KERNEL_TIMEOUTS and not address.tls
            if self._kernel_timeouts:
                # A blocking socket whose every send and receive the kernel times out:
                # one system call (and one release of the GIL) each, where a Python
                # timeout adds a poll() before each.
                self._sock.settimeout(None)
            self._set_timeout(command_timeout_s)
            self._retimed = False
        except BaseException as error:
            self.close()
            if isinstance(error, RedisClientError):
                raise CommandNotSentError(str(error)) from None
            if isinstance(error, (OSError, EOFError, hiredis.ProtocolError)):
                message = _connect_failure(self._label, error, connect_timeout_s)
                raise CommandNotSentError(message) from None
            raise
        self._poller: Any = None
        if _HAS_POLL:
            self._poller = select.poll()
            self._poller.register(self._sock.fileno(), select.POLLIN)

    def __repr__(self) -> str:
        return f"<BlockingConnection {self._label}>"

    # -- commands ----------------------------------------------------------------

    def call(self, payload: bytes) -> Any:
        """Write one encoded command and read its reply; an error reply is returned, not raised.

        Any failure closes the connection and raises RedisConnectionError (the
        command may have run: only its reply is known to be lost).
        """
        if self.budget_s is not None:
            return self._call_budgeted(payload)
        # Every check's path, so written out here rather than through _read_reply:
        # at rest the socket's timeout is the command timeout (``_retimed`` is
        # False), the reader holds nothing (every reply was read) and a decision's
        # reply arrives in the first read.
        buffer = self._buffer
        try:
            started = monotonic()
            sock = self._sock
            sock.sendall(payload)
            count = sock.recv_into(buffer)
            if not count:
                raise EOFError
            reader = self._reader
            reader.feed(buffer, 0, count)  # type: ignore[arg-type]
            reply = reader.gets()
            if reply is False:  # a long reply: its next reads get what is left of the time
                reply = self._rest_of_reply(started + self._command_timeout_s)
            return reply
        except BaseException as error:
            raise self._broken(error) from None

    def _call_budgeted(self, payload: bytes) -> Any:
        """``call()`` for a command that waited for its connection: ``budget_s`` in all."""
        timeout_s = self._timeout_s()
        try:
            started = monotonic()
            self._sock.sendall(payload)
            return self._read_reply(started + timeout_s)
        except BaseException as error:
            raise self._broken(error) from None

    def reply_from(
        self, data: Optional[bytes], error: Optional[BaseException], started: float
    ) -> Any:
        """The rest of ``call()`` for a command sent and first read elsewhere (the one-call
        check, csrc/fast_redis.c) from ``started``: ``data``, what that first read
        returned, framed (the rest of a longer reply read in what is left of the command
        timeout), or ``error``, what the send or the read raised; any failure closes the
        connection and raises RedisConnectionError, as ``call()``'s do."""
        try:
            if error is not None:
                raise error
            assert data is not None
            reader = self._reader
            reader.feed(data)
            reply = reader.gets()
            if reply is False:
                reply = self._rest_of_reply(started + self._command_timeout_s)
            return reply
        except BaseException as raised:
            raise self._broken(raised) from None

    def call_many(self, payloads: Sequence[bytes]) -> list[Any]:
        """Several encoded commands in one write, their replies in order (error replies
        returned in place)."""
        timeout_s = self._timeout_s()
        try:
            deadline = monotonic() + timeout_s
            self._sock.sendall(b"".join(payloads))
            return [self._read_reply(deadline) for _ in payloads]
        except BaseException as error:
            raise self._broken(error) from None

    def after_noscript(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """The reply of a script call (``call()`` of its EVALSHA) that was answered NOSCRIPT:
        the script loaded and called again, or, refused again, sent as EVAL; an error
        reply is returned."""
        return self._after_noscript(script, keys, args, [])[0]

    def evalsha_followed(
        self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg], follow: bytes
    ) -> tuple[Any, Any]:
        """``evalsha()`` with the encoded command ``follow`` right behind the script's last
        try, in the same write (a WAIT for the replicas); both replies."""
        reply, after = self.call_many([encode_evalsha(script.sha, keys, args), follow])
        if type(reply) is RedisReplyError and reply.message.startswith("NOSCRIPT"):
            reply, after = self._after_noscript(script, keys, args, [follow])
        return reply, after

    def _after_noscript(
        self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg], tail: list[bytes]
    ) -> list[Any]:
        """The call was answered NOSCRIPT: SCRIPT LOAD and the call again in one write;
        after a second NOSCRIPT (the load refused, or the cache flushed again), EVAL.
        The replies of the last try and of ``tail``."""
        load = encode_command("SCRIPT", "LOAD", script.source)
        replies = self.call_many([load, encode_evalsha(script.sha, keys, args), *tail])[1:]
        first = replies[0]
        if type(first) is RedisReplyError and first.message.startswith("NOSCRIPT"):
            source = encode_command("EVAL", script.source, len(keys), *keys, *args)
            replies = self.call_many([source, *tail])
        return replies

    def send(self, payload: bytes) -> None:
        """Write an encoded command whose replies come later (a SUBSCRIBE)."""
        try:
            self._sock.sendall(payload)
        except BaseException as error:
            raise self._broken(error) from None

    def receive(self) -> Any:
        """The next message of a subscribed connection, or None when none came within the
        command timeout (a partly read one stays in the reader: the stream stays in step)."""
        reader = self._reader
        reply = reader.gets()
        if reply is not False:
            return reply
        try:
            count = self._sock.recv_into(self._buffer)
            if not count:
                raise EOFError
            reader.feed(self._buffer, 0, count)  # type: ignore[arg-type]
            reply = reader.gets()
        except _TIMEOUTS:
            return None
        except BaseException as error:
            raise self._broken(error) from None
        return None if reply is False else reply

    def stale(self) -> bool:
        """Whether an idle connection has something to read: the server closed it
        (a restart), or sent what nobody asked for. Either way it is out of use."""
        poller = self._poller
        if poller is None:
            readable, _, _ = select.select([self._sock], [], [], 0)
            return bool(readable)
        return bool(poller.poll(0))

    def close(self) -> None:
        """Close this process's descriptor (no ``shutdown()``: after fork() the socket is
        the parent's too, and only closing the last descriptor ends the connection)."""
        with contextlib.suppress(OSError):
            self._sock.close()

    # -- internals ---------------------------------------------------------------

    def _timeout_s(self) -> float:
        """This command's time: the pool's ``budget_s`` (what is left after waiting
        for this connection) once, else the command timeout."""
        budget_s = self.budget_s
        if budget_s is None:
            return self._command_timeout_s
        self.budget_s = None
        self._set_timeout(budget_s)  # _read_reply sets the usual one back
        self._retimed = True
        return budget_s

    def _set_timeout(self, seconds: float) -> None:
        """The time the next send or receive may take."""
        if self._kernel_timeouts:
            whole = int(seconds)
            micros = int((seconds - whole) * 1_000_000)
            if whole == 0 and micros == 0:
                micros = 1  # a zero timeval means no timeout at all: block for good
            value = struct.pack("@ll", whole, micros)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        else:
            self._sock.settimeout(seconds)

    def _rest_of_reply(self, deadline: float) -> Any:
        """The rest of a reply whose first read was not all of it, by ``deadline``."""
        remaining_s = deadline - monotonic()
        if remaining_s <= 0:
            raise socket.timeout()
        self._set_timeout(remaining_s)
        self._retimed = True
        return self._read_reply(deadline)

    def _read_reply(self, deadline: float) -> Any:
        """The next reply, read by ``deadline`` (the socket's timeout bounds the first read;
        a reply longer than one read gets what is left of the time)."""
        reader = self._reader
        reply = reader.gets()
        if reply is not False:
            return reply  # a reply of the same read as the previous one
        sock = self._sock
        buffer = self._buffer
        while True:
            count = sock.recv_into(buffer)
            if not count:
                raise EOFError
            # hiredis reads any buffer; its stub only names str and bytes.
            reader.feed(buffer, 0, count)  # type: ignore[arg-type]
            reply = reader.gets()
            if reply is not False:
                if self._retimed:
                    self._set_timeout(self._command_timeout_s)
                    self._retimed = False
                return reply
            remaining_s = deadline - monotonic()
            if remaining_s <= 0:
                raise socket.timeout()
            self._set_timeout(remaining_s)
            self._retimed = True

    def _broken(self, error: BaseException) -> BaseException:
        """Close the connection (it is out of step) and say why, as the client's error."""
        self.close()
        if isinstance(error, _TIMEOUTS):
            return RedisConnectionError(
                f"{self._label} did not reply within {self._command_timeout_s:g} s "
                "(command timeout); connection dropped"
            )
        if isinstance(error, EOFError):
            return RedisConnectionError(f"connection to {self._label} lost: closed by the server")
        if isinstance(error, hiredis.ProtocolError):
            return RedisConnectionError(f"{self._label} sent malformed RESP: {error}")
        if isinstance(error, OSError):
            reason = str(error) or type(error).__name__
            return RedisConnectionError(f"connection to {self._label} lost: {reason}")
        return error  # KeyboardInterrupt, a bug: raised as it is, the connection closed


def _open_socket(
    address: RedisAddress, timeout_s: float, ssl_context: Optional[ssl.SSLContext]
) -> socket.socket:
    if address.unix_path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(address.unix_path)
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Lets the kernel notice a peer that vanished while the connection sat idle.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if address.tls:
            context = ssl_context or ssl.create_default_context()
            return context.wrap_socket(sock, server_hostname=address.host)
    except BaseException:
        sock.close()
        raise
    return sock


def _connect_failure(label: str, error: BaseException, timeout_s: float) -> str:
    if isinstance(error, socket.timeout):
        return f"cannot connect to {label}: no answer within {timeout_s:g} s (connect timeout)"
    if isinstance(error, EOFError):
        return f"cannot connect to {label}: closed by the server"
    reason = str(error) or type(error).__name__
    return f"cannot connect to {label}: {reason}"
