"""ClusterClient (blocking): the blocking RedisClient's surface over a Redis Cluster.

The asyncio ClusterClient's rules (moderato/redis/cluster.py tells them in
full), followed with blocking calls; the routing, the slot map and its
parsing are the same code (cluster_map.py). Every node has its own bounded
pool (the blocking RedisClient, ``max_connections`` per node).

- A command goes to the owner of its first key's slot; keyless ones to any
  primary; SCAN to the owner of its MATCH pattern's hash tag.
- ``MOVED``: the slot's entry is updated at once, the whole map reloaded if
  no reload ran in the last REFRESH_INTERVAL_S, and the command sent to the
  new owner.
- ``ASK``: ``ASKING`` and the command in one write on one connection of the
  target; a script only once the source holds no key of the slot
  (``CLUSTER COUNTKEYSINSLOT`` = 0), since the scripts' derived keys are
  invisible to Redis; until then it waits, like TRYAGAIN.
- ``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``: retried after a pause (5 ms
  doubling to 100 ms); a call still answered CLUSTERDOWN at its deadline
  raises RedisClusterDownError (an error reply: the cluster's state).
- A lost or refused connection: the map is reloaded and the command retried
  on the slot's owner; a script only if it was never written
  (CommandNotSentError), as one whose reply was lost may have charged.

Time: no retry starts after ``command_timeout_s`` from the call, and each
attempt has the node client's own limits, so a call that has to recover
takes at most about twice ``command_timeout_s`` (one more attempt in flight
at the deadline), where the asyncio client, which can abandon a pending
reply, stops at the deadline itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

from .._encoding import Arg
from ..cluster_map import (
    DEFAULT_MAX_REDIRECTS,
    REFRESH_INTERVAL_S,
    RETRY_CAP_S,
    RETRY_START_S,
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
from ..cluster_recovery import Drained, EnsureMap, Pause, Refresh, Send, recovery
from ..connection import ScriptLike
from ..errors import RedisClientError, RedisClusterDownError, RedisReplyError
from ..forks import abandon_in_children
from ..url import ClusterAddress, RedisAddress, address_of, parse_cluster_url
from ..url_options import FromUrl
from .client import RedisClient

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from .client import BlockingOptions

__all__ = ["ClusterClient"]

_Node = Node[RedisClient]


class _Request(NamedTuple):
    """One call being recovered: how to send it normally, and after ASK."""

    slot: Optional[int]
    started: float
    args: Sequence[Arg]
    script: Optional[ScriptLike] = None
    keys: Sequence[Arg] = ()

    def send(self, client: RedisClient) -> Any:
        if self.script is not None:
            return client.evalsha(self.script, self.keys, self.args)
        return client.execute(*self.args)

    def after_asking(self) -> tuple[Arg, ...]:
        # After ASK a script goes as EVAL: the target may not have it cached.
        if self.script is not None:
            return ("EVAL", self.script.source, len(self.keys), *self.keys, *self.args)
        return tuple(self.args)


class ClusterClient(SlotMap[RedisClient], FromUrl):
    """A blocking Redis Cluster client: ``execute``, ``evalsha``, ``connect``, ``close``.

    Safe across threads. Nothing connects until the first command or
    ``connect()``. The options are the blocking RedisClient's and apply to
    every node; ``max_redirects`` bounds the MOVED and ASK redirections one
    command may follow.
    """

    parse_url = staticmethod(parse_cluster_url)
    batches_decisions = False  # a call a check, never batched

    def __init__(
        self,
        address: Union[ClusterAddress, str],
        *,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        **options: Unpack[BlockingOptions],
    ) -> None:
        self._client_options = options
        self._init_map(
            address_of(address, ClusterAddress, parse_cluster_url, "a cluster URL str"),
            max_redirects=max_redirects,
            ssl_context=options.get("ssl_context"),
        )
        self.connect_timeout_s = self._seeds[0].client.connect_timeout_s
        self.command_timeout_s = self._seeds[0].client.command_timeout_s
        # One reload at a time; the others wait for it (no map yet) or skip it.
        self._refresh_lock = threading.Lock()
        self._refresh_started = -REFRESH_INTERVAL_S
        abandon_in_children(self)

    def __repr__(self) -> str:
        return f"<blocking ClusterClient {self.address} primaries={len(self._primaries)}>"

    def _new_client(self, address: RedisAddress) -> RedisClient:
        return RedisClient(address, **self._client_options)

    def reload_map_soon(self) -> None:
        """Reload the slot map on a thread of its own (at most one at a time, one per
        REFRESH_INTERVAL_S), for a caller that stopped sending to a node (the limiter,
        while that node's circuit breaker is open) and must not wait for the reload."""
        if monotonic() - self._refresh_started < REFRESH_INTERVAL_S or self._refresh_lock.locked():
            return
        deadline = monotonic() + self.command_timeout_s
        threading.Thread(
            target=self._load_map, args=(deadline,), kwargs={"force": False}, daemon=True
        ).start()

    # -- commands ----------------------------------------------------------------

    def execute(self, *args: Arg) -> Any:
        """Run one command on the node that owns its first key; returns its reply.

        RedisReplyError for an error reply (after following redirections),
        RedisConnectionError when no node could answer in time.
        """
        slot = command_slot(args)
        table = self._table
        node = None if table is None else (self._any_primary() if slot is None else table[slot])
        started = monotonic()
        if node is not None:
            try:
                return node.client.execute(*args)
            except RedisClientError as error:
                return self._recover(_Request(slot, started, args), node, error)
        return self._recover(_Request(slot, started, args), None, None)

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """Run a Lua script on the node owning ``keys[0]`` (every key in one slot)."""
        table = self._table
        slot = script_slot(keys)
        node = None if table is None else (self._any_primary() if slot is None else table[slot])
        started = monotonic()
        if node is not None:
            try:
                return node.client.evalsha(script, keys, args)
            except RedisClientError as error:
                request = _Request(slot, started, args, script, keys)
                return self._recover(request, node, error)
        return self._recover(_Request(slot, started, args, script, keys), None, None)

    def execute_on_primaries(self, *args: Arg) -> dict[str, Any]:
        """Run one command on every primary (SCRIPT FLUSH, FLUSHALL...); replies by node name."""
        self._ensure_map(monotonic() + self.command_timeout_s)
        return {node.name: node.client.execute(*args) for node in self._primaries}

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> None:
        """Load the slot map and check every primary answers; RedisConnectionError if not."""
        if not self._load_map(monotonic() + self.command_timeout_s, force=True):
            raise self._no_map_error()
        for node in self._primaries:
            node.client.connect()

    def close(self) -> None:
        """Close every node's connections. The client stays usable."""
        for node in list(self._nodes.values()):
            node.client.close()

    def after_fork_in_child(self) -> None:
        """In a fork()ed child: a lock another thread held at the fork is replaced
        (the nodes' pools let go of their own connections)."""
        self._refresh_lock = threading.Lock()

    # -- recovery ----------------------------------------------------------------

    def _recover(
        self, request: _Request, node: Optional[_Node], error: Optional[RedisClientError]
    ) -> Any:
        """Follow redirections and retry what is safe until an answer, or the deadline:
        the steps cluster_recovery.py decides, taken here."""
        deadline = request.started + self.command_timeout_s
        pause = RETRY_START_S
        steps = recovery(self, request.slot, request.script is not None, node, error)
        answer: Any = None
        # The CLUSTERDOWN the last pause was for, if it was: a deadline that comes
        # before the attempt after it is the cluster's state, not a timeout.
        cluster_down: Optional[RedisClusterDownError] = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = None
            if type(step) is Send:
                answer = self._attempt(step.node, step.asking, request, deadline, cluster_down)
                cluster_down = None
            elif type(step) is Pause:
                cluster_down = self._cluster_down(step.error)
                pause = _pause(pause, deadline, cluster_down or step.error)
            elif type(step) is Refresh:
                self._load_map(deadline, force=False)
            elif type(step) is EnsureMap:
                self._ensure_map(deadline)
            else:
                assert type(step) is Drained
                answer = self._source_drained(step.slot, step.source, step.target)

    def _attempt(
        self,
        node: _Node,
        asking: bool,
        request: _Request,
        deadline: float,
        cluster_down: Optional[RedisClusterDownError],
    ) -> Any:
        """The reply of one attempt on ``node``, or the RedisClientError it raised.

        Nothing is sent once the deadline has passed (a script sent then would
        still run and charge): ``cluster_down`` is raised if given, else a timeout.
        """
        if monotonic() >= deadline:
            raise cluster_down or self._timeout_error(self.command_timeout_s)
        try:
            if asking:
                return self._send_asking(node, request)
            return request.send(node.client)
        except RedisClientError as failure:
            return failure

    def _send_asking(self, node: _Node, request: _Request) -> Any:
        """``ASKING`` and the command on one connection of ``node``, in one write."""
        asking, reply = node.client.execute_many(
            [("ASKING",), request.after_asking()], raise_on_error=False
        )
        if isinstance(asking, RedisReplyError) and asking.message.startswith("NOPERM"):
            # Else the target's ASK would be followed again and again:
            # "too many redirections" would hide the cause.
            raise asking_needs_permission(asking.message, node.name)
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    def _source_drained(self, slot: int, source: _Node, target: _Node) -> bool:
        """Whether ``source`` holds no key of ``slot`` any more (SlotMap._drained_count)."""
        if self._drained_known(slot, source, target):
            return True
        try:
            count = source.client.execute("CLUSTER", "COUNTKEYSINSLOT", slot)
        except RedisClientError as error:
            count = error
        return self._drained_count(slot, source, target, count)

    # -- the slot map --------------------------------------------------------------

    def _ensure_map(self, deadline: float) -> None:
        """Load the map if there is none yet (RedisConnectionError if not in time)."""
        if self._table is None and not self._load_map(deadline, force=True):
            raise self._no_map_error()

    def _load_map(self, deadline: float, *, force: bool) -> bool:
        """Reload the slot map, unless another thread is at it (forced: wait for that
        one) or one started less than REFRESH_INTERVAL_S ago; whether a map is loaded."""
        lock = self._refresh_lock
        if force:
            loads = self.counters.refreshes
            if not lock.acquire(timeout=max(deadline - monotonic(), 0.001)):
                return self._table is not None
            if self._table is not None and self.counters.refreshes != loads:
                lock.release()
                return True  # loaded by the thread this one waited for
        elif not lock.acquire(blocking=False):
            return self._table is not None
        try:
            now = monotonic()
            if not force and now - self._refresh_started < REFRESH_INTERVAL_S:
                return self._table is not None
            self._refresh_started = now
            errors: list[str] = []
            for node in self._refresh_candidates():
                try:
                    topology = self._topology(node)
                except RedisClientError as error:
                    errors.append(f"{node.name}: {error}")
                    if monotonic() >= deadline:
                        break
                    continue
                self._install(*topology)
                self._refresh_started = monotonic()
                self.counters.refreshes += 1
                return True
            self._refresh_error = "; ".join(errors) or "no node to ask"
            self.counters.refresh_failures += 1
            return self._table is not None
        finally:
            lock.release()

    def _topology(self, node: _Node) -> Topology:
        """The slot map as ``node`` sees it."""
        try:
            reply = node.client.execute("CLUSTER", "SHARDS")
        except RedisReplyError as error:
            shards_refused(error, node.name)
            # Before Redis 7.0.
            slots_reply = node.client.execute("CLUSTER", "SLOTS")
            return checked_topology(parse_slots(slots_reply, node.host), node.name)
        return checked_topology(parse_shards(reply, node.host, self.address.tls), node.name)


def _pause(pause: float, deadline: float, error: RedisClientError) -> float:
    """Sleep ``pause`` (or what is left before the deadline); raise ``error`` if none is."""
    remaining = deadline - monotonic()
    if remaining <= 0:
        raise error
    time.sleep(min(pause, remaining))
    return min(pause * 2, RETRY_CAP_S)
