"""RedisClient: per-event-loop multiplexed connections, lazy connect, reconnect with backoff.

A limiter is shared by code running on several event loops (an app's loop,
pytest-asyncio's per-test loops, worker threads each running their own loop),
and asyncio objects belong to one loop. So the client keeps, per loop, a small
pool of ``connections_per_loop`` connections, each one multiplexing the
commands of that loop (see connection.py); each command goes to the
connection with the fewest commands in flight (see _Pool.pick).

Finding the caller's pool: ``asyncio.get_running_loop()``, then a dict
lookup. On Python 3.9 to 3.11 that call costs a getpid() system call (a fork
check), about 0.25 us; asyncio offers no public, cheaper way to know which
loop is running in this thread, and the client uses no private attribute.

The mapping (loop -> pool) is a plain dict replaced
wholesale (copy on write) under a threading.Lock when a loop registers or
leaves, so the hot path reads it with no lock at all. A loop leaves when it
shuts down (asyncio.run() and asyncio.Runner close the loop's async generators
first; a parked one closes the pool then, see _Pool.arm_shutdown_hook); loops
closed without that step are swept out whenever another loop registers and on
close(). Finished loops do not pile up, and their connections are closed.

fork(): in the child, every connection inherited from the parent is
abandoned at once (forks.py), never closed or shut down (the socket is the
parent's too); the pools stay, so the child's first command on any loop
opens a connection of its own.

Reconnect: a lost connection fails its pending commands with RedisConnectionError; the
next command opens a new connection at once. A connect that fails (refused,
timed out, handshake refused or unanswered) starts a backoff (BACKOFF_START_S,
doubling, capped at BACKOFF_CAP_S) during which commands fail fast with a
RedisConnectionError saying when the next attempt is due: callers are not held up by a
dead server, and the client is back within BACKOFF_CAP_S of Redis returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
import threading
from asyncio import get_running_loop
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import Any, TypedDict

from ._encoding import Arg, encode_command, encode_evalsha
from .client_options import (
    BACKOFF_CAP_S,
    BACKOFF_START_S,
    reconnect_delay_s,
)
from .connection import CommandNotSentError, RedisConnection, ScriptLike
from .connector import Connector
from .errors import RedisClientError, RedisReplyError
from .forks import abandon_in_children
from .grouping import joining
from .url import RedisAddress, address_of, parse_url
from .url_options import FromUrl

__all__ = ["BACKOFF_CAP_S", "BACKOFF_START_S", "ClientOptions", "RedisClient", "ScriptLike"]

_MAX_CONNECTIONS_PER_LOOP = 64


class _Slot:
    """One connection position of a loop's pool, with its reconnect backoff."""

    __slots__ = ("connection", "failures", "last_error", "pool", "retry_at")

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        # A plain attribute, read by pick() for every slot: set it with attach().
        self.connection: RedisConnection | None = None
        self.failures = 0
        # loop.time() before which no new connect is attempted.
        self.retry_at = 0.0
        self.last_error: RedisClientError | None = None

    def attach(self, connection: RedisConnection | None) -> None:
        self.connection = connection
        if len(self.pool.slots) == 1:
            self.pool.only = connection

    def connection_closed(
        self, connection: RedisConnection, error: RedisClientError | None, healthy: bool
    ) -> None:
        if connection is not self.connection or error is None:
            return  # a stale connection, or closed on purpose: no backoff
        if healthy:
            # It worked, then dropped (a restart, a network blip): retry at once.
            self.failures = 0
            self.retry_at = 0.0
        else:
            self.failures += 1
            self.retry_at = self.pool.loop.time() + reconnect_delay_s(self.failures)
        self.last_error = error


