"""The blocking Sentinel client and moderato.sync.RateLimiter on real processes: one primary,
one replica, three sentinels.

The asyncio client's rules (tests/test_sentinel.py), followed from threads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from redis_servers import SentinelDeployment, free_port

from moderato import BackendError
from moderato.redis.blocking import SentinelClient
from moderato.redis.errors import RedisClientError, RedisConnectionError
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
        assert "is a slave (a failover in progress?)" in str(raised.value)
        assert own_deployment.replica.command("GET", "demote:1") == b"$1\r\n1\r\n"
    finally:
        client.close()


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

        records: list[tuple[float, str, str]] = []  # (time, limiter, outcome)
        stop = threading.Event()

        def load(limiter: RateLimiter, name: str, identity: str) -> None:
            while not stop.is_set():
                try:
                    result = limiter.check_with_info(identity, "100000/hour")
                    outcome = "bypassed" if result.bypassed else "allowed"
                except BackendError:
                    outcome = "error"
                records.append((time.monotonic(), name, outcome))
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
        killed_at = time.monotonic()
        own_deployment.primary.stop()
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
