"""RedisClient (blocking): a bounded, thread-safe pool of connections to one Redis server.

Any number of threads share one client. A command takes an idle connection
(the one returned last: the pool is a stack, so a lightly loaded client
keeps using the same warm connection), runs on it alone and gives it back.
When none is idle a new one is opened, up to ``max_connections`` (default
16); past that the thread waits for one to be given back, at most
``command_timeout_s``, then fails with CommandNotSentError ("all N
connections ... busy"): the pool never hangs a thread and never grows past
its bound.

Time limits: a command gets ``command_timeout_s`` to wait for a free
connection, and again from when it is written until its reply is complete;
a connection opened for it gets ``connect_timeout_s`` (TCP, TLS and the
greeting). A connection whose command failed in any way is closed, never
given back (connection.py), so every connection in the pool is in step.

An idle connection that has something to read was closed by the server (a
restart) or is out of step: checked before reuse when it sat idle for more
than ``IDLE_CHECK_AFTER_S``, it is closed and another taken, so a restarted
server costs no failed command.

Reconnect: a connect that fails (refused, timed out, greeting refused)
starts a backoff (client_options.py: 25 ms doubling to 500 ms) during which
commands that need a new connection fail fast with CommandNotSentError
saying when the next attempt is due; ``connect()`` tries regardless.

fork(): the child drops every connection it inherited without using it
(forks.py); closing its copies of the descriptors leaves the parent's
connections working. The child's first command opens its own.
"""

from __future__ import annotations

import math
import ssl
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from time import monotonic
from typing import Any, Optional, TypedDict, Union

from .._encoding import Arg, encode_command
from ..client_options import (
    checked_client_name,
    checked_ssl_context,
    positive_seconds,
    reconnect_delay_s,
)
from ..connection import CommandNotSentError, ScriptLike
from ..errors import RedisConnectionError, RedisReplyError
from ..forks import abandon_in_children
from ..url import RedisAddress, address_of, parse_url
from ..url_options import client_from_url
from .connection import BlockingConnection

__all__ = ["DEFAULT_MAX_CONNECTIONS", "IDLE_CHECK_AFTER_S", "BlockingOptions", "RedisClient"]

DEFAULT_MAX_CONNECTIONS = 16
_MAX_CONNECTIONS_LIMIT = 4096
# An idle connection is checked (one poll, no round trip) before reuse when it
# sat unused for longer than this; under load connections come back sooner
# and go out again unchecked.
IDLE_CHECK_AFTER_S = 0.05


class BlockingOptions(TypedDict, total=False):
    """The blocking RedisClient's options, declared once: the blocking cluster and
    Sentinel clients take the same keywords and hand them to each client they make."""

    connect_timeout_s: float
    command_timeout_s: float
    max_connections: int
    ssl_context: Optional[ssl.SSLContext]
    client_name: Optional[str]


