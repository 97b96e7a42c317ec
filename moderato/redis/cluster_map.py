"""What both Redis Cluster clients (asyncio and blocking) share: routing, the slot map, its nodes.

Pure logic only, no I/O: which slot a command runs on (``command_slot``),
how ``CLUSTER SHARDS`` / ``CLUSTER SLOTS`` replies read, what a ``MOVED`` or
``ASK`` reply names, and ``SlotMap``, the table of 16384 slots over the
nodes a client made (each with a client of its own kind). cluster.py and
blocking/cluster.py do the I/O and follow the same rules with it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from .._accel import key_slot
from ._encoding import Arg
from .errors import (
    RedisClientError,
    RedisClusterDownError,
    RedisConnectionError,
    RedisReplyError,
)
from .url import ClusterAddress, RedisAddress

__all__ = [
    "DEFAULT_MAX_REDIRECTS",
    "REFRESH_INTERVAL_S",
    "RETRY_CAP_S",
    "RETRY_START_S",
    "SLOTS",
    "ClusterCounters",
    "Node",
    "SlotMap",
    "command_slot",
    "grown",
    "key_text",
    "parse_shards",
    "parse_slots",
    "too_many_redirects",
]

SLOTS = 16384
DEFAULT_MAX_REDIRECTS = 5
# At most one slot-map reload is started per this many seconds (per client).
REFRESH_INTERVAL_S = 0.1
# Nodes asked for the slot map at once during a reload.
REFRESH_FANOUT = 3
# The pauses between retries of TRYAGAIN, CLUSTERDOWN, LOADING and lost nodes.
RETRY_START_S = 0.005
RETRY_CAP_S = 0.1
# Replies that mean "not now, here": retried after a pause within the deadline.
RETRIED_REPLIES = ("TRYAGAIN", "CLUSTERDOWN", "LOADING")
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
    """What a cluster client has seen since it was made (for diagnostics, tests and logs)."""

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
    batch_splits: int = 0
    """Checks sent again alone after their batched call was refused whole before it ran
    (a redirection or a migrating slot; the asyncio client with ``batch_decisions``)."""
    refreshes: int = 0
    """Slot maps loaded."""
    refresh_failures: int = 0
    """Reloads for which no node gave a usable slot map."""

    def retried(self, kind: str) -> None:
        """Count one of RETRIED_REPLIES."""
        if kind == "TRYAGAIN":
            self.tryagain += 1
        elif kind == "LOADING":
            self.loading += 1
        else:
            self.clusterdown += 1


C = TypeVar("C")
"""A node's client: the asyncio RedisClient or the blocking one."""


class Node(Generic[C]):
    """One cluster node: its name (``host:port``) and its own client."""

    __slots__ = ("client", "host", "name", "port")

    def __init__(self, host: str, port: int, client: C) -> None:
        self.host = host
        self.port = port
        self.name = node_name(host, port)
        self.client = client

    def __repr__(self) -> str:
        return f"<node {self.name}>"


