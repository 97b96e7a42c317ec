"""The blocking Sentinel client and moderato.sync.RateLimiter on real processes: one primary,
one replica, three sentinels.

The asyncio client's rules (tests/cluster/test_sentinel.py), followed from threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Callable

import pytest
from fork_helpers import in_child
from redis_servers import SentinelDeployment, free_port

from moderato import BackendError
from moderato.redis.blocking import SentinelClient
from moderato.redis.blocking.client import IDLE_CHECK_AFTER_S
from moderato.redis.errors import RedisClientError, RedisConnectionError
from moderato.redis.sentinel_rules import RETRY_INTERVAL_S
from moderato.sync import RateLimiter


def _watched(service: str) -> Iterator[SentinelDeployment]:
    servers = SentinelDeployment(service=service)
    try:
        servers.wait_until_watched()
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def deployment() -> Iterator[SentinelDeployment]:
    """A deployment the tests share and leave as they found it (no kills)."""
    yield from _watched("shared")


@pytest.fixture
def own_deployment() -> Iterator[SentinelDeployment]:
    yield from _watched("own")


def test_commands_go_to_the_primary_and_a_dead_sentinel_is_skipped(
    deployment: SentinelDeployment,
) -> None:
    dead = free_port()
    hosts = ",".join(f"127.0.0.1:{port}" for port in (dead, deployment.sentinels[2].port))
    client = SentinelClient(f"redis+sentinel://{hosts}/shared/3", command_timeout_s=0.3)
    try:
        assert client.execute("SET", "db-three", "yes") == b"OK"
        assert b"db=3" in client.execute("CLIENT", "INFO")
        assert client.primary_address == ("127.0.0.1", deployment.primary.port)
    finally:
        client.close()


def test_an_unknown_service_and_no_sentinel_are_connection_errors(
    deployment: SentinelDeployment,
) -> None:
    port = deployment.sentinels[0].port
    unknown = SentinelClient(f"redis+sentinel://127.0.0.1:{port}/nosuch")
    with pytest.raises(RedisConnectionError, match=r"does not monitor 'nosuch'"):
        unknown.execute("PING")
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    nobody = SentinelClient(f"redis+sentinel://{hosts}/svc", connect_timeout_s=0.2)
    with pytest.raises(RedisConnectionError, match=r"no sentinel of redis\+sentinel://.* named a"):
        nobody.execute("PING")
    # Asked again only after RETRY_INTERVAL_S: meanwhile the last error, at once.
    with pytest.raises(RedisConnectionError, match="next sentinel query in"):
        nobody.execute("PING")


def test_a_demoted_primary_is_never_written_to(own_deployment: SentinelDeployment) -> None:
    """The named server turns replica under a live connection: READONLY, then ROLE refuses it."""
    client = SentinelClient(own_deployment.url, command_timeout_s=0.3)
    try:
        assert client.execute("SET", "demote:1", "1") == b"OK"
        assert client.execute("WAIT", "1", "5000") == 1
        own_deployment.replica.command("REPLICAOF", "NO", "ONE")
        own_deployment.primary.command("REPLICAOF", "127.0.0.1", str(own_deployment.replica.port))
        with pytest.raises(RedisClientError) as raised:
            client.execute("SET", "demote:1", "2")
        assert "is a slave" in str(raised.value)
        assert own_deployment.replica.command("GET", "demote:1") == b"$1\r\n1\r\n"
    finally:
        client.close()


def test_a_reconnect_to_a_demoted_primary_sends_nothing(own_deployment: SentinelDeployment) -> None:
    """The connection drops while idle and the server is demoted meanwhile: the reconnect's
    ROLE check refuses it, so not even a read reaches the replica."""
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.3)
    try:
        assert client.execute("SET", "idle:1", "1") == b"OK"
        servers.replica.command("REPLICAOF", "NO", "ONE")
        servers.primary.command("REPLICAOF", "127.0.0.1", str(servers.replica.port))
        # What Sentinel does to a server it demotes: every client connection closed.
        servers.primary.command("CLIENT", "KILL", "TYPE", "normal")
        time.sleep(IDLE_CHECK_AFTER_S * 2)  # idle that long, it is checked before reuse
        with pytest.raises(RedisClientError, match="is a slave"):
            client.execute("GET", "idle:1")
        assert b"cmdstat_get:" not in servers.primary.command("INFO", "commandstats")
    finally:
        client.close()


def test_a_reply_waits_for_the_replicas(own_deployment: SentinelDeployment) -> None:
    """A write the replica has not acknowledged is not answered: it could still be lost."""
    servers = own_deployment
    # The client requires the replicas the primary lists (ROLE) when first used: a
    # replica fresh from its sync is listed once it is online.
    until(lambda: b"127.0.0.1" in servers.primary.command("ROLE"), 10, "the replica online")
    client = SentinelClient(servers.url, command_timeout_s=0.4)
    try:
        assert client.execute("SET", "warm-up", "1") == b"OK"
        assert client.replicas_required == 1
        assert client.replica_wait_ms == 200
        servers.replica.pause()  # SIGSTOP: it acknowledges nothing
        try:
            with pytest.raises(RedisConnectionError, match=r"0 of the 1 replicas .* \(WAIT\)"):
                client.execute("INCR", "unacked")
        finally:
            servers.replica.resume()
        # It ran on the primary: only its reply was withheld.
        assert servers.primary.command("GET", "unacked") == b"$1\r\n1\r\n"
        time.sleep(RETRY_INTERVAL_S * 2)
        assert client.execute("INCR", "unacked") == 2
    finally:
        client.close()


@pytest.mark.slow
def test_a_switchover_is_followed_when_the_sentinels_announce_it(
    own_deployment: SentinelDeployment,
) -> None:
    """No command fails first: the +switch-master announcement moves the client."""
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.3)
    try:
        client.connect()
        until(lambda: client.watching == 3, 10, "listening to the three sentinels")
        assert client.primary_address == ("127.0.0.1", servers.primary.port)
        switch_over(servers)
        until(
            lambda: client.primary_address == ("127.0.0.1", servers.replica.port),
            15,
            "following the switchover",
        )
        assert client.failovers == 1
        assert client.execute("SET", "after-switch", "1") == b"OK"
        assert servers.replica.command("GET", "after-switch") == b"$1\r\n1\r\n"
        assert servers.primary.command("EXISTS", "after-switch") == b":0\r\n"
    finally:
        client.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_a_forked_child_leaves_the_parent_subscriptions_alone(
    deployment: SentinelDeployment,
) -> None:
    limiter = RateLimiter(deployment.url, key_prefix="sync-fork-sentinel")
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert limiter.check_with_info("parent", "10/hour").remaining == 9
    until(lambda: client.watching == 3, 10, "listening to the three sentinels")
    subscribers = dict(client._subscribers)

    def child() -> list[int]:
        remaining = limiter.check_with_info("child", "10/hour").remaining
        until(lambda: client.watching == 3, 10, "the child's own subscriptions")
        assert all(mine is not subscribers[at] for at, mine in client._subscribers.items())
        limiter.close()
        return [remaining]

    assert in_child(child) == [9]
    time.sleep(0.3)  # time for an end-of-stream to arrive, were there one
    assert client._subscribers == subscribers and client.watching == 3
    assert limiter.check_with_info("parent", "10/hour").remaining == 8
    limiter.close()


def switch_over(servers: SentinelDeployment) -> None:
    """SENTINEL FAILOVER, asked again while a sentinel refuses it; at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        reply = servers.sentinels[0].command("SENTINEL", "FAILOVER", servers.service)
        if reply == b"+OK\r\n":
            return
        assert time.monotonic() < deadline, f"SENTINEL FAILOVER still refused: {reply!r}"
        time.sleep(0.1)


