"""Redis Sentinel on real processes: one primary, one replica, three ``redis-server --sentinel``.

The failover test kills the primary under load and prints what it measured:
the outage, the time from the sentinels' promotion to the first decision on the
new primary, and what the replica had (not) received when the primary died.
The quota test changes the primary (SENTINEL FAILOVER, or SIGKILL) under one
or two real uvicorn processes and prints what each identity was admitted.
docs/operations.md ("Deployments", "Sentinel") records the figures.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest
from batching_helpers import EXACT_N_CHECKS, exact_n_admitted, repeats_per_call
from cluster import call, report, script_calls
from fork_helpers import in_child_of_loop as in_child
from redis_servers import RedisServer, SentinelDeployment, SentinelServer, free_port
from uvicorn_helpers import app_processes

from moderato import RateLimiter
from moderato.algorithms import DEFAULT_ALGORITHM
from moderato.errors import BackendError
from moderato.redis import RedisClient, SentinelClient
from moderato.redis.errors import RedisClientError, RedisConnectionError, RedisReplyError
from moderato.redis.sentinel import RETRY_INTERVAL_S

RATE = "100/hour"
LOAD_RATE = "100000/hour"


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
    """A deployment for one test, free to be killed and reconfigured."""
    yield from _watched("own")


async def test_decisions_go_to_the_primary_the_sentinels_name(
    deployment: SentinelDeployment,
) -> None:
    limiter = RateLimiter(deployment.url, key_prefix="basic")
    try:
        admitted = [(await limiter.check_with_info("user:1", "5/minute")).allowed for _ in range(8)]
        assert admitted == [True] * 5 + [False] * 3
        client = limiter.backend.client  # type: ignore[attr-defined]
        assert isinstance(client, SentinelClient)
        assert client.primary_address == ("127.0.0.1", deployment.primary.port)
        # The counters are on the primary, replicated to the replica.
        assert deployment.primary.command("DBSIZE") != b":0\r\n"
    finally:
        await limiter.close()


async def test_a_sentinel_that_is_down_is_skipped(deployment: SentinelDeployment) -> None:
    dead = free_port()
    hosts = ",".join(f"127.0.0.1:{port}" for port in (dead, deployment.sentinels[2].port))
    client = SentinelClient(f"redis+sentinel://{hosts}/shared/3", command_timeout_s=0.3)
    try:
        assert await client.execute("SET", "db-three", "yes") == b"OK"
        assert await client.execute("CLIENT", "INFO") is not None
        assert b"db=3" in await client.execute("CLIENT", "INFO")
        assert client.primary_address == ("127.0.0.1", deployment.primary.port)
    finally:
        await client.close()


async def test_an_unknown_service_is_a_backend_error(deployment: SentinelDeployment) -> None:
    port = deployment.sentinels[0].port
    limiter = RateLimiter(f"redis+sentinel://127.0.0.1:{port}/nosuch", key_prefix="x")
    try:
        with pytest.raises(BackendError, match=r"does not monitor 'nosuch'"):
            await limiter.check("user:1", "5/minute")
    finally:
        await limiter.close()


async def test_no_sentinel_reachable_is_a_backend_error() -> None:
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    limiter = RateLimiter(f"redis+sentinel://{hosts}/svc", key_prefix="x", connect_timeout_s=0.2)
    try:
        with pytest.raises(BackendError, match=r"no sentinel of redis\+sentinel://.* named a"):
            await limiter.check("user:1", "5/minute")
    finally:
        await limiter.close()


async def test_a_demoted_primary_is_never_decided_on(own_deployment: SentinelDeployment) -> None:
    """The named server turns replica under a live connection: READONLY, then ROLE refuses it."""
    client = SentinelClient(own_deployment.url, command_timeout_s=0.3)
    limiter_keys = ["demote:1"]
    try:
        assert await client.execute("SET", limiter_keys[0], "1") == b"OK"
        # The replica must hold the write before it is promoted, or the last
        # assertion below reads a value that never reached it.
        assert await client.execute("WAIT", "1", "5000") == 1
        # Promote the replica by hand and make the primary its replica, behind
        # the sentinels' back: they still name the old primary for a while.
        own_deployment.replica.command("REPLICAOF", "NO", "ONE")
        own_deployment.primary.command("REPLICAOF", "127.0.0.1", str(own_deployment.replica.port))
        with pytest.raises(RedisClientError) as raised:
            await client.execute("SET", limiter_keys[0], "2")
        # The write was refused (READONLY), the client asked the sentinels again,
        # and the server they name answered ROLE "slave": nothing ran anywhere.
        assert "is a slave (a failover in progress?)" in str(raised.value)
        assert own_deployment.replica.command("GET", limiter_keys[0]) == b"$1\r\n1\r\n"
    finally:
        await client.close()


async def test_a_reconnect_to_a_demoted_primary_sends_nothing(
    own_deployment: SentinelDeployment,
) -> None:
    """The connection drops while idle and the server is demoted meanwhile: the silent
    reconnect's ROLE check refuses it, so not even a read reaches the replica."""
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.3)
    try:
        assert await client.execute("SET", "idle:1", "1") == b"OK"
        servers.replica.command("REPLICAOF", "NO", "ONE")
        servers.primary.command("REPLICAOF", "127.0.0.1", str(servers.replica.port))
        # What Sentinel does to a server it demotes: every client connection closed.
        servers.primary.command("CLIENT", "KILL", "TYPE", "normal")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and client._primary.client.connections():  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        with pytest.raises(RedisClientError, match="is a slave"):
            await client.execute("GET", "idle:1")
        # The old primary saw no GET: not the first attempt (refused at the
        # handshake), not the second (the sentinels still name it, and its ROLE
        # check refuses it again).
        assert b"cmdstat_get:" not in servers.primary.command("INFO", "commandstats")
    finally:
        await client.close()