class _Pool:
    """The connections of one event loop."""

    __slots__ = (
        "_shutdown_hook",
        "batching",
        "client",
        "loop",
        "only",
        "slots",
    )

    def __init__(self, client: RedisClient, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.client = client
        self.loop = loop
        self.slots = [_Slot(self) for _ in range(size)]
        # With one connection per loop, that connection while it is open: the hot
        # path reads this and skips pick().
        self.only: RedisConnection | None = None
        # The connection pick() chose last: while its batch of this loop turn is
        # still open, the next command joins it.
        self.batching: RedisConnection | None = None
        self._shutdown_hook: AsyncGenerator[None, None] | None = None

    def pick(self) -> RedisConnection:
        """The connection this loop turn's commands go to, opened if need be.

        Every command of one loop turn joins the first one's connection, so a
        turn's batch leaves in one write and its replies come back in one read
        (split over several connections, the same commands cost a write, a
        read and a wake-up each). The first command of a turn takes the
        connection with the fewest commands in flight, the first on a tie: a
        caller that waits for each reply stays on one connection (each command
        then carries the TCP acknowledgement of the previous reply), while
        the batches of successive turns spread over all of them, so Redis
        works on one batch while this process reads another's replies. A slot
        waiting out a reconnect backoff is passed over while another can take
        the command; RedisConnectionError when none can. (The last connection
        picked, while it has nothing in flight, is taken again without a look
        at the others: no slot can have fewer, and a sequential caller stays.)
        """
        current = self.batching
        if current is not None and current.usable and (current.batch_open or not current._pending):
            return current
        slots = self.slots
        slot = slots[0]
        if len(slots) > 1:
            fewest = -1
            now = -1.0
            for candidate in slots:
                connection = candidate.connection
                if connection is not None and connection.usable:
                    in_flight = len(connection._pending)
                else:
                    if now < 0:
                        now = self.loop.time()
                    if candidate.retry_at > now:
                        continue  # in a backoff: only if no other slot can be used
                    in_flight = 0  # opens now
                if fewest < 0 or in_flight < fewest:
                    slot, fewest = candidate, in_flight
                    if in_flight == 0:
                        break
        connection = slot.connection
        if connection is None or not connection.usable:
            wait_s = slot.retry_at - self.loop.time()
            if wait_s > 0:
                raise CommandNotSentError(
                    f"{slot.last_error}; not retrying yet: "
                    f"next connect attempt in {math.ceil(wait_s * 1000)} ms"
                )
            connection = self.client._open(slot)
        self.batching = connection
        return connection

    def failed(self, error: BaseException) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        future.set_exception(error)
        return future

    def arm_shutdown_hook(self) -> None:
        """Have the loop close this pool when it shuts down (call from the loop's thread).

        asyncio has no "loop closing" callback, but asyncio.run(), asyncio.Runner
        (pytest-asyncio's per-test loops) and uvloop all close every live async
        generator of the loop (shutdown_asyncgens) before closing it. So one
        generator, started here and parked at its first yield, runs its
        ``finally`` then, while the loop still runs: the connections close
        cleanly and the loop leaves the client's mappings. A loop closed without
        that step is swept out later (see RedisClient._register).
        """
        hook = _close_at_loop_shutdown(self)
        with contextlib.suppress(StopIteration):
            # Runs to the first yield synchronously: nothing in it awaits.
            hook.__anext__().send(None)
        # The loop only keeps a weak reference to its async generators.
        self._shutdown_hook = hook

    def release(self) -> None:
        """Close the connections now (from the loop's thread) and retire the hook."""
        hook, self._shutdown_hook = self._shutdown_hook, None
        if hook is None:
            self.shutdown()
            return
        with contextlib.suppress(StopIteration):
            hook.aclose().send(None)  # runs its finally: shutdown()

    def shutdown(self) -> None:
        self.client._forget(self)
        for connection in self._detached():
            connection.close_nowait()

    def abandon(self) -> None:
        """In a fork()ed child: let go of the parent's connections; the next command reconnects."""
        self.batching = None
        for slot in self.slots:
            slot.failures = 0
            slot.retry_at = 0.0
        for connection in self._detached():
            connection.abandon()

    def discard(self) -> None:
        """Drop the connections of a loop that is already closed (nothing can run on it)."""
        self._shutdown_hook = None
        for connection in self._detached():
            connection.discard()

    def _detached(self) -> list[RedisConnection]:
        """Every slot's connection, each slot left without one (before any is told)."""
        connections = [slot.connection for slot in self.slots if slot.connection is not None]
        for slot in self.slots:
            slot.attach(None)
        return connections


async def _close_at_loop_shutdown(pool: _Pool) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        pool.shutdown()


class ClientOptions(TypedDict, total=False):
    """RedisClient's options, declared once: SentinelClient and ClusterClient
    take the same keywords and hand them to each RedisClient they make (which
    checks them)."""

    connect_timeout_s: float
    command_timeout_s: float
    connections_per_loop: int
    ssl_context: ssl.SSLContext | None
    client_name: str | None


class RedisClient(FromUrl, Connector):
    """A minimal asyncio Redis client (RESP2) that pipelines every command of a loop turn.

    Nothing connects until the first command or ``connect()``. Use it from a
    running event loop; one client may serve any number of loops and threads.

    Time limits: a command gets ``command_timeout_s`` from the loop turn it was
    issued in, whether its connection is ready or still connecting; a connect
    (TCP, TLS and the handshake) gets ``connect_timeout_s`` and goes on in the
    background for later commands even when the first ones time out. So no
    command waits longer than ``command_timeout_s`` (twice that when a NOSCRIPT
    reply has it re-sent behind a SCRIPT LOAD), and ``connect()`` no longer than
    ``connect_timeout_s``.

    ``role`` ("master" or "slave"): every connection, reconnects included,
    sends ``ROLE`` in its handshake and is used only if the server reports that
    role; otherwise the connect fails and the commands waiting for it fail with
    CommandNotSentError (they never left this process).

    ``batch_decisions`` (off by default): the checks a loop turn sends on one
    connection, adjacent calls of one decision script, leave as one call of its
    batched form (moderato/redis/grouping.py, joined in C: csrc/grouping.c), each
    decided exactly as alone: less Redis CPU per check, a little more of this
    process's (BENCHMARKS.md, "A loop turn's checks joined in C"). A ClusterClient
    takes the same option for its nodes, which join a turn's checks across the
    slots they serve. A URL turns it on with ``?batch_decisions=true``
    (url_options.py; it wins over the keyword).
    """

    parse_url = staticmethod(parse_url)

    def __init__(
        self,
        address: RedisAddress | str,
        *,
        connect_timeout_s: float = 1.0,
        command_timeout_s: float = 0.5,
        connections_per_loop: int = 1,
        ssl_context: ssl.SSLContext | None = None,
        client_name: str | None = None,
        role: str | None = None,
        batch_decisions: bool = False,
    ) -> None:
        address = address_of(address, RedisAddress, parse_url)
        Connector.__init__(
            self, address, connect_timeout_s, command_timeout_s, ssl_context, client_name, role
        )
        if isinstance(connections_per_loop, bool) or not isinstance(connections_per_loop, int):
            raise TypeError(
                f"connections_per_loop must be an int, got {type(connections_per_loop).__name__}"
            )
        if not 1 <= connections_per_loop <= _MAX_CONNECTIONS_PER_LOOP:
            raise ValueError(
                f"connections_per_loop must be 1..{_MAX_CONNECTIONS_PER_LOOP}, "
                f"got {connections_per_loop}"
            )
        self.connections_per_loop = connections_per_loop
        self.batch_decisions = bool(batch_decisions)

        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
        self._pools_lock = threading.Lock()
        abandon_in_children(self)

    def __repr__(self) -> str:
        return f"<RedisClient {self.address} loops={len(self._pools)}>"

    # -- commands ----------------------------------------------------------------
    #
    # execute() and evalsha() are plain methods returning the reply's future
    # rather than coroutines: a coroutine object and frame per command cost about
    # as much CPU as everything else the client does for it. Await the result,
    # or hand it to gather()/wait()/ensure_future(); it is not a coroutine, so
    # asyncio.create_task() does not take it. Errors (including "server
    # unreachable") surface when it is awaited; only a wrong argument type
    # raises (TypeError) at the call itself.

    def execute(self, *args: Arg) -> asyncio.Future[Any]:
        """Run one command; the future resolves to its reply (bytes, int, list or None).

        It raises RedisReplyError for an error reply and RedisConnectionError when the
        server cannot be reached or does not reply within ``command_timeout_s``.
        """
        # Encoded first: a TypeError is raised whatever else.
        payload = encode_command(*args)
        pool = self._pools.get(get_running_loop()) or self._current_pool()
        connection = pool.only
        if connection is None or not connection.usable:
            try:
                connection = pool.pick()
            except RedisClientError as error:
                return pool.failed(error)
        return connection.send(payload)

    def evalsha(
        self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]
    ) -> asyncio.Future[Any]:
        """Run a Lua script by its SHA1; the future resolves to the script's reply.

        ``keys`` and ``args`` are tuples or lists, kept until the reply arrives
        (do not mutate them meanwhile). If the server lacks the script (SCRIPT
        FLUSH, a restart, a failover) the connection loads it once (SCRIPT
        LOAD) and sends the call again behind the load, as every other call
        of it answered NOSCRIPT meanwhile; that second round trip has its own
        timeout, so such a call may take up to twice ``command_timeout_s``.
        """
        # execute()'s steps with pick()'s first test written out: every check's path.
        payload = encode_evalsha(script.sha, keys, args)
        pool = self._pools.get(get_running_loop()) or self._current_pool()
        connection = pool.only
        if connection is None or not connection.usable:
            # Several connections: pick()'s first test, written out.
            connection = pool.batching
            if (
                connection is None
                or not connection.usable
                or not (connection.batch_open or not connection._pending)
            ):
                try:
                    connection = pool.pick()
                except RedisClientError as error:
                    return pool.failed(error)
        return connection.send_script(payload, script, keys, args)

    async def execute_many(
        self, commands: Iterable[Sequence[Arg]], *, raise_on_error: bool = True
    ) -> list[Any]:
        """Run several commands as one pipeline (not a transaction); replies in order.

        With ``raise_on_error`` the first error reply is raised once every reply
        is in; without it, error replies are returned in place as RedisReplyError.
        A RedisConnectionError (timeout, lost connection) is always raised.
        """
        payloads = [encode_command(*command) for command in commands]
        if not payloads:
            return []
        futures = self._current_pool().pick().send_many(payloads)
        try:
            await asyncio.wait(futures)
        except BaseException:
            # Cancelled: nobody will read these, so none may hold an unread exception.
            for future in futures:
                future.cancel()
            raise
        replies: list[Any] = []
        first_error: BaseException | None = None
        for future in futures:
            error = future.exception()
            if error is None:
                replies.append(future.result())
            elif isinstance(error, RedisReplyError) and not raise_on_error:
                replies.append(error)
            elif first_error is None or (
                isinstance(first_error, RedisReplyError) and not isinstance(error, RedisReplyError)
            ):
                # A transport failure outranks an error reply: it says more.
                first_error = error
        if first_error is not None:
            raise first_error
        return replies

    # -- lifecycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open this loop's connections now; raise RedisConnectionError if any cannot be opened.

        Unlike a command, this tries even while a reconnect backoff is running.
        """
        pool = self._current_pool()
        connections = []
        for slot in pool.slots:  # all connect at once
            connection = slot.connection
            if connection is None or not connection.usable:
                connection = self._open(slot)
            connections.append(connection)
        for connection in connections:
            await connection.wait_ready()

    async def close(self) -> None:
        """Close every connection (of every loop); pending commands fail with RedisConnectionError.

        The client stays usable: the next command connects again.
        """
        with self._pools_lock:
            pools, self._pools = self._pools, {}
        current = get_running_loop()
        for loop, pool in pools.items():
            if loop is current:
                pool.release()
            elif loop.is_closed():
                pool.discard()
            else:
                # Another thread's loop: its connections may only be touched there.
                try:
                    loop.call_soon_threadsafe(pool.release)
                except RuntimeError:  # it closed meanwhile
                    pool.discard()

    def connections(self) -> list[RedisConnection]:
        """The current loop's open connections (for diagnostics and tests)."""
        pool = self._pools.get(get_running_loop())
        if pool is None:
            return []
        return [
            slot.connection
            for slot in pool.slots
            if slot.connection is not None and slot.connection.usable
        ]

    def after_fork_in_child(self) -> None:
        """Right after fork(), in the child: abandon the parent's connections (forks.py)."""
        # Another thread of the parent may have held the lock at the fork.
        self._pools_lock = threading.Lock()
        for pool in self._pools.values():
            pool.abandon()

    # -- internals ---------------------------------------------------------------

    def _current_pool(self) -> _Pool:
        """The running loop's pool, registered if new."""
        loop = get_running_loop()
        return self._pools.get(loop) or self._register(loop)

    def _register(self, loop: asyncio.AbstractEventLoop) -> _Pool:
        """Add a pool for ``loop`` (the running loop), forgetting closed loops."""
        with self._pools_lock:
            pool = self._pools.get(loop)
            if pool is not None:
                return pool
            pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
            dead: list[_Pool] = []
            for other, other_pool in self._pools.items():
                if other.is_closed():
                    dead.append(other_pool)
                else:
                    pools[other] = other_pool
            pool = _Pool(self, loop, self.connections_per_loop)
            pools[loop] = pool
            # Readers on other threads see the old dict or the new one, never a half-built one.
            self._pools = pools
        pool.arm_shutdown_hook()
        for dead_pool in dead:
            dead_pool.discard()
        return pool

    def _forget(self, pool: _Pool) -> None:
        """Remove ``pool`` from the mappings (its loop is shutting down)."""
        with self._pools_lock:
            if self._pools.get(pool.loop) is pool:
                pools = dict(self._pools)
                del pools[pool.loop]
                self._pools = pools

    def _grouping(self, connection: RedisConnection) -> Callable[[], None]:
        """What ``connection``'s flush calls first when batching (a cluster's node
        clients join across slots instead, cluster.py): grouping.group_checks,
        in C."""
        return joining(connection)

    def _open(self, slot: _Slot) -> RedisConnection:
        connection = self.loop_connection(slot.pool.loop, slot.connection_closed)
        if self.batch_decisions:
            connection._group = self._grouping(connection)
        slot.attach(connection)
        connection.start(self.connect_timeout_s)
        return connection