def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_killed_primary_is_followed_to_the_promoted_replica(
    own_deployment: SentinelDeployment,
) -> None:
    client = SentinelClient(own_deployment.url, command_timeout_s=0.2, connect_timeout_s=0.2)
    try:
        assert client.execute("INCR", "followed") == 1
        assert client.execute("WAIT", "1", "2000") == 1
        own_deployment.primary.stop()
        deadline = time.monotonic() + 30
        failures = 0
        while True:
            try:
                value = client.execute("INCR", "followed")
                break
            except RedisConnectionError:
                failures += 1
                assert time.monotonic() < deadline, "the client never reached a new primary"
                time.sleep(0.05)
        assert failures >= 1
        assert value == 2  # the replicated state, on the promoted replica
        assert client.primary_address == ("127.0.0.1", own_deployment.replica.port)
        assert client.failovers == 1
    finally:
        client.close()


def test_the_blocking_limiter_decides_on_the_primary(deployment: SentinelDeployment) -> None:
    limiter = RateLimiter(deployment.url, key_prefix="sync-basic")
    try:
        admitted = [limiter.check_with_info("user:1", "5/minute").allowed for _ in range(8)]
        assert admitted == [True] * 5 + [False] * 3
        client = limiter.backend.client  # type: ignore[attr-defined]
        assert isinstance(client, SentinelClient)
        assert client.primary_address == ("127.0.0.1", deployment.primary.port)
        assert limiter.reset("user:1") == 1
    finally:
        limiter.close()


