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
  timeout; CLUSTERDOWN also triggers a map reload. A call whose timeout runs
  out while the cluster still answers CLUSTERDOWN raises
  RedisClusterDownError, an error reply: the cluster's state, said as such,
  rather than a timeout that would read as the node failing.
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
from collections.abc import Callable, Sequence
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple

from ._encoding import Arg, encode_command
from .client import ClientOptions, RedisClient
from .cluster_map import (
    DEFAULT_MAX_REDIRECTS,
    REFRESH_FANOUT,
    REFRESH_INTERVAL_S,
    RETRY_CAP_S,
    RETRY_START_S,
    SLOTS,
    ClusterCounters,
    Node,
    SlotMap,
    Topology,
    asking_needs_permission,
    checked_topology,
    command_slot,
    parse_shards,
    parse_slots,
    script_slot,
    shards_refused,
)
from .cluster_recovery import Drained, EnsureMap, Pause, Refresh, Send, recovery
from .connection import RedisConnection, ScriptLike
from .errors import (
    RedisClientError,
    RedisClusterDownError,
    RedisConnectionError,
    RedisReplyError,
)
from .grouping import AloneScript, NodeBatching, group_node_checks
from .url import ClusterAddress, RedisAddress, address_of, parse_cluster_url
from .url_options import FromUrl

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "REFRESH_INTERVAL_S",
    "SLOTS",
    "ClusterClient",
    "ClusterCounters",
]

_ASKING = encode_command("ASKING")
_Node = Node[RedisClient]


class _Request(NamedTuple):
    """One call being recovered: how to send it normally, and after ASK."""

    slot: int | None
    started: float
    args: Sequence[Arg]
    script: ScriptLike | None = None
    keys: Sequence[Arg] = ()

    def send(self, client: RedisClient) -> asyncio.Future[Any]:
        if self.script is not None:
            # Alone, never joined into a batch: a re-send may be a check whose batch
            # was just refused, and would be refused again with it.
            script = AloneScript(self.script.sha, self.script.source)
            return client.evalsha(script, self.keys, self.args)
        return client.execute(*self.args)

    def asking_payload(self) -> bytes:
        # After ASK a script goes as EVAL: the target may not have it cached, and
        # a NOSCRIPT repaired by the connection would be re-sent without ASKING.
        if self.script is not None:
            return encode_command(
                "EVAL", self.script.source, len(self.keys), *self.keys, *self.args
            )
        return encode_command(*self.args)


