"""RedisClient (blocking): a bounded, thread-safe pool of connections to one Redis server.

Any number of threads share one client. A command takes an idle connection
(the one returned last: the pool is a stack, so a lightly loaded client
keeps using the same warm connection), runs on it alone and gives it back.
When none is idle a new one is opened, up to ``max_connections`` (default
16); past that the thread waits for one to be given back, at most
``command_timeout_s``, then fails with CommandNotSentError ("all N
connections ... busy"): the pool never hangs a thread and never grows past
its bound.

Time limits: a command gets ``command_timeout_s`` in all, from the call:
waiting for a free connection, writing it and reading its whole reply. A
connection opened for it gets ``connect_timeout_s`` (TCP, TLS and the
greeting); if that leaves the command no time, the command fails unsent and
the new connection stays in the pool for the next one. A connection whose
command failed in any way is closed, never given back (connection.py), so
every connection in the pool is in step.

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
from typing import Any, Callable, Optional, TypedDict, Union

from .._encoding import Arg, encode_command, encode_evalsha
from ..client_options import reconnect_delay_s
from ..connection import CommandNotSentError, ScriptLike
from ..connector import Connector
from ..errors import RedisConnectionError, RedisReplyError
from ..forks import abandon_in_children
from ..url import RedisAddress, address_of, parse_url
from ..url_options import FromUrl
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


class RedisClient(FromUrl, Connector):
    """A blocking Redis client (RESP2) over a bounded pool of connections; safe across threads.

    Nothing connects until the first command or ``connect()``. ``role``
    ("master" or "slave"): every connection sends ROLE in its greeting and is
    used only if the server reports that role (else CommandNotSentError).
    """

    parse_url = staticmethod(parse_url)
    batches_decisions = False  # a call a check, never batched

    def __init__(
        self,
        address: Union[RedisAddress, str],
        *,
        connect_timeout_s: float = 1.0,
        command_timeout_s: float = 0.5,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        ssl_context: Optional[ssl.SSLContext] = None,
        client_name: Optional[str] = None,
        role: Optional[str] = None,
    ) -> None:
        address = address_of(address, RedisAddress, parse_url)
        Connector.__init__(
            self, address, connect_timeout_s, command_timeout_s, ssl_context, client_name, role
        )
        self.max_connections = _checked_max_connections(max_connections)
        self._idle: deque[BlockingConnection] = deque()
        self._lock = threading.Lock()
        self._open = 0  # connections open (idle or in use), at most max_connections
        # Threads waiting for a connection, first come first served: a connection
        # given back (or a place freed) goes to the first one, not to whichever
        # thread asks next, so a busy pool cannot starve a waiting thread.
        self._waiters: deque[_Waiter] = deque()
        # Bumped by close() and fork(): a connection of an older generation is
        # closed when it comes back instead of being reused.
        self._generation = 0
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: Optional[RedisConnectionError] = None
        abandon_in_children(self)

    def __repr__(self) -> str:
        return f"<blocking RedisClient {self.address} open={self._open}/{self.max_connections}>"

    # -- commands ----------------------------------------------------------------

    def execute(self, *args: Arg) -> Any:
        """Run one command; returns its reply (bytes, int, list or None).

        Raises RedisReplyError for an error reply and RedisConnectionError when
        the server cannot be reached or does not reply in time.
        """
        payload = encode_command(*args)  # a TypeError before any I/O
        reply = self._on_one_connection(lambda link: link.call(payload))
        if type(reply) is RedisReplyError:
            raise reply
        return reply

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a Lua script by its SHA1; returns the script's reply.

        If the server lacks the script (SCRIPT FLUSH, a restart, a failover)
        the connection loads it (SCRIPT LOAD) and sends the call again in the
        same write: up to twice ``command_timeout_s`` then.
        """
        payload = encode_evalsha(script.sha, keys, args)  # a TypeError before any I/O
        # Every check comes here: the pool's common cases (an idle connection, used
        # recently, of this generation; given back to no waiting thread) are written
        # out rather than called, _take() and _give() doing the rest.
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._take()
            taken_at = monotonic()
        else:
            taken_at = monotonic()
            if (
                connection.generation != self._generation
                or taken_at - connection.idle_since > IDLE_CHECK_AFTER_S
            ):
                connection = self._vetted(connection)
        try:
            reply = connection.call(payload)
            if type(reply) is RedisReplyError and reply.message.startswith("NOSCRIPT"):
                reply = connection.after_noscript(script, keys, args)
        except BaseException:
            self._free_place()
            raise
        if connection.generation == self._generation:
            # Idle since the command began, not since it ended: one clock read fewer;
            # an idle connection is then checked (one poll) sooner, never later.
            connection.idle_since = taken_at
            self._idle.append(connection)
            if self._waiters:  # read after the append, as in _give()
                self._hand_over()
        else:
            self._give(connection)
        if type(reply) is RedisReplyError:
            raise reply
        return reply

    def evalsha_rest(
        self,
        connection: BlockingConnection,
        taken_at: float,
        script: ScriptLike,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        data: Optional[bytes],
        error: Optional[BaseException],
    ) -> Any:
        """The rest of ``evalsha()`` for a call sent and first read elsewhere (the one-call
        check, csrc/fast_redis.c) on ``connection``, taken from this pool at ``taken_at``
        as ``evalsha()`` takes one: ``data`` is what the first read returned (a reply
        not framed there: an error reply, a longer one), or ``error`` what the send or
        the read raised. From there, ``evalsha()``'s own steps."""
        try:
            reply = connection.reply_from(data, error, taken_at)
            if type(reply) is RedisReplyError and reply.message.startswith("NOSCRIPT"):
                reply = connection.after_noscript(script, keys, args)
        except BaseException:
            self._free_place()
            raise
        self._give(connection, idle_since=taken_at)
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
        replies: list[Any] = self._on_one_connection(lambda link: link.call_many(payloads))
        if raise_on_error:
            for reply in replies:
                if type(reply) is RedisReplyError:
                    raise reply
        return replies

    def evalsha_followed(
        self,
        script: ScriptLike,
        keys: Sequence[Arg],
        args: Sequence[Arg],
        follow: Sequence[Arg],
    ) -> tuple[Any, Any]:
        """``evalsha()``, then the command ``follow`` on the same connection, in the same
        write (a WAIT for the replicas of what the script wrote); both replies, error
        replies in place."""
        after = encode_command(*follow)
        replies: tuple[Any, Any] = self._on_one_connection(
            lambda link: link.evalsha_followed(script, keys, args, after)
        )
        return replies

    def connect(self) -> None:
        """Check now that the server answers (PING), opening a connection if none is idle.

        Unlike a command, this tries even while a reconnect backoff is running;
        RedisConnectionError if the server cannot be reached.
        """
        ping = encode_command("PING")
        reply = self._on_one_connection(lambda link: link.call(ping), force=True)
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
        self._idle = deque()  # dropped unused: closing a copy leaves the parent's alone
        self._open = 0
        self._waiters = deque()
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

    def _on_one_connection(
        self, use: Callable[[BlockingConnection], Any], *, force: bool = False
    ) -> Any:
        """``use(connection)`` on a connection of the pool (evalsha() does the same
        inline: it is every check's path)."""
        connection = self._take(force=force)
        try:
            outcome = use(connection)
        except BaseException:
            self._free_place()
            raise
        self._give(connection)
        return outcome

    def _take(self, *, force: bool = False) -> BlockingConnection:
        """An idle connection, else a new one, else one given back in time.

        A command that had to wait (for a connection given back, or opened for
        it) gets what is left of its command timeout (``budget_s``); none left,
        it fails unsent and the connection goes back to the pool.
        """
        idle = self._idle
        deadline = 0.0
        while True:
            try:
                connection = idle.pop()
            except IndexError:
                if not deadline:
                    deadline = monotonic() + self.command_timeout_s
                opened = self._open_or_wait(force, deadline)
                if opened is None:
                    continue  # one was given back meanwhile
                connection = opened
            else:
                if connection.generation != self._generation or (
                    (force or monotonic() - connection.idle_since > IDLE_CHECK_AFTER_S)
                    and connection.stale()
                ):
                    connection.close()
                    self._free_place()
                    continue
            if deadline:
                left_s = deadline - monotonic()
                if left_s <= 0:
                    self._give(connection)
                    raise CommandNotSentError(
                        f"{self.address}: no time left for the command after waiting "
                        f"{self.command_timeout_s:g} s for a connection (command timeout)"
                    )
                connection.budget_s = left_s
            return connection

    def _vetted(self, connection: BlockingConnection) -> BlockingConnection:
        """A connection just taken from the idle ones that is of an older generation or
        sat idle long enough to be checked: itself if still usable, else another
        (``_take()``), the stale one closed."""
        if connection.generation == self._generation and not connection.stale():
            return connection
        connection.close()
        self._free_place()
        return self._take()

    def _give(self, connection: BlockingConnection, *, idle_since: Optional[float] = None) -> None:
        """Give a connection back: idle since ``idle_since`` (when its command began, as
        ``evalsha()`` counts it) or else since now; first to a waiting thread."""
        if connection.generation != self._generation:  # closed (or forked) meanwhile
            connection.close()
            self._free_place()
            return
        connection.idle_since = monotonic() if idle_since is None else idle_since
        self._idle.append(connection)
        if self._waiters:  # read after the append: a waiter that came meanwhile sees it
            self._hand_over()

    def _hand_over(self) -> None:
        """Idle connections to the threads waiting, first come first served."""
        with self._lock:
            self._hand_over_locked()

    def _hand_over_locked(self) -> None:
        waiters, idle = self._waiters, self._idle
        while waiters and idle:
            waiter = waiters.popleft()
            waiter.connection = idle.pop()
            waiter.ready.set()

    def _free_place(self) -> None:
        """A connection closed (or never opened): its place is free, for the first thread
        waiting if one is (to open a new connection in it)."""
        with self._lock:
            if self._waiters:
                waiter = self._waiters.popleft()
                waiter.may_open = True
                waiter.ready.set()
            elif self._open > 0:  # not after a fork, which forgot the parent's
                self._open -= 1

    def _open_or_wait(self, force: bool, deadline: float) -> Optional[BlockingConnection]:
        """A new connection, one handed over, or None when one is idle (take it)."""
        with self._lock:
            if self._idle:
                return None
            if self._open < self.max_connections:
                self._open += 1
                waiter = None
            else:
                waiter = _Waiter()
                self._waiters.append(waiter)
                # A connection given back between the look above and now (givers
                # append without the lock) goes to the first waiter.
                self._hand_over_locked()
        if waiter is not None:
            waiter.ready.wait(max(0.0, deadline - monotonic()))
            with self._lock:
                if waiter.connection is None and not waiter.may_open:  # the wait ran out
                    self._waiters.remove(waiter)
                    raise self._busy_error()
            if waiter.connection is not None:
                return waiter.connection
            if monotonic() >= deadline:  # a place, but too late to use it: pass it on
                self._free_place()
                raise self._busy_error()
        try:  # in a place of its own (counted in _open)
            return self._connect(force)
        except BaseException:
            self._free_place()
            raise

    def _busy_error(self) -> CommandNotSentError:
        return CommandNotSentError(
            f"{self.address}: all {self.max_connections} connections were busy for "
            f"{self.command_timeout_s:g} s (max_connections)"
        )

    def _connect(self, force: bool) -> BlockingConnection:
        wait_s = self._retry_at - monotonic()
        if wait_s > 0 and self._last_error is not None and not force:
            raise CommandNotSentError(
                f"{self._last_error}; not retrying yet: "
                f"next connect attempt in {math.ceil(wait_s * 1000)} ms"
            )
        try:
            connection = self.blocking_connection(self._generation)
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
            self._free_place()


def _checked_max_connections(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be an int, got {type(value).__name__}")
    if not 1 <= value <= _MAX_CONNECTIONS_LIMIT:
        raise ValueError(f"max_connections must be 1..{_MAX_CONNECTIONS_LIMIT}, got {value}")
    return value


class _Waiter:
    """A thread waiting for a connection: handed one, or a place to open one in."""

    __slots__ = ("connection", "may_open", "ready")

    def __init__(self) -> None:
        self.connection: Optional[BlockingConnection] = None
        self.may_open = False
        self.ready = threading.Event()