def _switch_over(servers: SentinelDeployment) -> None:
    """SENTINEL FAILOVER (a graceful switchover), asked again while a sentinel refuses it
    (-NOGOODSLAVE while it still checks the replica, -INPROG); at most 10 s."""
    deadline = time.monotonic() + 10
    while True:
        reply = servers.sentinels[0].command("SENTINEL", "FAILOVER", servers.service)
        if reply == b"+OK\r\n":
            return
        assert time.monotonic() < deadline, f"SENTINEL FAILOVER still refused: {reply!r}"
        time.sleep(0.1)


async def _until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.02)


async def _switch_over_and_follow(servers: SentinelDeployment, client: SentinelClient) -> None:
    """_switch_over(), then wait (15 s at most) until ``client`` names the replica its
    primary."""
    _switch_over(servers)
    await _until(
        lambda: client.primary_address == ("127.0.0.1", servers.replica.port),
        15,
        "following the switchover",
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_a_forked_child_leaves_the_parent_subscriptions_alone(
    deployment: SentinelDeployment,
) -> None:
    """The child subscribes on its own connections and closes them; the parent's
    subscriptions to the sentinels are never touched (see moderato/redis/forks.py)."""
    loop = asyncio.new_event_loop()
    try:
        run = loop.run_until_complete
        limiter = RateLimiter(deployment.url, key_prefix="fork-sentinel")
        client = limiter.backend.client  # type: ignore[attr-defined]
        assert isinstance(client, SentinelClient)
        assert run(limiter.check_with_info("parent", "10/hour")).remaining == 9
        run(_until(lambda: client.watching == 3, 10, "subscribing to the three sentinels"))
        subscribers = dict(client._subscribers)

        async def child() -> list[int]:
            remaining = (await limiter.check_with_info("child", "10/hour")).remaining
            await _until(lambda: client.watching == 3, 10, "the child's own subscriptions")
            assert all(mine is not subscribers[at] for at, mine in client._subscribers.items())
            await limiter.close()
            return [remaining]

        assert in_child(child, close_inherited=loop) == [9]
        run(asyncio.sleep(0.3))  # time for an end-of-stream to arrive, were there one
        assert client._subscribers == subscribers
        assert client.watching == 3 and client.subscription_problems == {}
        assert run(limiter.check_with_info("parent", "10/hour")).remaining == 8
        run(limiter.close())
    finally:
        loop.close()


@pytest.mark.slow
async def test_a_switchover_is_followed_when_the_sentinels_announce_it(
    own_deployment: SentinelDeployment,
) -> None:
    """No command fails first: the +switch-master announcement moves the client,
    and following it (three sentinels announce it within milliseconds) never holds up
    the event loop."""
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.3)
    gaps_s: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps_s.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    try:
        await client.connect()
        await _until(lambda: client.watching == 3, 10, "subscribing to the three sentinels")
        assert client.primary_address == ("127.0.0.1", servers.primary.port)
        # No command is sent meanwhile: only the announcement can move it.
        await _switch_over_and_follow(servers, client)
        await asyncio.sleep(0.5)  # the last announcements are followed too
        stop.set()
        await ticker
        # A loaded machine delays a 10 ms sleep by far less; a search that spun
        # on the loop held it for seconds.
        assert max(gaps_s) < 1.0, f"the event loop stalled for {max(gaps_s):.2f} s"
        # The old primary is still a master (the sentinels demote it seconds later).
        assert servers.primary.command("ROLE").startswith(b"*3\r\n$6\r\nmaster")
        assert client.failovers == 1
        assert await client.execute("SET", "after-switch", "1") == b"OK"
        assert servers.replica.command("GET", "after-switch") == b"$1\r\n1\r\n"
        assert servers.primary.command("EXISTS", "after-switch") == b":0\r\n"
    finally:
        stop.set()
        await ticker
        await client.close()