class ClusterClient(SlotMap[RedisClient], FromUrl):
    """A Redis Cluster client with RedisClient's surface: ``execute``, ``evalsha``,
    ``connect``, ``close``.

    ``execute()`` and ``evalsha()`` return awaitables (coroutines here, where
    RedisClient returns futures): await them, or hand them to gather().
    Nothing connects until the first command or ``connect()``. The options are
    RedisClient's and apply to every node; ``max_redirects`` bounds the MOVED
    and ASK redirections one command may follow.
    """

    parse_url = staticmethod(parse_cluster_url)

    def __init__(
        self,
        address: ClusterAddress | str,
        *,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        batch_decisions: bool = False,
        **options: Unpack[ClientOptions],
    ) -> None:
        self._client_options = options
        self._batch_decisions = bool(batch_decisions)
        self._node_batching = NodeBatching()
        self._init_map(
            address_of(address, ClusterAddress, parse_cluster_url, "a cluster URL str"),
            max_redirects=max_redirects,
            ssl_context=options.get("ssl_context"),
        )
        # The seeds' timeouts are the cluster's.
        self.connect_timeout_s = self._seeds[0].client.connect_timeout_s
        self.command_timeout_s = self._seeds[0].client.command_timeout_s
        self._refresh_task: asyncio.Task[bool] | None = None
        self._refresh_started = -REFRESH_INTERVAL_S
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<ClusterClient {self.address} primaries={len(self._primaries)}>"

    # -- commands ----------------------------------------------------------------

    async def execute(self, *args: Arg) -> Any:
        """Run one command on the node that owns its first key; returns its reply.

        Raises RedisReplyError for an error reply (after following redirections)
        and RedisConnectionError when no node could answer within ``command_timeout_s``.
        """
        slot = command_slot(args)
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
        slot = script_slot(keys)
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

    @property
    def batch_decisions(self) -> bool:
        """Whether each node joins a loop turn's checks into batched calls (off by default;
        set it before the first check: a connection takes it when it opens)."""
        return self._batch_decisions

    @batch_decisions.setter
    def batch_decisions(self, on: bool) -> None:
        self._batch_decisions = bool(on)
        for node in list(self._nodes.values()):
            node.client.batch_decisions = self._batch_decisions

    def _new_client(self, address: RedisAddress) -> RedisClient:
        return _NodeClient(
            address,
            self._node_batching,
            batch_decisions=self._batch_decisions,
            **self._client_options,
        )

    def reload_map_soon(self) -> None:
        """Reload the slot map in the background (at most once per REFRESH_INTERVAL_S).

        For a caller that has stopped sending to a node (the limiter, while
        that node's circuit breaker is open): with no failed command to show
        it, a failover that gave the node's slots to a replica would go
        unseen until the caller tried the old node again.
        """
        self._start_refresh(force=False)

    # -- recovery ----------------------------------------------------------------

    async def _recover(
        self, request: _Request, node: _Node | None, error: RedisClientError | None
    ) -> Any:
        """Follow redirections and retry what is safe until an answer, or the deadline:
        the steps cluster_recovery.py decides, taken here."""
        deadline = request.started + self.command_timeout_s
        pause = RETRY_START_S
        steps = recovery(self, request.slot, request.script is not None, node, error)
        answer: Any = None
        # The CLUSTERDOWN the last pause was for, if it was: a deadline that comes
        # during the attempt after it is the cluster's state, not a timeout.
        cluster_down: RedisClusterDownError | None = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = None
            if type(step) is Send:
                answer = await self._attempt(
                    step.node, step.asking, request, deadline, cluster_down
                )
                cluster_down = None
            elif type(step) is Pause:
                cluster_down = self._cluster_down(step.error)
                pause = await self._pause(pause, deadline, cluster_down or step.error)
            elif type(step) is Refresh:
                if step.wait:
                    await self._refreshed(deadline)
                else:
                    self._start_refresh(force=False)
            elif type(step) is EnsureMap:
                await self._ensure_map(deadline)
            else:
                assert type(step) is Drained
                answer = await self._source_drained(step.slot, step.source, step.target, deadline)

    async def _attempt(
        self,
        node: _Node,
        asking: bool,
        request: _Request,
        deadline: float,
        cluster_down: RedisClusterDownError | None,
    ) -> Any:
        """The reply of one attempt on ``node``, or the RedisClientError it raised.

        At the deadline it raises ``cluster_down`` if given (see _recover), else
        a timeout. Nothing is sent once the deadline has passed: no reply could
        come in time, yet a script sent then would still run and charge.
        """
        if monotonic() >= deadline:
            raise cluster_down or self._timeout_error(self.command_timeout_s)
        asking_reply: asyncio.Future[Any] | None = None
        if asking:
            asking_reply, future = self._send_asking(node, request)
        else:
            future = request.send(node.client)
        try:
            return await self._bounded(future, deadline, cluster_down)
        except RedisClientError as failure:
            if failure is cluster_down:
                raise
            if asking_reply is not None:
                refusal = _asking_refusal(asking_reply, node)
                if refusal is not None:
                    # Else the target's ASK would be followed again and
                    # again: "too many redirections" would hide the cause.
                    raise refusal from None
            return failure

    async def _pause(self, pause: float, deadline: float, error: RedisClientError) -> float:
        """Sleep ``pause`` (or what is left before the deadline); raise ``error`` if none is."""
        remaining = deadline - monotonic()
        if remaining <= 0:
            raise error
        await asyncio.sleep(min(pause, remaining))
        return min(pause * 2, RETRY_CAP_S)

    async def _bounded(
        self,
        future: asyncio.Future[Any],
        deadline: float,
        late: RedisClientError | None = None,
    ) -> Any:
        """The reply, or at the deadline ``late`` (default: a timeout)."""
        if future.done():
            return await future
        remaining = deadline - monotonic()
        if remaining <= 0:
            future.cancel()
            raise late or self._timeout_error(self.command_timeout_s)
        try:
            return await asyncio.wait_for(future, remaining)
        except asyncio.TimeoutError:
            raise late or self._timeout_error(self.command_timeout_s) from None

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
        """Whether ``source`` holds no key of ``slot`` any more (SlotMap._drained_count)."""
        if self._drained_known(slot, source, target):
            return True
        try:
            count = await self._bounded(
                source.client.execute("CLUSTER", "COUNTKEYSINSLOT", slot), deadline
            )
        except RedisClientError as error:
            count = error
        return self._drained_count(slot, source, target, count)

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
            raise self._no_map_error()

    async def _load_map(self) -> bool:
        """Ask nodes for the slot map until one gives a usable one; install it."""
        candidates = self._refresh_candidates()
        errors: list[str] = []
        for start in range(0, len(candidates), REFRESH_FANOUT):
            topology = await self._first_topology(
                candidates[start : start + REFRESH_FANOUT], errors
            )
            if topology is not None:
                self._install(*topology)
                self.counters.refreshes += 1
                return True
        self._refresh_error = "; ".join(errors) or "no node to ask"
        self.counters.refresh_failures += 1
        return False

    async def _first_topology(self, nodes: list[_Node], errors: list[str]) -> Topology | None:
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

    async def _topology(self, node: _Node) -> Topology:
        """The slot map as ``node`` sees it."""
        try:
            reply = await node.client.execute("CLUSTER", "SHARDS")
        except RedisReplyError as error:
            shards_refused(error, node.name)
            # Before Redis 7.0.
            slots_reply = await node.client.execute("CLUSTER", "SLOTS")
            topology = checked_topology(parse_slots(slots_reply, node.host), node.name)
            # Redis before 7.0 knows no script flags: batches stay within one slot.
            self._node_batching.cross_slot = False
            return topology
        topology = checked_topology(parse_shards(reply, node.host, self.address.tls), node.name)
        self._node_batching.cross_slot = True
        return topology


class _NodeClient(RedisClient):
    """A cluster node's client: when batching, its connections join a turn's checks
    across the slots the node serves (grouping.group_node_checks)."""

    def __init__(self, address: RedisAddress, batching: NodeBatching, **options: Any) -> None:
        super().__init__(address, **options)
        self._node_batching = batching

    def _grouping(self, connection: RedisConnection) -> Callable[[], None]:
        return partial(group_node_checks, connection, self._node_batching)


def _asking_refusal(asking: asyncio.Future[Any], node: _Node) -> RedisClientError | None:
    """The error to raise if ``node`` refused ASKING for lack of permission, else None."""
    if not asking.done() or asking.cancelled():
        return None
    error = asking.exception()
    if isinstance(error, RedisReplyError) and error.message.startswith("NOPERM"):
        return asking_needs_permission(error.message, node.name)
    return None


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a future's outcome nobody awaits, so asyncio does not log it."""
    if not future.cancelled():
        future.exception()