class RedisClient:
    """A blocking Redis client (RESP2) over a bounded pool of connections; safe across threads.

    Nothing connects until the first command or ``connect()``.
    """

    def __init__(
        self,
        address: Union[RedisAddress, str],
        *,
        connect_timeout_s: float = 1.0,
        command_timeout_s: float = 0.5,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        ssl_context: Optional[ssl.SSLContext] = None,
        client_name: Optional[str] = None,
    ) -> None:
        address = address_of(address, RedisAddress, parse_url)
        self.address = address
        self.connect_timeout_s = positive_seconds("connect_timeout_s", connect_timeout_s)
        self.command_timeout_s = positive_seconds("command_timeout_s", command_timeout_s)
        self.max_connections = _checked_max_connections(max_connections)
        self._ssl_context = checked_ssl_context(ssl_context, address)
        self.client_name = checked_client_name(client_name, address)
        self._idle: deque[BlockingConnection] = deque()
        self._lock = threading.Lock()
        self._available = threading.Condition(self._lock)
        self._open = 0  # connections open (idle or in use), at most max_connections
        self._waiting = 0  # threads waiting for a connection to be given back
        # Bumped by close() and fork(): a connection of an older generation is
        # closed when it comes back instead of being reused.
        self._generation = 0
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: Optional[RedisConnectionError] = None
        abandon_in_children(self)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisClient:
        """``RedisClient(parse_url(url), **options)``; the URL's connection options win."""
        return client_from_url(cls, parse_url, url, options)

    def __repr__(self) -> str:
        return f"<blocking RedisClient {self.address} open={self._open}/{self.max_connections}>"

    # -- commands ----------------------------------------------------------------

    def execute(self, *args: Arg) -> Any:
        """Run one command; returns its reply (bytes, int, list or None).

        Raises RedisReplyError for an error reply and RedisConnectionError when
        the server cannot be reached or does not reply in time.
        """
        payload = encode_command(*args)  # a TypeError before any I/O
        connection = self._take()
        try:
            reply = connection.call(payload)
        except BaseException:
            self._lost(connection)
            raise
        self._give(connection)
        if type(reply) is RedisReplyError:
            raise reply
        return reply

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a Lua script by its SHA1; returns the script's reply.

        If the server lacks the script (SCRIPT FLUSH, a restart, a failover)
        the connection loads it (SCRIPT LOAD) and sends the call again in the
        same write: up to twice ``command_timeout_s`` then.
        """
        connection = self._take()
        try:
            reply = connection.evalsha(script, keys, args)
        except BaseException:
            self._lost(connection)
            raise
        self._give(connection)
        if type(reply) is RedisReplyError:
            raise reply
        return reply

    def execute_many(
        self, commands: Iterable[Sequence[Arg]], *, raise_on_error: bool = True
    ) -> list[Any]:
        """Several commands in one write on one connection (not a transaction); replies in order.

        With ``raise_on_error`` the first error reply is raised once every
        reply is in; without it, error replies are returned in place.
        """
        payloads = [encode_command(*command) for command in commands]
        if not payloads:
            return []
        connection = self._take()
        try:
            replies = connection.call_many(payloads)
        except BaseException:
            self._lost(connection)
            raise
        self._give(connection)
        if raise_on_error:
            for reply in replies:
                if type(reply) is RedisReplyError:
                    raise reply
        return replies

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> None:
        """Check now that the server answers (PING), opening a connection if none is idle.

        Unlike a command, this tries even while a reconnect backoff is running;
        RedisConnectionError if the server cannot be reached.
        """
        connection = self._take(force=True)
        try:
            reply = connection.call(encode_command("PING"))
        except BaseException:
            self._lost(connection)
            raise
        self._give(connection)
        if type(reply) is RedisReplyError:
            raise RedisConnectionError(f"{self.address}: PING was refused: {reply.message}")

    def close(self) -> None:
        """Close the idle connections now, and those in use when they come back.

        The client stays usable: the next command connects again.
        """
        with self._lock:
            self._generation += 1
        self._close_idle()

    def after_fork_in_child(self) -> None:
        """Right after fork(), in the child: let go of the parent's connections (forks.py)."""
        # Another thread of the parent may have held the lock at the fork.
        self._lock = threading.Lock()
        self._available = threading.Condition(self._lock)
        self._idle = deque()  # dropped unused: closing a copy leaves the parent's alone
        self._open = 0
        self._waiting = 0
        self._generation += 1
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = None

    @property
    def open_connections(self) -> int:
        """Connections open now, idle or in use (for diagnostics and tests)."""
        return self._open

    @property
    def idle_connections(self) -> int:
        """Connections waiting in the pool now (for diagnostics and tests)."""
        return len(self._idle)

    # -- the pool ------------------------------------------------------------------

    def _take(self, *, force: bool = False) -> BlockingConnection:
        """An idle connection, else a new one, else one given back in time."""
        idle = self._idle
        while True:
            try:
                connection = idle.pop()
            except IndexError:
                opened = self._open_or_wait(force)
                if opened is None:
                    continue  # one was given back meanwhile
                return opened
            if connection.generation != self._generation or (
                (force or monotonic() - connection.idle_since > IDLE_CHECK_AFTER_S)
                and connection.stale()
            ):
                connection.close()
                self._lost(connection)
                continue
            return connection

    def _give(self, connection: BlockingConnection) -> None:
        if connection.generation != self._generation:  # closed (or forked) meanwhile
            connection.close()
            self._lost(connection)
            return
        connection.idle_since = monotonic()
        self._idle.append(connection)
        if self._waiting:
            with self._available:
                self._available.notify()

    def _lost(self, connection: BlockingConnection) -> None:
        """A connection that will not come back (closed): its place is free."""
        with self._available:
            if self._open > 0:  # not after a fork, which forgot the parent's
                self._open -= 1
            if self._waiting:
                self._available.notify()

    def _open_or_wait(self, force: bool) -> Optional[BlockingConnection]:
        """A new connection, or None when one was given back (take it from the pool)."""
        deadline = 0.0
        with self._available:
            while True:
                if self._idle:
                    return None
                if self._open < self.max_connections:
                    self._open += 1
                    break
                now = monotonic()
                if not deadline:
                    deadline = now + self.command_timeout_s
                if now >= deadline:
                    raise CommandNotSentError(
                        f"{self.address}: all {self.max_connections} connections were busy for "
                        f"{self.command_timeout_s:g} s (max_connections)"
                    )
                self._waiting += 1
                try:
                    self._available.wait(deadline - now)
                finally:
                    self._waiting -= 1
        try:
            return self._connect(force)
        except BaseException:
            with self._available:
                self._open -= 1
                if self._waiting:
                    self._available.notify()
            raise

    def _connect(self, force: bool) -> BlockingConnection:
        wait_s = self._retry_at - monotonic()
        if wait_s > 0 and self._last_error is not None and not force:
            raise CommandNotSentError(
                f"{self._last_error}; not retrying yet: "
                f"next connect attempt in {math.ceil(wait_s * 1000)} ms"
            )
        if self.address.tls and self._ssl_context is None:
            # Built once: loading the CA store costs milliseconds.
            self._ssl_context = ssl.create_default_context()
        try:
            connection = BlockingConnection(
                self.address,
                connect_timeout_s=self.connect_timeout_s,
                command_timeout_s=self.command_timeout_s,
                ssl_context=self._ssl_context,
                client_name=self.client_name,
                generation=self._generation,
            )
        except RedisConnectionError as error:
            self._failures += 1
            self._retry_at = monotonic() + reconnect_delay_s(self._failures)
            self._last_error = error
            raise
        self._failures = 0
        self._last_error = None
        return connection

    def _close_idle(self) -> None:
        idle = self._idle
        while True:
            try:
                connection = idle.pop()
            except IndexError:
                return
            connection.close()
            self._lost(connection)


def _checked_max_connections(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be an int, got {type(value).__name__}")
    if not 1 <= value <= _MAX_CONNECTIONS_LIMIT:
        raise ValueError(f"max_connections must be 1..{_MAX_CONNECTIONS_LIMIT}, got {value}")
    return value