@pytest.mark.slow
async def test_a_sentinel_behind_the_newest_configuration_is_passed_over(
    own_deployment: SentinelDeployment,
) -> None:
    """After a failover, a sentinel still naming an older primary never sends the client back.

    The stand-in for a sentinel that has not heard of the failover: a fourth
    sentinel watching another server under the same service name, at
    configuration epoch 0, listed last.
    """
    servers = own_deployment
    other = RedisServer().start()
    behind = SentinelServer(other.port, servers.service).start()
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in (*servers.sentinels, behind))
    client = SentinelClient(f"redis+sentinel://{hosts}/{servers.service}", command_timeout_s=0.3)
    try:
        await client.connect()
        await _until(lambda: client.watching == 4, 10, "subscribing to the four sentinels")
        await _switch_over_and_follow(servers, client)
        # Only the sentinel that is behind can answer, and the primary is silent.
        for sentinel in servers.sentinels:
            sentinel.pause()
        servers.replica.pause()
        try:
            with pytest.raises(RedisConnectionError):
                await client.execute("SET", "k", "1")  # times out: the client asks again
            with pytest.raises(RedisConnectionError, match=r"older than epoch 1"):
                await client.execute("SET", "k", "1")
        finally:
            servers.replica.resume()
            for sentinel in servers.sentinels:
                sentinel.resume()
        assert other.command("DBSIZE") == b":0\r\n"
        deadline = time.monotonic() + 10
        while True:
            try:
                assert await client.execute("SET", "k", "2") == b"OK"
                break
            except RedisConnectionError:
                assert time.monotonic() < deadline, "not back on the new primary after 10 s"
                await asyncio.sleep(0.05)
        assert client.primary_address == ("127.0.0.1", servers.replica.port)
        assert other.command("DBSIZE") == b":0\r\n"
    finally:
        await client.close()
        behind.close()
        other.close()


async def _until_replicas_required(client: SentinelClient, count: int) -> None:
    """Write until the client requires ``count`` acknowledgements: it starts from the
    replicas the primary had put online when first asked, and counts more as WAIT
    sees them (a replica fresh from its sync may not be online yet)."""
    deadline = time.monotonic() + 10
    while True:
        assert await client.execute("SET", "acl:warm-up", "1") == b"OK"
        if client.replicas_required == count:
            return
        assert time.monotonic() < deadline, f"{client.replicas_required} replicas after 10 s"
        await asyncio.sleep(0.1)