@pytest.mark.slow
def test_failover_under_threaded_load(own_deployment: SentinelDeployment) -> None:
    """The primary killed under 8 threads: fail closed (or open) until the sentinels
    promote the replica, then decisions resume on it with the replicated state."""
    options = {"key_prefix": "sync-failover", "command_timeout_s": 0.2, "connect_timeout_s": 0.2}
    closed = RateLimiter(own_deployment.url, breaker_cooldown_s=0.2, **options)  # type: ignore[arg-type]
    opened = RateLimiter(own_deployment.url, fail_open=True, **options)  # type: ignore[arg-type]
    try:
        spent = [closed.check_with_info("spent", "100/hour").allowed for _ in range(60)]
        assert all(spent)
        assert own_deployment.primary.command("WAIT", "1", "2000") == b":1\r\n"

        # (when the check started, limiter, outcome): a check started after the kill
        # cannot have been decided by the killed primary.
        records: list[tuple[float, str, str]] = []
        stop = threading.Event()

        def load(limiter: RateLimiter, name: str, identity: str) -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = limiter.check_with_info(identity, "100000/hour")
                    outcome = "bypassed" if result.bypassed else "allowed"
                except BackendError:
                    outcome = "error"
                records.append((started, name, outcome))
                time.sleep(0.002)

        threads = [
            threading.Thread(target=load, args=(closed, "closed", f"c{n}"), daemon=True)
            for n in range(6)
        ] + [
            threading.Thread(target=load, args=(opened, "open", f"o{n}"), daemon=True)
            for n in range(2)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        own_deployment.primary.stop()  # SIGKILL, and waits for the process to end
        # Taken once the process is gone: a check started before may still have been
        # decided by the killed primary (seen in CI: such decisions read as "back"
        # before any failover, and the primary was still the old one).
        killed_at = time.monotonic()
        deadline = killed_at + 30
        while True:
            back = [t for t, n, o in records if n == "closed" and o == "allowed" and t > killed_at]
            if back and records[-1][0] > back[0] + 0.5:
                break
            assert time.monotonic() < deadline, "no decision on a new primary within 30 s"
            time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join(5)
        assert not any(thread.is_alive() for thread in threads)

        after = [(t, n, o) for t, n, o in records if t >= killed_at]
        errors = [t for t, n, o in after if o == "error"]
        first_back = min(t for t, n, o in after if n == "closed" and o == "allowed")
        assert errors and all(n == "closed" for t, n, o in after if o == "error")
        # Fail closed between the first error and the first decision back; fail open
        # bypassed the same outage instead of raising.
        assert all(
            o == "error" for t, n, o in after if n == "closed" and errors[0] <= t < first_back
        )
        outcomes = Counter(o for _, n, o in after if n == "open")
        assert outcomes["bypassed"] > 0 and outcomes["error"] == 0
        client = closed.backend.client  # type: ignore[attr-defined]
        assert client.primary_address == ("127.0.0.1", own_deployment.replica.port)
        # The replicated state is honoured: exactly 40 more of 100.
        assert sum(closed.check_with_info("spent", "100/hour").allowed for _ in range(60)) == 40
        print(
            f"\nblocking sentinel failover: outage {(first_back - killed_at) * 1000:.0f} ms, "
            f"{len(errors)} BackendError (fail closed), {outcomes['bypassed']} bypassed (fail open)"
        )
    finally:
        closed.close()
        opened.close()