def node_name(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


K = TypeVar("K")
V = TypeVar("V")


def grown(table: dict[K, V], key: K, make: Callable[[], V]) -> dict[K, V]:
    """``table`` if it holds ``key``, else a copy with ``make()``'s value added.

    For a map read without a lock and grown under one (the nodes here, the
    per-node circuit breakers): the caller holds its lock, reads the map
    again (another thread may have added the key meanwhile) and stores what
    this returns; a reader keeps the map it has, never edited.
    """
    return table if key in table else {**table, key: make()}


# (start, end, host, port) per slot range of a primary; (host, port) of every node.
SlotRanges = list[tuple[int, int, str, int]]
Topology = tuple[SlotRanges, list[tuple[str, int]]]


class SlotMap(Generic[C]):
    """The nodes a cluster client made and the slot table over them.

    The table and the node mapping are replaced, never edited, except one
    slot's entry after MOVED (one item: readers see the old node or the new
    one), so the command path reads them without a lock.
    """

    address: ClusterAddress
    command_timeout_s: float
    """The limit of one call, redirections and retries included (the node clients')."""

    def _init_map(
        self, address: ClusterAddress, *, max_redirects: int, ssl_context: object
    ) -> None:
        """Check the cluster's own options and set up an empty map (call first)."""
        if ssl_context is not None and not address.tls:
            raise ValueError(
                f"ssl_context was given but {address} is not a TLS address; use rediss+cluster://"
            )
        if isinstance(max_redirects, bool) or not isinstance(max_redirects, int):
            raise TypeError(f"max_redirects must be an int, got {type(max_redirects).__name__}")
        if not 1 <= max_redirects <= 100:
            raise ValueError(f"max_redirects must be 1..100, got {max_redirects}")
        self.max_redirects = max_redirects
        self.counters = ClusterCounters()
        self.address = address
        self._nodes_lock = threading.Lock()
        # Copy on write under _nodes_lock: readers never lock.
        self._nodes: dict[str, Node[C]] = {}
        self._table: list[Node[C] | None] | None = None
        self._primaries: tuple[Node[C], ...] = ()
        self._known: tuple[Node[C], ...] = ()
        self._rotation = 0
        # slot -> (source, target) whose source was seen holding no key of the slot.
        self._drained: dict[int, tuple[str, str]] = {}
        self._refresh_error = "the slot map was never loaded"
        # The seeds' clients are built now: they check the options.
        self._seeds = tuple(self._node(host, port) for host, port in address.seeds)

    def _new_client(self, address: RedisAddress) -> C:
        """The client of a node newly named (by the URL, a slot map or a redirection)."""
        raise NotImplementedError

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
        node = None if table is None else table[key_slot(key_text(key))]
        return None if node is None else node.name

    def node_client(self, name: str) -> C:
        """The client of one node, by name (``host:port``)."""
        return self._nodes[name].client

    # -- the map -------------------------------------------------------------------

    def _owner(self, slot: int | None) -> Node[C] | None:
        """The node a command of ``slot`` goes to (None: any primary), if the map knows one."""
        table = self._table
        if table is None:
            return None
        if slot is None:
            return self._any_primary()
        return table[slot]

    def _any_primary(self) -> Node[C] | None:
        primaries = self._primaries
        if not primaries:
            return None
        self._rotation = index = (self._rotation + 1) % len(primaries)
        return primaries[index]

    def _refresh_candidates(self) -> list[Node[C]]:
        """Whom to ask for the slot map, in order: the primaries (a different one
        first each time), then every other node known, then the URL's seeds."""
        candidates: list[Node[C]] = []
        seen: set[str] = set()
        primaries = list(self._primaries)
        if primaries:
            shift = self._rotation % len(primaries)
            primaries = primaries[shift:] + primaries[:shift]
        for node in (*primaries, *self._known, *self._seeds):
            if node.name not in seen:
                seen.add(node.name)
                candidates.append(node)
        return candidates

    def _install(self, ranges: SlotRanges, every: list[tuple[str, int]]) -> None:
        table: list[Node[C] | None] = [None] * SLOTS
        primaries: dict[str, Node[C]] = {}
        for start, end, host, port in ranges:
            node = self._node(host, port)
            primaries.setdefault(node.name, node)
            table[start : end + 1] = [node] * (end - start + 1)
        self._known = tuple(self._node(host, port) for host, port in every)
        self._primaries = tuple(primaries.values())
        self._drained = {}
        self._table = table

    def _moved_to(self, slot: int, target: Node[C]) -> None:
        """``MOVED``: the slot's new owner, in the table at once."""
        table = self._table
        if table is not None:
            table[slot] = target  # one item: readers see the old node or the new one
        self._drained.pop(slot, None)

    def _drained_known(self, slot: int, source: Node[C], target: Node[C]) -> bool:
        """Whether ``source`` was seen holding no key of ``slot`` (migrating to ``target``)."""
        return self._drained.get(slot) == (source.name, target.name)

    def _drained_count(
        self, slot: int, source: Node[C], target: Node[C], count: int | RedisClientError
    ) -> bool:
        """What ``CLUSTER COUNTKEYSINSLOT slot`` on ``source`` answered (or raised) says:
        True, remembered, when no key of the slot is left there (so ASK is safe for
        scripts); a NOPERM refusal is raised, as waiting for the slot could never end."""
        if isinstance(count, RedisReplyError) and count.message.startswith("NOPERM"):
            raise count_needs_permission(count.message, source.name, slot)
        if count == 0:
            self._drained[slot] = (source.name, target.name)
            return True
        return False

    def _redirect_target(self, message: str, node: Node[C] | None) -> tuple[int, Node[C]]:
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

    def _node(self, host: str, port: int) -> Node[C]:
        name = node_name(host, port)
        node = self._nodes.get(name)
        if node is not None:
            return node
        with self._nodes_lock:
            self._nodes = grown(
                self._nodes,
                name,
                lambda: Node(host, port, self._new_client(self.address.node(host, port))),
            )
            return self._nodes[name]

    def _cluster_down(self, error: RedisClientError) -> RedisClusterDownError | None:
        """``error`` as the call's error if the cluster still says it at the deadline."""
        if isinstance(error, RedisReplyError) and error.message.startswith("CLUSTERDOWN"):
            return RedisClusterDownError(
                f"{error.message} (Redis Cluster {self.address}: still the answer after "
                f"retrying for {self.command_timeout_s:g} s)"
            )
        return None

    def _no_map_error(self) -> RedisConnectionError:
        return RedisConnectionError(
            f"cannot load the Redis Cluster slot map of {self.address}: {self._refresh_error}"
        )

    def _no_owner_error(self, slot: int | None) -> RedisConnectionError:
        return RedisConnectionError(f"Redis Cluster {self.address}: no node serves slot {slot}")

    def _timeout_error(self, command_timeout_s: float) -> RedisConnectionError:
        return RedisConnectionError(
            f"Redis Cluster {self.address}: no answer within {command_timeout_s:g} s "
            "(command timeout, retries included)"
        )


def too_many_redirects(redirects: int, max_redirects: int, message: str) -> None:
    """Raise once a command followed more than ``max_redirects`` MOVED or ASK replies."""
    if redirects > max_redirects:
        raise RedisConnectionError(
            f"Redis Cluster: more than {max_redirects} redirections "
            f"for one command (last: {message})"
        )


def ask_waiting_error(
    slot: int, source: str, target: str, command_timeout_s: float
) -> RedisConnectionError:
    """The error of a script whose ASK could not be followed before its deadline."""
    return RedisConnectionError(
        f"Redis Cluster: slot {slot} is migrating from {source} to "
        f"{target} and {source} still holds keys of it; "
        f"no answer within {command_timeout_s:g} s"
    )


def count_needs_permission(message: str, node: str, slot: int) -> RedisReplyError:
    """CLUSTER COUNTKEYSINSLOT refused by the ACL: waiting for the slot could never end
    (an error reply still: the node answered, it is not down)."""
    return RedisReplyError(
        f"{node}: {message} (needed to follow ASK for a script "
        f"while slot {slot} migrates; see the ACL in docs/operations.md)"
    )


def asking_needs_permission(message: str, node: str) -> RedisReplyError:
    """ASKING refused by the ACL: following the target's ASK again would loop (an error
    reply still: the node answered)."""
    return RedisReplyError(
        f"{node}: {message} (needed to follow ASK during a slot migration; "
        "see the ACL in docs/operations.md)"
    )


def shards_refused(error: RedisReplyError, node: str) -> None:
    """What a refused ``CLUSTER SHARDS`` means: not a cluster node (RedisConnectionError),
    a server before 7.0 (return: ask ``CLUSTER SLOTS``), else the reply itself (raised)."""
    text = error.message.lower()
    if "cluster support disabled" in text:
        raise RedisConnectionError(f"{node} is not a Redis Cluster node") from None
    if "unknown" not in text:
        raise error


def checked_topology(topology: Topology, node: str) -> Topology:
    if not topology[0]:
        raise RedisConnectionError(f"{node} knows no slot owner (cluster not formed yet?)")
    return topology


# -- routing -----------------------------------------------------------------------


def key_text(arg: Arg) -> str | bytes:
    if isinstance(arg, (str, bytes)):
        return arg
    if isinstance(arg, (bytearray, memoryview)):
        return bytes(arg)
    if isinstance(arg, int) and not isinstance(arg, bool):
        return str(arg)
    raise TypeError(
        f"a key must be str, bytes, bytearray, memoryview or int, got {type(arg).__name__}"
    )


def command_slot(args: Sequence[Arg]) -> int | None:
    """The slot a command must run on, or None if any node will do."""
    if not args:
        raise TypeError("a command needs at least its name")
    name = key_text(args[0])
    upper = (name.encode() if isinstance(name, str) else name).upper()
    if upper in _KEYLESS or len(args) < 2:
        return None
    if upper in _SCRIPT_COMMANDS:
        try:
            numkeys = int(key_text(args[2]))
        except (IndexError, ValueError):
            return None  # malformed: let the server say why
        return key_slot(key_text(args[3])) if numkeys > 0 and len(args) > 3 else None
    if upper == b"SCAN":
        return _scan_slot(args)
    return key_slot(key_text(args[1]))


def script_slot(keys: Sequence[Arg]) -> int | None:
    """The slot of a script call on ``keys`` (None: no key, any node)."""
    return key_slot(key_text(keys[0])) if keys else None


def _scan_slot(args: Sequence[Arg]) -> int:
    """The one slot a ``SCAN ... MATCH <pattern>`` can find keys in, from the pattern's hash tag."""
    pattern: str | None = None
    for index in range(2, len(args) - 1):
        option = key_text(args[index])
        if (option.encode() if isinstance(option, str) else option).upper() == b"MATCH":
            value = key_text(args[index + 1])
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


def parse_shards(reply: Any, asked_host: str, tls: bool) -> Topology:
    """(primary slot ranges, every node) from a CLUSTER SHARDS reply (RESP2)."""
    if not isinstance(reply, list):
        raise RedisConnectionError(f"malformed CLUSTER SHARDS reply: {reply!r:.200}")
    ranges: SlotRanges = []
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


def parse_slots(reply: Any, asked_host: str) -> Topology:
    """(primary slot ranges, every node) from a CLUSTER SLOTS reply."""
    if not isinstance(reply, list):
        raise RedisConnectionError(f"malformed CLUSTER SLOTS reply: {reply!r:.200}")
    ranges: SlotRanges = []
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