async def test_a_reply_waits_for_the_replicas(own_deployment: SentinelDeployment) -> None:
    """A write the replica has not acknowledged is not answered: it could still be lost."""
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.4)
    try:
        await _until_replicas_required(client, 1)
        assert client.replica_wait_ms == 200
        servers.replica.pause()  # SIGSTOP: it acknowledges nothing
        try:
            with pytest.raises(RedisConnectionError, match=r"0 of the 1 replicas .* \(WAIT\)"):
                await client.execute("INCR", "unacked")
        finally:
            servers.replica.resume()
        # It ran on the primary: only its reply was withheld.
        assert servers.primary.command("GET", "unacked") == b"$1\r\n1\r\n"
        # Acknowledged again: answered again (after the sentinels are asked once more).
        await asyncio.sleep(RETRY_INTERVAL_S * 2)
        # A loaded machine may take longer than the 0.4 s command timeout to
        # reconnect and ask ROLE: a read that is safe to repeat waits for that.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                assert await client.execute("GET", "unacked") == b"1"
                break
            except RedisConnectionError:
                assert time.monotonic() < deadline, "not answering 10 s after the replica resumed"
                await asyncio.sleep(0.1)
        assert await client.execute("INCR", "unacked") == 2
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_replica_that_comes_online_is_waited_for(
    own_deployment: SentinelDeployment,
) -> None:
    """A replica that finishes its sync after the primary was first used (the old
    primary after a switchover, say) must acknowledge from then on, even when every
    command writes (WAIT alone would not show it: the replicas' periodic
    acknowledgement always lags the newest write)."""
    servers = own_deployment
    servers.replica.command("REPLICAOF", "NO", "ONE")  # detached for a moment
    client = SentinelClient(servers.url, command_timeout_s=0.4)
    try:
        assert await client.execute("SET", "online:0", "1") == b"OK"
        assert client.replicas_required == 0
        servers.replica.command("REPLICAOF", "127.0.0.1", str(servers.primary.port))
        deadline = time.monotonic() + 15
        writes = 0
        while client.replicas_required == 0:
            assert time.monotonic() < deadline, "the replica is still not waited for"
            writes += 1
            assert await client.execute("SET", f"online:{writes}", "1") == b"OK"
            await asyncio.sleep(0.05)
        assert client.replicas_required == 1
        # From now on a write the replica did not acknowledge is not answered.
        servers.replica.pause()
        try:
            with pytest.raises(RedisConnectionError, match="0 of the 1 replicas"):
                await client.execute("SET", "online:unacked", "1")
        finally:
            servers.replica.resume()
    finally:
        await client.close()


async def test_the_documented_acl_suffices_and_a_missing_wait_is_named(
    own_deployment: SentinelDeployment,
) -> None:
    """docs/operations.md: the sentinels' user and the data nodes' Sentinel additions."""
    servers = own_deployment
    for sentinel in servers.sentinels:
        sentinel.command(
            "ACL", "SETUSER", "watcher", "on", ">spw", "-@all", "+sentinel|master",
            "+sentinel|replicas", "+subscribe", "resetchannels", "&+switch-master",
        )  # fmt: skip
    for node in (servers.primary, servers.replica):
        node.command(
            "ACL", "SETUSER", "app", "on", ">pw", "-@all", "+set", "+role", "+wait", "~acl:*"
        )
    hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in servers.sentinels)
    url = f"redis+sentinel://app:pw@{hosts}/{servers.service}?sentinel_username=watcher"
    # Nothing here waits out a dead node: a timeout a loaded machine cannot trip (0.4 s
    # did once, under other tests' load, before the ACL was checked at all).
    client = SentinelClient(url + "&sentinel_password=spw", command_timeout_s=5.0)
    try:
        await _until_replicas_required(client, 1)
        await _until(lambda: client.watching == 3, 10, "subscribing to the three sentinels")
        assert client.subscription_problems == {}
        servers.primary.command("ACL", "SETUSER", "app", "-wait")
        with pytest.raises(RedisReplyError, match=r"^NOPERM .*'wait'.* grant \+wait or set wait"):
            await client.execute("SET", "acl:2", "1")
    finally:
        await client.close()


async def test_a_dead_replica_stops_counting_once_the_sentinels_declare_it_down(
    own_deployment: SentinelDeployment,
) -> None:
    servers = own_deployment
    client = SentinelClient(servers.url, command_timeout_s=0.4)
    try:
        await _until_replicas_required(client, 1)
        killed_at = time.monotonic()
        servers.replica.stop()  # SIGKILL
        with pytest.raises(RedisConnectionError, match="0 of the 1 replicas"):
            await client.execute("INCR", "n")
        # Failing until the sentinels declare it down (down-after-milliseconds 400),
        # then answered with no replica to wait for.
        failures = 1
        deadline = time.monotonic() + 15
        while True:
            try:
                reply = await client.execute("INCR", "n")
            except RedisConnectionError:
                failures += 1
                assert time.monotonic() < deadline, "still failing after 15 s"
                await asyncio.sleep(0.02)
            else:
                break
        back_s = time.monotonic() - killed_at
        assert client.replicas_required == 0
        assert reply == int(servers.primary.command("GET", "n").split(b"\r\n")[1])
        print(f"\nreplica killed: {failures} failed commands, answered again after {back_s:.2f} s")
    finally:
        await client.close()


# -- the failover ---------------------------------------------------------------------------


