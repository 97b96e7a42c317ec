"""The blocking Sentinel client on real processes: one primary, one replica, three sentinels.

The asyncio client's rules (tests/test_sentinel.py), followed from threads.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis_servers import SentinelDeployment, free_port

from moderato.redis.blocking import SentinelClient
from moderato.redis.errors import RedisClientError, RedisConnectionError


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
