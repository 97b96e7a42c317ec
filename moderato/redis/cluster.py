"""ClusterClient: RedisClient's surface over a Redis Cluster (RESP2, auto-pipelined per node).

Routing. The client keeps a slot map (16384 entries, each a primary) loaded
from ``CLUSTER SHARDS`` (``CLUSTER SLOTS`` on servers before 7.0) of any node
that answers: the known primaries first, then the other known nodes, then the
URL's seeds. Every node gets its own RedisClient, so each node has the same
per-event-loop multiplexed connections, auto-pipelining, reconnect backoff and
NOSCRIPT recovery a single server has (a script missing on a node is loaded
there once, by each connection that meets the NOSCRIPT). A command goes to the owner of
the slot of its first key (``_accel.key_slot``: CRC16 of the key or of its
``{hash tag}``); keyless commands go to any primary, except SCAN, which goes to
the owner of its MATCH pattern's hash tag (one slot: one node holds every key
the pattern can match).

The fast path is one slot lookup and the node client's own future. Only a
failed command enters the recovery loop, which is bounded twice: by
``max_redirects`` redirections and by ``command_timeout_s`` counted from the
call (the first attempt included), so no call waits longer than that timeout
(twice it if a NOSCRIPT reply had the call re-sent, as for RedisClient).

- ``MOVED slot host:port``: the slot has a new owner. The map entry is updated
  at once, the whole map is reloaded in the background (at most one reload in
  flight, at most one started every REFRESH_INTERVAL_S), and the command is
  sent to the new owner.
- ``ASK slot host:port``: the slot is being migrated; the command is sent to
  the target preceded by ``ASKING``, both in the same write on the same
  connection. Scripts need care here: moderato's decision scripts declare base
  keys but read and write keys derived from them, which Redis cannot see. A
  migrating source therefore answers ASK even while it still holds the state,
  and running the script on the target would start from an empty state
  (admitting too much; the target's new key would also make the operator's
  MIGRATE fail with BUSYKEY). So an EVALSHA follows ASK only once the source
  holds no key of that slot any more (``CLUSTER COUNTKEYSINSLOT`` = 0, which
  stays true until the migration ends); until then it is retried with backoff
  like TRYAGAIN. Plain commands declare every key they touch and follow ASK at
  once.
- ``TRYAGAIN`` (a multi-key command during a migration), ``CLUSTERDOWN`` and
  ``LOADING``: retried with backoff (5 ms doubling to 100 ms) within the
  timeout; CLUSTERDOWN also triggers a map reload.
- A lost, refused or not-yet-retried connection (a node crashed, a failover):
  the map is reloaded from any reachable node and the command retried on the
  slot's owner, with the same backoff, within the timeout. A script is retried
  so only if it was never written (CommandNotSentError: refused connect,
  reconnect backoff, held back while connecting): one that was written and
  lost its reply (connection dropped, timeout, malformed reply) may have
  charged, so its RedisConnectionError is raised instead. Plain commands (the
  limiter's are reads, SCAN and UNLINK) are retried either way.
- Any other error reply (CROSSSLOT included) is raised as RedisReplyError.

What the client saw is counted in ``counters`` (a ClusterCounters).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple

from .._accel import key_slot
from ._encoding import Arg, encode_command
from .client import ClientOptions, RedisClient
from .connection import CommandNotSentError, ScriptLike
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .url import ClusterAddress, address_of, parse_cluster_url
from .url_options import client_from_url

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "REFRESH_INTERVAL_S",
    "SLOTS",
    "ClusterClient",
    "ClusterCounters",
]

SLOTS = 16384
DEFAULT_MAX_REDIRECTS = 5
# At most one slot-map reload is started per this many seconds (per client).
REFRESH_INTERVAL_S = 0.1
# Nodes asked for the slot map at once during a reload.
_REFRESH_FANOUT = 3
_RETRY_START_S = 0.005
_RETRY_CAP_S = 0.1
_ASKING = encode_command("ASKING")
# Commands that name no key: sent to any primary.
_KEYLESS = frozenset(
    {
        b"PING", b"ECHO", b"INFO", b"TIME", b"DBSIZE", b"CLUSTER", b"SCRIPT", b"CONFIG",
        b"CLIENT", b"COMMAND", b"FLUSHALL", b"FLUSHDB", b"LASTSAVE", b"MEMORY", b"SLOWLOG",
        b"LATENCY", b"FUNCTION", b"RANDOMKEY", b"WAIT", b"ROLE", b"HELLO", b"AUTH",
    }
)  # fmt: skip
_SCRIPT_COMMANDS = frozenset(
    {b"EVAL", b"EVALSHA", b"EVAL_RO", b"EVALSHA_RO", b"FCALL", b"FCALL_RO"}
)
_GLOB_CHARACTERS = frozenset("*?[]\\")


@dataclass
class ClusterCounters:
    """What a ClusterClient has seen since it was made (for diagnostics, tests and logs)."""

    moved: int = 0
    """MOVED replies followed."""
    ask: int = 0
    """ASK replies followed (ASKING + the command sent to the migration target)."""
    ask_deferred: int = 0
    """ASK replies to a script not followed yet: the source still held keys of the slot."""
    tryagain: int = 0
    clusterdown: int = 0
    loading: int = 0
    connection_errors: int = 0
    """Commands retried after a lost, refused or backed-off connection."""
    lost_replies: int = 0
    """Script calls not retried: written, then their reply was lost (they may have run)."""
    refreshes: int = 0
    """Slot maps loaded."""
    refresh_failures: int = 0
    """Reloads for which no node gave a usable slot map."""


class _Node:
    """One cluster node: its name (``host:port``) and its own RedisClient."""

    __slots__ = ("client", "host", "name", "port")

    def __init__(self, host: str, port: int, client: RedisClient) -> None:
        self.host = host
        self.port = port
        self.name = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.client = client

    def __repr__(self) -> str:
        return f"<node {self.name}>"


class _Request(NamedTuple):
    """One call being recovered: how to send it normally, and after ASK."""

    slot: int | None
    started: float
    args: Sequence[Arg]
    script: ScriptLike | None = None
    keys: Sequence[Arg] = ()

    def send(self, client: RedisClient) -> asyncio.Future[Any]:
        if self.script is not None:
            return client.evalsha(self.script, self.keys, self.args)
        return client.execute(*self.args)

    def asking_payload(self) -> bytes:
        # After ASK a script goes as EVAL: the target may not have it cached, and
        # a NOSCRIPT repaired by the connection would be re-sent without ASKING.
        if self.script is not None:
            return encode_command(
                "EVAL", self.script.source, len(self.keys), *self.keys, *self.args
            )
        return encode_command(*self.args)


# (start, end, host, port) per slot range of a primary; (host, port) of every node.
_SlotRanges = list[tuple[int, int, str, int]]
_Topology = tuple[_SlotRanges, list[tuple[str, int]]]


class ClusterClient:
    """A Redis Cluster client with RedisClient's surface: ``execute``, ``evalsha``,
    ``connect``, ``close``.

    ``execute()`` and ``evalsha()`` return awaitables (coroutines here, where
    RedisClient returns futures): await them, or hand them to gather().
    Nothing connects until the first command or ``connect()``. The options are
    RedisClient's and apply to every node; ``max_redirects`` bounds the MOVED
    and ASK redirections one command may follow.
    """

    def __init__(
        self,
        address: ClusterAddress | str,
        *,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        **options: Unpack[ClientOptions],
    ) -> None:
        address = address_of(address, ClusterAddress, parse_cluster_url, "a cluster URL str")
        if options.get("ssl_context") is not None and not address.tls:
            raise ValueError(
                f"ssl_context was given but {address} is not a TLS address; use rediss+cluster://"
            )
        if isinstance(max_redirects, bool) or not isinstance(max_redirects, int):
            raise TypeError(f"max_redirects must be an int, got {type(max_redirects).__name__}")
        if not 1 <= max_redirects <= 100:
            raise ValueError(f"max_redirects must be 1..100, got {max_redirects}")
        self.address = address
        self.max_redirects = max_redirects
        self._client_options = options
        self.counters = ClusterCounters()

        self._lock = threading.Lock()
        # Copy on write under _lock: readers never lock.
        self._nodes: dict[str, _Node] = {}
        # The seeds' clients are built now: they check the options, and their
        # timeouts are the cluster's.
        self._seeds = tuple(self._node(host, port) for host, port in address.seeds)
        self.connect_timeout_s = self._seeds[0].client.connect_timeout_s
        self.command_timeout_s = self._seeds[0].client.command_timeout_s
        self._table: list[_Node | None] | None = None
        self._primaries: tuple[_Node, ...] = ()
        self._known: tuple[_Node, ...] = ()
        self._rotation = 0
        # slot -> (source, target) whose source was seen holding no key of the slot.
        self._drained: dict[int, tuple[str, str]] = {}
        self._refresh_task: asyncio.Task[bool] | None = None
        self._refresh_started = -REFRESH_INTERVAL_S
        self._refresh_error = "the slot map was never loaded"
        self._tasks: set[asyncio.Task[Any]] = set()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ClusterClient:
        """``ClusterClient(parse_cluster_url(url), **options)``; a bad URL is a ValueError."""
        return client_from_url(cls, parse_cluster_url, url, options)

    def __repr__(self) -> str:
        return f"<ClusterClient {self.address} primaries={len(self._primaries)}>"

    # -- commands ----------------------------------------------------------------

    async def execute(self, *args: Arg) -> Any:
        """Run one command on the node that owns its first key; returns its reply.

        Raises RedisReplyError for an error reply (after following redirections)
        and RedisConnectionError when no node could answer within ``command_timeout_s``.
        """
        slot = _command_slot(args)
        table = self._table
        node = None if table is None else (self._any_primary() if slot is None else table[slot])
        started = monotonic()
        if node is not None:
            try:
                return await node.client.execute(*args)
            except RedisClientError as error:
                return await self._recover(_Request(slot, started, args), node, error)
        return await self._recover(_Request(slot, started, args), None, None)

    async def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a Lua script on the node owning ``keys[0]``; returns the script's reply.

        Every key must share one slot (give them one ``{hash tag}``), as Redis
        requires; NOSCRIPT is repaired by the node's connection (SCRIPT LOAD, then
        the call again).
        """
        table = self._table
        slot = key_slot(_key_text(keys[0])) if keys else None
        node = None if table is None else (self._any_primary() if slot is None else table[slot])
        started = monotonic()
        if node is not None:
            try:
                return await node.client.evalsha(script, keys, args)
            except RedisClientError as error:
                request = _Request(slot, started, args, script, keys)
                return await self._recover(request, node, error)
        return await self._recover(_Request(slot, started, args, script, keys), None, None)

    async def execute_on_primaries(self, *args: Arg) -> dict[str, Any]:
        """Run one command on every primary (SCRIPT FLUSH, FLUSHALL...); replies by node name."""
        await self._ensure_map(monotonic() + self.command_timeout_s)
        primaries = self._primaries
        outcomes = await asyncio.gather(
            *(node.client.execute(*args) for node in primaries), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return {node.name: outcome for node, outcome in zip(primaries, outcomes)}

    # -- lifecycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Load the slot map and connect to every primary; raise RedisConnectionError on failure."""
        task = self._start_refresh(force=True)
        assert task is not None
        if not await asyncio.shield(task):
            raise RedisConnectionError(
                f"cannot load the Redis Cluster slot map of {self.address}: {self._refresh_error}"
            )
        outcomes = await asyncio.gather(
            *(node.client.connect() for node in self._primaries), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def close(self) -> None:
        """Close every node's connections (of every loop). The client stays usable."""
        task = self._refresh_task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for node in list(self._nodes.values()):
            await node.client.close()

    # -- diagnostics -------------------------------------------------------------

    def primaries(self) -> list[str]:
        """Names (``host:port``) of the primaries in the current slot map."""
        return [node.name for node in self._primaries]

    def node_for_slot(self, slot: int) -> str | None:
        """Name of the primary the map gives ``slot`` to (None before the map is loaded)."""
        table = self._table
        node = None if table is None else table[slot]
        return None if node is None else node.name

    def node_for_key(self, key: Arg) -> str | None:
        """Name of the primary the map gives ``key``'s slot to (None before the map is loaded).

        The limiter keeps one circuit breaker per node with this.
        """
        table = self._table
        node = None if table is None else table[key_slot(_key_text(key))]
        return None if node is None else node.name

    def node_client(self, name: str) -> RedisClient:
        """The RedisClient of one node, by name (``host:port``)."""
        return self._nodes[name].client

    # -- recovery ----------------------------------------------------------------

    async def _recover(
        self, request: _Request, node: _Node | None, error: RedisClientError | None
    ) -> Any:
        """Follow redirections and retry what is safe until an answer, or the deadline."""
        deadline = request.started + self.command_timeout_s
        redirects = 0
        pause = _RETRY_START_S
        asking = False
        while True:
            if error is not None:
                if isinstance(error, RedisReplyError):
                    message = error.message
                    kind = message.split(" ", 1)[0]
                    if kind in ("MOVED", "ASK"):
                        redirects += 1
                        if redirects > self.max_redirects:
                            raise RedisConnectionError(
                                f"Redis Cluster: more than {self.max_redirects} redirections "
                                f"for one command (last: {message})"
                            )
                        slot, target = self._redirect_target(message, node)
                        if kind == "MOVED":
                            self.counters.moved += 1
                            self._moved(slot, target)
                            node, asking = target, False
                        elif (
                            request.script is not None
                            and node is not None
                            and not await self._source_drained(slot, node, target, deadline)
                        ):
                            # The source may still hold the script's state: wait.
                            self.counters.ask_deferred += 1
                            redirects -= 1  # a wait, bounded by the deadline instead
                            waiting = RedisConnectionError(
                                f"Redis Cluster: slot {slot} is migrating from {node.name} to "
                                f"{target.name} and {node.name} still holds keys of it; "
                                f"no answer within {self.command_timeout_s:g} s"
                            )
                            pause = await self._pause(pause, deadline, waiting)
                            asking = False
                        else:
                            self.counters.ask += 1
                            node, asking = target, True
                    elif kind in ("TRYAGAIN", "CLUSTERDOWN", "LOADING"):
                        if kind == "TRYAGAIN":
                            self.counters.tryagain += 1
                        elif kind == "LOADING":
                            self.counters.loading += 1
                        else:
                            self.counters.clusterdown += 1
                            self._start_refresh(force=False)
                        pause = await self._pause(pause, deadline, error)
                        node, asking = self._owner(request), False
                    else:
                        raise error
                else:
                    if request.script is not None and not isinstance(error, CommandNotSentError):
                        # Written, then no usable reply (lost connection, timeout,
                        # garbled stream): the script may have charged, and running
                        # it again would charge twice.
                        self.counters.lost_replies += 1
                        raise error
                    # Lost, refused or backed-off connection: the node may be gone.
                    self.counters.connection_errors += 1
                    await self._refreshed(deadline)
                    owner = self._owner(request)
                    if owner is node or owner is None:
                        pause = await self._pause(pause, deadline, error)
                        owner = self._owner(request)
                    node, asking = owner, False
            if node is None:
                await self._ensure_map(deadline)
                node = self._owner(request)
                if node is None:
                    error = RedisConnectionError(
                        f"Redis Cluster {self.address}: no node serves slot {request.slot}"
                    )
                    pause = await self._pause(pause, deadline, error)
                    continue
            asking_reply: asyncio.Future[Any] | None = None
            if asking:
                asking_reply, future = self._send_asking(node, request)
            else:
                future = request.send(node.client)
            try:
                return await self._bounded(future, deadline)
            except RedisClientError as failure:
                error = failure
                if asking_reply is not None:
                    refusal = _asking_refusal(asking_reply, node)
                    if refusal is not None:
                        # Else the target's ASK would be followed again and
                        # again: "too many redirections" would hide the cause.
                        raise refusal from None

    def _owner(self, request: _Request) -> _Node | None:
        table = self._table
        if table is None:
            return None
        if request.slot is None:
            return self._any_primary()
        return table[request.slot]

    def _any_primary(self) -> _Node | None:
        primaries = self._primaries
        if not primaries:
            return None
        self._rotation = index = (self._rotation + 1) % len(primaries)
        return primaries[index]

    async def _pause(self, pause: float, deadline: float, error: RedisClientError) -> float:
        """Sleep ``pause`` (or what is left before the deadline); raise ``error`` if none is."""
        remaining = deadline - monotonic()
        if remaining <= 0:
            raise error
        await asyncio.sleep(min(pause, remaining))
        return min(pause * 2, _RETRY_CAP_S)

    async def _bounded(self, future: asyncio.Future[Any], deadline: float) -> Any:
        if future.done():
            return await future
        remaining = deadline - monotonic()
        if remaining <= 0:
            future.cancel()
            raise self._timeout_error()
        try:
            return await asyncio.wait_for(future, remaining)
        except asyncio.TimeoutError:
            raise self._timeout_error() from None

    def _timeout_error(self) -> RedisClientError:
        return RedisConnectionError(
            f"Redis Cluster {self.address}: no answer within {self.command_timeout_s:g} s "
            "(command timeout, retries included)"
        )

    def _send_asking(
        self, node: _Node, request: _Request
    ) -> tuple[asyncio.Future[Any] | None, asyncio.Future[Any]]:
        """``ASKING`` and the command on one connection of ``node``, in one write.

        (ASKING's reply or None if nothing was sent, the command's reply.)
        """
        pool = node.client._current_pool()
        try:
            connection = pool.pick()
        except RedisClientError as error:
            return None, pool.failed(error)
        asking, reply = connection.send_many([_ASKING, request.asking_payload()])
        asking.add_done_callback(_consume)
        return asking, reply

    async def _source_drained(
        self, slot: int, source: _Node, target: _Node, deadline: float
    ) -> bool:
        """Whether ``source`` holds no key of ``slot`` any more (so ASK is safe for scripts)."""
        pair = (source.name, target.name)
        if self._drained.get(slot) == pair:
            return True
        try:
            count = await self._bounded(
                source.client.execute("CLUSTER", "COUNTKEYSINSLOT", slot), deadline
            )
        except RedisReplyError as error:
            if error.message.startswith("NOPERM"):
                # Waiting could never end: say why instead of timing out (an
                # error reply still: the node answered, it is not down).
                raise RedisReplyError(
                    f"{source.name}: {error.message} (needed to follow ASK for a script "
                    f"while slot {slot} migrates; see the ACL in docs/operations.md)"
                ) from None
            return False
        except RedisClientError:
            return False
        if count == 0:
            self._drained[slot] = pair
            return True
        return False

    def _redirect_target(self, message: str, node: _Node | None) -> tuple[int, _Node]:
        """(slot, node) of ``MOVED <slot> <host>:<port>`` or ``ASK ...``."""
        parts = message.split(" ")
        try:
            slot = int(parts[1])
            host, _, port_text = parts[2].rpartition(":")
            port = int(port_text)
            if not 0 <= slot < SLOTS or not 0 < port < 65536:
                raise ValueError
        except (IndexError, ValueError):
            raise RedisConnectionError(
                f"Redis Cluster sent a malformed redirection: {message!r}"
            ) from None
        host = host.strip("[]")
        if not host:
            # An unknown endpoint: the node that replied is reached the same way.
            if node is None:
                raise RedisConnectionError(
                    f"Redis Cluster sent a redirection without a host: {message!r}"
                )
            host = node.host
        return slot, self._node(host, port)

    def _moved(self, slot: int, target: _Node) -> None:
        table = self._table
        if table is not None:
            table[slot] = target  # one item: readers see the old node or the new one
        self._drained.pop(slot, None)
        self._start_refresh(force=False)

    # -- the slot map --------------------------------------------------------------

    def _start_refresh(self, *, force: bool) -> asyncio.Task[bool] | None:
        """The running loop's reload in flight, else a new one if one is due (or forced)."""
        loop = asyncio.get_running_loop()
        task = self._refresh_task
        if task is not None and not task.done() and task.get_loop() is loop:
            return task
        now = monotonic()
        if not force and now - self._refresh_started < REFRESH_INTERVAL_S:
            return None
        self._refresh_started = now
        task = loop.create_task(self._load_map())
        self._refresh_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _refreshed(self, deadline: float) -> None:
        """Wait (until the deadline at most) for a reload, if one is running or due."""
        task = self._start_refresh(force=False)
        if task is None:
            return
        remaining = deadline - monotonic()
        if remaining > 0:
            await asyncio.wait({task}, timeout=remaining)

    async def _ensure_map(self, deadline: float) -> None:
        """Load the map if there is none yet (RedisConnectionError if not in time)."""
        if self._table is not None:
            return
        task = self._start_refresh(force=True)
        assert task is not None
        remaining = deadline - monotonic()
        if remaining > 0:
            await asyncio.wait({task}, timeout=remaining)
        if self._table is None:
            raise RedisConnectionError(
                f"cannot load the Redis Cluster slot map of {self.address}: {self._refresh_error}"
            )

    async def _load_map(self) -> bool:
        """Ask nodes for the slot map until one gives a usable one; install it."""
        candidates: list[_Node] = []
        seen: set[str] = set()
        primaries = list(self._primaries)
        if primaries:
            shift = self._rotation % len(primaries)
            primaries = primaries[shift:] + primaries[:shift]
        for node in (*primaries, *self._known, *self._seeds):
            if node.name not in seen:
                seen.add(node.name)
                candidates.append(node)
        errors: list[str] = []
        for start in range(0, len(candidates), _REFRESH_FANOUT):
            topology = await self._first_topology(
                candidates[start : start + _REFRESH_FANOUT], errors
            )
            if topology is not None:
                self._install(*topology)
                self.counters.refreshes += 1
                return True
        self._refresh_error = "; ".join(errors) or "no node to ask"
        self.counters.refresh_failures += 1
        return False

    async def _first_topology(self, nodes: list[_Node], errors: list[str]) -> _Topology | None:
        tasks = {asyncio.ensure_future(self._topology(node)): node for node in nodes}
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    node = tasks.pop(task)
                    failure = task.exception()
                    if failure is None:
                        return task.result()
                    errors.append(f"{node.name}: {failure}")
            return None
        finally:
            for task in tasks:
                task.cancel()
                task.add_done_callback(_consume)

    async def _topology(self, node: _Node) -> _Topology:
        """The slot map as ``node`` sees it."""
        try:
            reply = await node.client.execute("CLUSTER", "SHARDS")
        except RedisReplyError as error:
            text = error.message.lower()
            if "cluster support disabled" in text:
                raise RedisConnectionError(f"{node.name} is not a Redis Cluster node") from None
            if "unknown" not in text:
                raise
            # Before Redis 7.0.
            slots_reply = await node.client.execute("CLUSTER", "SLOTS")
            topology = _parse_slots(slots_reply, node.host)
        else:
            topology = _parse_shards(reply, node.host, self.address.tls)
        ranges = topology[0]
        if not ranges:
            raise RedisConnectionError(f"{node.name} knows no slot owner (cluster not formed yet?)")
        return topology

    def _install(self, ranges: _SlotRanges, every: list[tuple[str, int]]) -> None:
        table: list[_Node | None] = [None] * SLOTS
        primaries: dict[str, _Node] = {}
        for start, end, host, port in ranges:
            node = self._node(host, port)
            primaries.setdefault(node.name, node)
            table[start : end + 1] = [node] * (end - start + 1)
        self._known = tuple(self._node(host, port) for host, port in every)
        self._primaries = tuple(primaries.values())
        self._drained = {}
        self._table = table

    def _node(self, host: str, port: int) -> _Node:
        name = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        node = self._nodes.get(name)
        if node is not None:
            return node
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                client = RedisClient(self.address.node(host, port), **self._client_options)
                node = _Node(host, port, client)
                nodes = dict(self._nodes)
                nodes[name] = node
                self._nodes = nodes
            return node


# -- routing -----------------------------------------------------------------------


def _key_text(arg: Arg) -> str | bytes:
    if isinstance(arg, (str, bytes)):
        return arg
    if isinstance(arg, (bytearray, memoryview)):
        return bytes(arg)
    if isinstance(arg, int) and not isinstance(arg, bool):
        return str(arg)
    raise TypeError(
        f"a key must be str, bytes, bytearray, memoryview or int, got {type(arg).__name__}"
    )


def _command_slot(args: Sequence[Arg]) -> int | None:
    """The slot a command must run on, or None if any node will do."""
    if not args:
        raise TypeError("a command needs at least its name")
    name = _key_text(args[0])
    upper = (name.encode() if isinstance(name, str) else name).upper()
    if upper in _KEYLESS or len(args) < 2:
        return None
    if upper in _SCRIPT_COMMANDS:
        try:
            numkeys = int(_key_text(args[2]))
        except (IndexError, ValueError):
            return None  # malformed: let the server say why
        return key_slot(_key_text(args[3])) if numkeys > 0 and len(args) > 3 else None
    if upper == b"SCAN":
        return _scan_slot(args)
    return key_slot(_key_text(args[1]))


def _scan_slot(args: Sequence[Arg]) -> int:
    """The one slot a ``SCAN ... MATCH <pattern>`` can find keys in, from the pattern's hash tag."""
    pattern: str | None = None
    for index in range(2, len(args) - 1):
        option = _key_text(args[index])
        if (option.encode() if isinstance(option, str) else option).upper() == b"MATCH":
            value = _key_text(args[index + 1])
            pattern = value if isinstance(value, str) else value.decode("latin-1")
            break
    problem = "it has no MATCH pattern"
    if pattern is not None:
        start = pattern.find("{")
        end = pattern.find("}", start + 1) if start >= 0 else -1
        tag = pattern[start + 1 : end] if end > start else ""
        if not tag:
            problem = f"its pattern {pattern[:80]!r} has no {{hash tag}}"
        elif _GLOB_CHARACTERS.intersection(tag):
            problem = f"the hash tag of {pattern[:80]!r} is not literal"
        else:
            return key_slot(pattern.encode("latin-1"))
    raise RedisConnectionError(
        f"SCAN on a Redis Cluster needs a MATCH pattern whose {{hash tag}} fixes the slot "
        f"(one node holds all its keys); {problem}"
    )


# -- slot map replies ----------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _fields(flat: Any) -> dict[str, Any]:
    if not isinstance(flat, list) or len(flat) % 2:
        raise RedisConnectionError(f"malformed CLUSTER SHARDS entry: {flat!r:.200}")
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _parse_shards(reply: Any, asked_host: str, tls: bool) -> _Topology:
    """(primary slot ranges, every node) from a CLUSTER SHARDS reply (RESP2)."""
    if not isinstance(reply, list):
        raise RedisConnectionError(f"malformed CLUSTER SHARDS reply: {reply!r:.200}")
    ranges: _SlotRanges = []
    every: list[tuple[str, int]] = []
    for shard in reply:
        fields = _fields(shard)
        slots = fields.get("slots") or []
        primary: tuple[str, int] | None = None
        primary_online = False
        for entry in fields.get("nodes") or []:
            node = _fields(entry)
            host = _endpoint(node, asked_host)
            port_value = node.get("tls-port") if tls and node.get("tls-port") else node.get("port")
            if host is None or not isinstance(port_value, int) or not port_value:
                continue
            every.append((host, port_value))
            if _text(node.get("role")) == "master":
                online = _text(node.get("health")) != "fail"
                if primary is None or (online and not primary_online):
                    primary, primary_online = (host, port_value), online
        if primary is None or not slots:
            continue
        if len(slots) % 2:
            raise RedisConnectionError(f"malformed slot list in CLUSTER SHARDS: {slots!r:.200}")
        for i in range(0, len(slots), 2):
            start, end = int(slots[i]), int(slots[i + 1])
            if not 0 <= start <= end < SLOTS:
                raise RedisConnectionError(
                    f"slot range {start}-{end} out of range in CLUSTER SHARDS"
                )
            ranges.append((start, end, *primary))
    return ranges, every


def _endpoint(node: dict[str, Any], asked_host: str) -> str | None:
    for field in ("endpoint", "ip"):
        value = node.get(field)
        if value is None:
            continue
        text = _text(value)
        if text == "?":
            return None  # the node does not know how it is reached
        if text:
            return text
    return asked_host


def _parse_slots(reply: Any, asked_host: str) -> _Topology:
    """(primary slot ranges, every node) from a CLUSTER SLOTS reply."""
    if not isinstance(reply, list):
        raise RedisConnectionError(f"malformed CLUSTER SLOTS reply: {reply!r:.200}")
    ranges: _SlotRanges = []
    every: list[tuple[str, int]] = []
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3:
            raise RedisConnectionError(f"malformed CLUSTER SLOTS entry: {entry!r:.200}")
        start, end = int(entry[0]), int(entry[1])
        if not 0 <= start <= end < SLOTS:
            raise RedisConnectionError(f"slot range {start}-{end} out of range in CLUSTER SLOTS")
        nodes: list[tuple[str, int]] = []
        for node in entry[2:]:
            if not isinstance(node, list) or len(node) < 2:
                continue
            host = _text(node[0])
            if host == "?":
                continue
            nodes.append((host or asked_host, int(node[1])))
        if nodes:
            ranges.append((start, end, *nodes[0]))
            every.extend(nodes)
    return ranges, every


def _asking_refusal(asking: asyncio.Future[Any], node: _Node) -> RedisClientError | None:
    """The error to raise if ``node`` refused ASKING for lack of permission, else None."""
    if not asking.done() or asking.cancelled():
        return None
    error = asking.exception()
    if isinstance(error, RedisReplyError) and error.message.startswith("NOPERM"):
        return RedisReplyError(
            f"{node.name}: {error.message} (needed to follow ASK during a slot migration; "
            "see the ACL in docs/operations.md)"
        )
    return None


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a future's outcome nobody awaits, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()