@dataclass
class Outcomes:
    """Per check: (time, outcome) with outcome allowed/denied/bypassed/BackendError."""

    records: list[tuple[float, str]] = field(default_factory=list)
    admitted: dict[str, int] = field(default_factory=dict)
    # A check that raised may still have been counted (the script ran, then its
    # reply or the WAIT after it was lost): it can only make the count higher.
    errors: dict[str, int] = field(default_factory=dict)
    unexpected: list[BaseException] = field(default_factory=list)


async def _load(
    limiter: RateLimiter, identity: str, outcomes: Outcomes, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            result = await limiter.check_with_info(identity, LOAD_RATE)
        except BackendError:
            outcomes.records.append((time.monotonic(), "error"))
            outcomes.errors[identity] = outcomes.errors.get(identity, 0) + 1
        except Exception as error:  # anything else is a bug the test reports
            outcomes.unexpected.append(error)
        else:
            if result.bypassed:
                outcome = "bypassed"
            else:
                outcome = "allowed" if result.allowed else "denied"
                if result.allowed:
                    outcomes.admitted[identity] = outcomes.admitted.get(identity, 0) + 1
            outcomes.records.append((time.monotonic(), outcome))
        await asyncio.sleep(0.002)


async def _named_primary(sentinel: RedisClient, service: str) -> int | None:
    try:
        reply = await sentinel.execute("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)
    except (BackendError, RedisClientError):  # a loaded machine's slow connect included
        return None
    return int(reply[1]) if reply else None


@pytest.mark.slow
async def test_failover_under_load(own_deployment: SentinelDeployment) -> None:
    servers = own_deployment
    options = {
        "key_prefix": "failover",
        "command_timeout_s": 0.2,
        "connect_timeout_s": 0.2,
        "breaker_cooldown_s": 0.2,
    }
    closed = RateLimiter(servers.url, **options)  # type: ignore[arg-type]
    opened = RateLimiter(servers.url, fail_open=True, **options)  # type: ignore[arg-type]
    watcher = RedisClient(f"redis://127.0.0.1:{servers.sentinels[0].port}", command_timeout_s=2.0)
    try:
        # State written and replicated before the kill: 60 of 100 spent.
        spent = [await closed.check_with_info("spent", RATE) for _ in range(60)]
        assert all(result.allowed for result in spent)
        assert servers.primary.command("WAIT", "1", "2000") == b":1\r\n"

        closed_outcomes, open_outcomes = Outcomes(), Outcomes()
        stop = asyncio.Event()
        workers = [
            asyncio.ensure_future(_load(closed, f"load:{n}", closed_outcomes, stop))
            for n in range(6)
        ] + [
            asyncio.ensure_future(_load(opened, f"open:{n}", open_outcomes, stop)) for n in range(2)
        ]
        await asyncio.sleep(1.0)
        killed_at = time.monotonic()
        servers.primary.stop()  # SIGKILL under load

        promoted_at: float | None = None
        # The promotion happened after the last query that still did not name the
        # replica began: the only bound the watcher knows (the limiter may learn of
        # the promotion before the watcher's next poll does).
        not_yet_at = killed_at
        deadline = killed_at + 30.0
        while time.monotonic() < deadline:
            if promoted_at is None:
                asked_at = time.monotonic()
                if await _named_primary(watcher, servers.service) == servers.replica.port:
                    promoted_at = time.monotonic()
                else:
                    not_yet_at = asked_at
            else:
                recent = [t for t, outcome in closed_outcomes.records[-50:] if outcome == "allowed"]
                if recent and recent[-1] > promoted_at + 1.0:
                    break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.gather(*workers)
        assert promoted_at is not None, "the sentinels promoted no replica within 30 s"

        assert closed_outcomes.unexpected == [] and open_outcomes.unexpected == []
        after_kill = [(t, o) for t, o in closed_outcomes.records if t >= killed_at]
        errors = [t for t, o in after_kill if o == "error"]
        assert errors, "the kill went unnoticed"
        first_back = min(t for t, o in after_kill if o == "allowed" and t > errors[0])
        assert first_back > not_yet_at, "a decision was made before any primary existed"
        # Fail closed: every check between the first error and recovery raised
        # BackendError (a check answered just before the kill may be recorded
        # after it, and a loaded machine may time out a check after recovery,
        # so the span is from the first error to the first decision back).
        assert all(o == "error" for t, o in after_kill if errors[0] <= t < first_back)
        # Fail open: the same outage was bypassed, never raised.
        bypassed = sum(1 for t, o in open_outcomes.records if o == "bypassed")
        assert bypassed > 0
        assert all(o in ("allowed", "bypassed") for _, o in open_outcomes.records)

        client = closed.backend.client  # type: ignore[attr-defined]
        assert isinstance(client, SentinelClient)
        assert client.primary_address == ("127.0.0.1", servers.replica.port)
        assert client.failovers == 1

        # What was replicated before the kill is honoured on the new primary:
        # exactly the 40 remaining of 100 are admitted, not one more.
        after = [await closed.check_with_info("spent", RATE) for _ in range(60)]
        assert sum(result.allowed for result in after) == 40

        # Admissions the primary made in its last moments that had not reached
        # the replica are lost: asynchronous replication's window. Nothing is
        # counted that was not asked for: at most the admitted checks plus the
        # ones that raised (those may have run before their reply was lost).
        lost = 0
        for identity, admitted in closed_outcomes.admitted.items():
            usage = await closed.get_usage(identity, LOAD_RATE)
            assert usage["current"] <= admitted + closed_outcomes.errors.get(identity, 0)
            lost += max(0, admitted - usage["current"])
        outage_s = first_back - killed_at
        print(
            f"\nsentinel failover: outage {outage_s * 1000:.0f} ms "
            f"(sentinels promoted after {(promoted_at - killed_at) * 1000:.0f} ms, "
            f"first decision on the new primary {(first_back - promoted_at) * 1000:.0f} ms "
            f"after that); fail closed: {len(errors)} BackendError; fail open: {bypassed} "
            f"bypassed; checks admitted {sum(closed_outcomes.admitted.values())}, "
            f"of which {lost} were lost with the old primary; "
            f"replicated state: 60 spent + {sum(r.allowed for r in after)} after = limit 100"
        )
    finally:
        await closed.close()
        await opened.close()
        await watcher.close()


async def test_a_cold_script_cache_under_a_burst_through_sentinel(
    deployment: SentinelDeployment,
) -> None:
    """4,000 checks in flight when the primary's script cache is empty: one SCRIPT
    LOAD, each call re-sent once as EVALSHA, one identity gets exactly its limit."""
    burst, limit = 4000, 3000
    port = deployment.primary.port
    limiter = RateLimiter(deployment.url, key_prefix="cold", command_timeout_s=10.0)
    try:
        await limiter.connect()
        assert call(port, "SCRIPT", "FLUSH") == b"OK"
        assert call(port, "CONFIG", "RESETSTAT") == b"OK"
        outcomes = await asyncio.gather(
            *(limiter.check_with_info("hot", f"{limit}/day") for _ in range(burst)),
            return_exceptions=True,
        )
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        admitted = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.allowed)
        report(f"sentinel, cold script cache, {burst} concurrent checks at {limit}/day on one "
               f"identity: admitted {admitted} / denied {burst - admitted - len(errors)} / "
               f"failed {len(errors)}")  # fmt: skip
        assert errors == []
        assert admitted == limit
        assert script_calls(port) == {
            "evalsha": (2 * burst, burst),
            "eval": (0, 0),
            "script|load": (1, 0),
        }
        usage = await limiter.get_usage("hot", f"{limit}/day")
        assert (usage["current"], usage["remaining"]) == (limit, 0)
    finally:
        await limiter.close()


# -- a change of primary under real app processes ---------------------------------------------
#
# Identities keep asking one or two uvicorn processes (sentinel_app.py) for a
# QUOTA/day route while the primary changes: gracefully (SENTINEL FAILOVER:
# the old primary stays up, a master still, for seconds after the replica's
# promotion, then is demoted and resyncs, dropping what it wrote meanwhile) or
# by a crash (SIGKILL). Identity n starts at n * STAGGER_S, so some are part
# way through their quota when the primary changes and some start during the
# change. Every identity asks until the change is over and it has then been
# refused (429) at least once: its quota is spent on the primary that stays.

QUOTA = 20
IDENTITIES = 24
STAGGER_S = 0.25
PACE_S = 0.1
CHANGE_AT_S = 2.0


@dataclass
class Tally:
    """Per identity: the 200s, the 503s and when the last 429 came; every status seen."""

    admitted: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, int] = field(default_factory=dict)
    refused_at: dict[str, float] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)

    def count(self, identity: str, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            self.admitted[identity] = self.admitted.get(identity, 0) + 1
        elif status == 503:
            self.unavailable[identity] = self.unavailable.get(identity, 0) + 1
        elif status == 429:
            self.refused_at[identity] = time.monotonic()

    def refused_since(self, since: float) -> bool:
        """Whether every identity has been refused since ``since``."""
        return all(self.refused_at.get(f"client-{n}", 0.0) > since for n in range(IDENTITIES))


async def _ask_until(
    http: httpx.AsyncClient,
    urls: list[str],
    identity: str,
    start_s: float,
    tally: Tally,
    stop: asyncio.Event,
) -> None:
    await asyncio.sleep(start_s)
    sent = 0
    while not stop.is_set():
        url = urls[sent % len(urls)]  # two apps: each gets every other request
        sent += 1
        try:
            response = await http.get(f"{url}/quota", headers={"x-client": identity})
        except httpx.TransportError:
            tally.count(identity, 0)
        else:
            tally.count(identity, response.status_code)
        await asyncio.sleep(PACE_S)


def _synced_replica(server: RedisServer) -> bool:
    """Whether ``server`` is a replica whose link to its primary is up (its resync done)."""
    try:
        return b"master_link_status:up" in server.command("INFO", "replication")
    except OSError:
        return False


async def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``condition`` every 0.1 s; the time it held, or AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        await asyncio.sleep(0.1)
    return time.monotonic()


async def _change_primary_under_clients(
    servers: SentinelDeployment, urls: list[str], how: str
) -> tuple[Tally, float]:
    """Run the identities; change the primary ``how``: "switchover" or "crash".

    Returns the tally and how many seconds the run took.
    """
    tally, stop = Tally(), asyncio.Event()
    limits = httpx.Limits(max_connections=IDENTITIES * 2)
    async with httpx.AsyncClient(limits=limits, timeout=5) as http:
        began = time.monotonic()
        clients = [
            asyncio.ensure_future(_ask_until(http, urls, f"client-{n}", n * STAGGER_S, tally, stop))
            for n in range(IDENTITIES)
        ]
        try:
            await asyncio.sleep(CHANGE_AT_S)
            if how == "switchover":
                _switch_over(servers)
            else:
                servers.primary.stop()  # SIGKILL
            # Over when the sentinels name the replica and, after a switchover,
            # the old primary has been demoted and has resynced from the new one:
            # until the demotion it answers as a master, and until the resync it
            # still holds the counters it wrote after the promotion.
            over_at = await _wait_for(
                lambda: (
                    servers.sentinels[1].primary_port() == servers.replica.port
                    and (how == "crash" or _synced_replica(servers.primary))
                ),
                40,
                f"the {how}",
            )
            await _wait_for(
                lambda: tally.refused_since(over_at), 30, "a 429 for every identity after it"
            )
        finally:
            stop.set()
            await asyncio.gather(*clients)
    return tally, time.monotonic() - began


@pytest.mark.slow
@pytest.mark.parametrize("apps", [1, 2], ids=["one-app", "two-apps"])
@pytest.mark.parametrize("how", ["switchover", "crash"])
async def test_no_identity_gets_more_than_its_quota_across_a_change_of_primary(
    own_deployment: SentinelDeployment, tmp_path: Path, how: str, apps: int
) -> None:
    servers = own_deployment
    env = {"MODERATO_TEST_SENTINEL_URL": servers.url, "MODERATO_TEST_QUOTA": str(QUOTA)}
    with app_processes("sentinel_app:app", apps, env, tmp_path) as urls:
        tally, took_s = await _change_primary_under_clients(servers, urls, how)
    identities = [f"client-{n}" for n in range(IDENTITIES)]
    admitted = [tally.admitted.get(identity, 0) for identity in identities]
    unavailable = [tally.unavailable.get(identity, 0) for identity in identities]
    print(
        f"\n{how}, {apps} app(s), {took_s:.1f} s: admitted per identity {admitted} "
        f"(quota {QUOTA}); 503s per identity {unavailable}; "
        f"statuses {dict(sorted(tally.statuses.items()))}"
    )
    assert tally.statuses.keys() <= {200, 429, 503}, tally.statuses
    assert max(admitted) <= QUOTA, admitted
    if how == "switchover":
        # Nothing the old primary decided after the promotion was let through,
        # and it charged nothing that stayed: each identity got its quota, less
        # any check that ran and replicated while its reply was lost in the
        # switchover (answered 503: fail closed when the outcome is unknown).
        assert all(QUOTA - lost <= count for count, lost in zip(admitted, unavailable)), (
            admitted,
            unavailable,
        )
    else:
        # A check whose reply died with the primary may have been charged and
        # replicated: that identity is short by as many (at most one in flight).
        assert all(count >= QUOTA - 1 for count in admitted), admitted


BURST_CHECKS = 40
BURST_CALLS = math.ceil(BURST_CHECKS / repeats_per_call(DEFAULT_ALGORITHM))
"""The EVALSHA calls a batching primary runs for the burst's 40 checks of one identity:
a check, then its repeats, as many as one batched call takes."""


async def _batched_burst(
    limiter: RateLimiter, primary: RedisServer, identity: str = "hot"
) -> tuple[int, int]:
    """A warm-up (the primary found, the scripts loaded; another window: another key),
    then 40 concurrent checks of ``identity`` at 25/minute, counted alone: (admitted,
    EVALSHA calls ``primary`` ran for them)."""
    await asyncio.gather(*(limiter.check_with_info(identity, "100/hour") for _ in range(2)))
    primary.command("CONFIG", "RESETSTAT")
    results = await asyncio.gather(
        *(limiter.check_with_info(identity, "25/minute") for _ in range(BURST_CHECKS))
    )
    return sum(result.allowed for result in results), script_calls(primary.port)["evalsha"][0]


async def test_a_sentinel_url_with_batch_decisions_batches_on_the_primary(
    deployment: SentinelDeployment,
) -> None:
    """``?batch_decisions=true``: the primary's RedisClient joins the turn's checks (the
    WAIT after them still covers every one); without it, a call a check."""

    async def burst(url: str, prefix: str) -> tuple[int, int]:
        limiter = RateLimiter(url, key_prefix=prefix, command_timeout_s=5)
        try:
            return await _batched_burst(limiter, deployment.primary)
        finally:
            await limiter.close()

    assert await burst(f"{deployment.url}?batch_decisions=true", "urlbatch-on") == (25, BURST_CALLS)
    assert await burst(deployment.url, "urlbatch-off") == (25, BURST_CHECKS)


@pytest.mark.slow
async def test_batch_decisions_set_on_the_sentinel_client_holds_across_a_switchover(
    own_deployment: SentinelDeployment,
) -> None:
    """``SentinelClient.batch_decisions`` set after it was made (as on a ClusterClient):
    the primary batches (BURST_CALLS EVALSHA for 40 checks, 25 admitted), and so does the primary
    the sentinels name after a switchover (a new RedisClient)."""
    servers = own_deployment
    limiter = RateLimiter(servers.url, key_prefix="attrbatch", command_timeout_s=5)
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert isinstance(client, SentinelClient)
    assert not client.batch_decisions
    client.batch_decisions = True
    try:
        assert await _batched_burst(limiter, servers.primary) == (25, BURST_CALLS)
        await _until(lambda: client.watching == 3, 10, "subscribing to the three sentinels")
        await _switch_over_and_follow(servers, client)
        assert client.failovers == 1
        # The new primary's client (made when it was found) batches too, and the old
        # primary runs nothing.
        servers.primary.command("CONFIG", "RESETSTAT")
        assert await _batched_burst(limiter, servers.replica, "after") == (25, BURST_CALLS)
        assert script_calls(servers.primary.port)["evalsha"][0] == 0
    finally:
        await limiter.close()


def test_four_processes_of_125_tasks_through_sentinel_admit_exactly_the_limit(
    deployment: SentinelDeployment,
) -> None:
    """Issue 30's exact-N test through Sentinel: every algorithm, 4 processes x 125 tasks
    on one key, each worker turning its SentinelClient's batch_decisions on: exactly the
    limit admitted, in far fewer calls than checks."""
    deployment.primary.command("CONFIG", "RESETSTAT")
    totals = exact_n_admitted(deployment.url, "sentinelgrouped", "100/minute")
    sent = script_calls(deployment.primary.port)["evalsha"][0]
    report(f"Sentinel, batching on: {EXACT_N_CHECKS} checks from 4 processes, {totals} "
           f"admitted, {sent} EVALSHA")  # fmt: skip
    assert sent < EXACT_N_CHECKS / 2
