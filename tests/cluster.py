"""A disposable Redis Cluster (3 primaries + 3 replicas by default) for the test suite.

Six redis-server processes on free loopback ports (tests/redis_servers.py),
joined with ``redis-cli --cluster create``; the fixture waits until every node
reports ``cluster_state:ok`` and agrees on the slot map. Helpers run the admin
commands the fault tests need (slot migration, failover) over throwaway
sockets, so the client under test is never used to set the scene.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hiredis
from redis_servers import RedisServer, TlsFiles, free_port

from moderato import _accel
from moderato.redis import ClusterClient
from moderato.redis.blocking import ClusterClient as BlockingClusterClient

SLOTS = 16384


def redis_cli_binary() -> str:
    path = shutil.which("redis-cli")
    if not path:
        raise RuntimeError("redis-cli was not found on PATH (it comes with redis-server)")
    return path


class CommandError(Exception):
    """An error reply to an admin command."""


def call(port: int, *args: str | bytes | int, timeout_s: float = 5.0) -> Any:
    """One command over a throwaway socket; the parsed reply (an error reply raises)."""
    payload = _accel.encode_command(*args)
    reader = hiredis.Reader()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"127.0.0.1:{port} closed the connection")
            reader.feed(data)
            reply = reader.gets()
            if reply is not False:
                break
    if isinstance(reply, hiredis.ReplyError):
        raise CommandError(f"{args[0]!r} on port {port}: {reply}")
    return reply


def script_calls(port: int) -> dict[str, tuple[int, int]]:
    """{command: (calls, failed calls)} since the last CONFIG RESETSTAT, for the
    commands a script call may take: EVALSHA, EVAL and SCRIPT LOAD."""
    return script_calls_in(text(call(port, "INFO", "commandstats")))


def script_calls_in(stats: str) -> dict[str, tuple[int, int]]:
    """script_calls() read from the text of an ``INFO commandstats`` reply."""
    found = dict.fromkeys(("evalsha", "eval", "script|load"), (0, 0))
    for line in stats.splitlines():
        name, _, fields = line.partition(":")
        command = name.removeprefix("cmdstat_")
        if command in found:
            values = dict(field.split("=") for field in fields.split(","))
            found[command] = (int(values["calls"]), int(values.get("failed_calls", 0)))
    return found


def text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


@dataclass
class Shard:
    primary: int  # port
    replicas: list[int]
    slots: list[tuple[int, int]]


class RedisCluster:
    """``primaries`` primaries with ``replicas`` replicas each, on 127.0.0.1."""

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        tls: TlsFiles | None = None,
    ) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        # With tls every node also listens on a TLS port (tls_ports[port]) and the
        # cluster bus and replication use TLS; the plain port stays for the
        # admin helpers here, and url names the TLS ports.
        self.tls = tls
        self.tls_ports: dict[int, int] = {}
        self.servers: list[RedisServer] = []

    # -- lifecycle ---------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> RedisCluster:
        count = self.primaries * (1 + self.replicas)
        try:
            for _ in range(count):
                tls_args: tuple[str, ...] = ()
                tls_port = free_port()
                if self.tls is not None:
                    tls_args = (
                        "--tls-port", str(tls_port),
                        "--tls-cluster", "yes",
                        "--tls-replication", "yes",
                        *self.tls.server_args(),
                    )  # fmt: skip
                server = RedisServer(
                    extra_args=(
                        *tls_args,
                        # The bus port would default to port + 10000, maybe above 65535.
                        "--cluster-port", str(free_port()),
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", str(self.node_timeout_ms),
                        # A replica may take over however stale it is: tests kill
                        # primaries right after writing.
                        "--cluster-replica-validity-factor", "0",
                        # Replicas sync at once (the default waits 5 s for more of them).
                        "--repl-diskless-sync-delay", "0",
                    )
                )  # fmt: skip
                self.servers.append(server.start())
                if self.tls is not None:
                    self.tls_ports[server.port] = tls_port
            subprocess.run(
                [
                    redis_cli_binary(),
                    "--cluster", "create",
                    *(f"127.0.0.1:{server.port}" for server in self.servers),
                    "--cluster-replicas", str(self.replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout_s,
            )  # fmt: skip
            self.wait_ok(timeout_s)
            self.wait_replicas_synced(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    @property
    def url(self) -> str:
        """A cluster URL naming two seed nodes (their TLS ports on a TLS cluster)."""
        if self.tls is not None:
            seeds = ",".join(f"127.0.0.1:{self.tls_ports[s.port]}" for s in self.servers[:2])
            return f"rediss+cluster://{seeds}"
        seeds = ",".join(f"127.0.0.1:{server.port}" for server in self.servers[:2])
        return f"redis+cluster://{seeds}"

    def server(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise KeyError(port)

    def alive(self) -> list[RedisServer]:
        return [s for s in self.servers if s.process is not None and s.process.poll() is None]

    # -- state ---------------------------------------------------------------------

    def info(self, port: int) -> dict[str, str]:
        lines = text(call(port, "CLUSTER", "INFO")).splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line)

    def node_id(self, port: int) -> str:
        return text(call(port, "CLUSTER", "MYID"))

    def shards(self, port: int | None = None) -> list[Shard]:
        """The slot map as ``port`` (default: the first live node) sees it, from CLUSTER NODES.

        (CLUSTER SLOTS would leave out replicas that have replicated nothing yet.)
        Primaries flagged as failed are left out.
        """
        if port is None:
            port = self.alive()[0].port
        primaries: dict[str, Shard] = {}
        replicas: list[tuple[str, int]] = []
        for line in text(call(port, "CLUSTER", "NODES")).splitlines():
            fields = line.split()
            node_id, address, flags, primary_id = fields[0], fields[1], fields[2], fields[3]
            node_port = int(address.split("@")[0].rpartition(":")[2])
            if "fail" in flags.split(","):
                continue
            if "master" in flags:
                ranges = []
                for item in fields[8:]:
                    if item.startswith("["):
                        continue  # a migration marker
                    start, _, end = item.partition("-")
                    ranges.append((int(start), int(end or start)))
                primaries[node_id] = Shard(node_port, [], ranges)
            else:
                replicas.append((primary_id, node_port))
        for primary_id, replica_port in replicas:
            if primary_id in primaries:
                primaries[primary_id].replicas.append(replica_port)
        return sorted(
            (shard for shard in primaries.values() if shard.slots), key=lambda s: s.slots[0]
        )

    def owner(self, slot: int, port: int | None = None) -> int:
        for shard in self.shards(port):
            if any(start <= slot <= end for start, end in shard.slots):
                return shard.primary
        raise LookupError(f"slot {slot} is not served")

    def replica_of(self, primary: int) -> int:
        for shard in self.shards():
            if shard.primary == primary:
                return shard.replicas[0]
        raise LookupError(primary)

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and they all agree on the slot map."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                ports = [s.port for s in self.alive()]
                states = {p: self.info(p).get("cluster_state") for p in ports}
                if all(state == "ok" for state in states.values()):
                    maps = {repr(self._primary_map(p)) for p in ports}
                    if len(maps) == 1:
                        return
                    last = f"{len(maps)} different slot maps"
                else:
                    last = f"cluster_state {states}"
            except (OSError, CommandError) as error:
                last = str(error)
            time.sleep(0.05)
        raise TimeoutError(f"the cluster did not settle within {timeout_s} s: {last}")

    def wait_replicas_synced(self, timeout_s: float = 30.0) -> None:
        """Until every live replica has completed its sync with its primary."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pending = []
            for server in self.alive():
                info = text(call(server.port, "INFO", "replication"))
                if "role:slave" in info and "master_link_status:up" not in info:
                    pending.append(server.port)
            if not pending:
                return
            time.sleep(0.05)
        raise TimeoutError(f"replicas {pending} did not sync within {timeout_s} s")

    def _primary_map(self, port: int) -> list[tuple[int, int, int]]:
        return sorted((int(e[0]), int(e[1]), int(e[2][1])) for e in call(port, "CLUSTER", "SLOTS"))

    def flushall(self) -> None:
        for shard in self.shards():
            call(shard.primary, "FLUSHALL")

    def dbsize(self) -> dict[int, int]:
        return {shard.primary: int(call(shard.primary, "DBSIZE")) for shard in self.shards()}

    # -- operations ----------------------------------------------------------------

    def begin_migration(self, slot: int, source: int, target: int) -> None:
        """SETSLOT IMPORTING on the target, then MIGRATING on the source (the documented order)."""
        call(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))

    def move_keys(self, slot: int, source: int, target: int, batch: int = 100) -> int:
        """MIGRATE every key of ``slot`` from source to target; returns how many moved."""
        moved = 0
        while True:
            keys = call(source, "CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                return moved
            call(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)

    def end_migration(self, slot: int, source: int, target: int) -> None:
        """SETSLOT NODE on the target, then the source, then every other primary."""
        target_id = self.node_id(target)
        call(target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        call(source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for shard in self.shards(target):
            if shard.primary not in (source, target):
                call(shard.primary, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def migration_ends(self, slot: int) -> tuple[int, int]:
        """(the primary that owns ``slot``, another primary): where a test moves it from and to."""
        source = self.owner(slot)
        return source, next(shard.primary for shard in self.shards() if shard.primary != source)

    def migrate_under_traffic(
        self, slot: int, source: int, target: int, phase: Callable[[str], None] | None = None
    ) -> int:
        """Move ``slot`` from source to target while the caller's traffic runs, in the
        steps the migration tests time; returns how many keys moved.

        0.25 s of traffic first; ``phase("migrating")``, the slot marked migrating, then
        0.15 s of ASK answered while the source still holds the keys (scripts wait);
        the keys moved, ``phase("ask")``, 0.3 s of ASK followed to the drained source's
        target; the slot given to the target, ``phase("moved")``.
        """
        phase = phase or (lambda _: None)
        time.sleep(0.25)
        phase("migrating")
        self.begin_migration(slot, source, target)
        time.sleep(0.15)
        moved_keys = self.move_keys(slot, source, target)
        phase("ask")
        time.sleep(0.3)
        self.end_migration(slot, source, target)
        phase("moved")
        return moved_keys

    def kill(self, port: int) -> None:
        self.server(port).stop()

    def failover(self, replica: int, timeout_s: float = 15.0) -> tuple[float, bool]:
        """Wait for ``replica`` to be promoted; force it (TAKEOVER) after 3 node timeouts.

        Returns (seconds waited, whether TAKEOVER was needed). Automatic failover
        needs the failure detected (node timeout), agreed on and an election;
        TAKEOVER needs none of it.
        """
        started = time.monotonic()
        forced = False
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            try:
                if call(replica, "ROLE")[0] == b"master":
                    return time.monotonic() - started, forced
                if not forced and time.monotonic() - started > 3 * self.node_timeout_ms / 1000:
                    call(replica, "CLUSTER", "FAILOVER", "TAKEOVER")
                    forced = True
            except (OSError, CommandError):
                pass
            time.sleep(0.01)
        raise TimeoutError(f"replica on port {replica} was not promoted within {timeout_s} s")


def slot_of(key: str | bytes) -> int:
    return int(_accel.key_slot(key))


def identity_slot(identity: str, tenant: str = "", scope: str = "global") -> int:
    """The slot of every key moderato builds for this identity (one hash tag for all)."""
    return slot_of(_accel.build_keys("any", "fw", tenant, scope, identity, (60,))[0])


def identities_per_shard(
    shards: list[Shard], per_shard: int, stem: str = "user"
) -> dict[int, list[str]]:
    """``per_shard`` identities whose keys live on each primary: {primary port: identities}."""
    owner = {}
    for shard in shards:
        for start, end in shard.slots:
            owner[(start, end)] = shard.primary
    found: dict[int, list[str]] = {shard.primary: [] for shard in shards}
    index = 0
    while any(len(names) < per_shard for names in found.values()):
        identity = f"{stem}-{index}"
        index += 1
        slot = identity_slot(identity)
        port = next(p for (start, end), p in owner.items() if start <= slot <= end)
        if len(found[port]) < per_shard:
            found[port].append(identity)
    return found


def report(line: str) -> None:
    """Print a fault test's one-line summary; also append it to $MODERATO_FAULT_REPORT if set."""
    print(f"\n[fault] {line}")
    path = os.environ.get("MODERATO_FAULT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def primary_name(port: int) -> str:
    """A node's name as the clients give it (``host:port``)."""
    return f"127.0.0.1:{port}"


def cluster_client(limiter: Any) -> ClusterClient | BlockingClusterClient:
    """The cluster client under a limiter on a cluster URL (asyncio or blocking)."""
    client = limiter.backend.client
    assert isinstance(client, (ClusterClient, BlockingClusterClient))
    return client
