"""Redis Sentinel on real processes: one primary, one replica, three ``redis-server --sentinel``.

The failover test kills the primary under load and prints what it measured:
the outage, the time from the sentinels' promotion to the first decision on the
new primary, and what the replica had (not) received when the primary died.
docs/operations.md ("Deployments") records the figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from cluster import call, report, script_calls
from redis_servers import SentinelDeployment, free_port

from moderato import RateLimiter
from moderato.errors import BackendError
from moderato.redis import RedisClient, SentinelClient
from moderato.redis.errors import RedisClientError

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


# -- the failover ---------------------------------------------------------------------------


@dataclass
class Outcomes:
    """Per check: (time, outcome) with outcome allowed/denied/bypassed/BackendError."""

    records: list[tuple[float, str]] = field(default_factory=list)
    admitted: dict[str, int] = field(default_factory=dict)
    unexpected: list[BaseException] = field(default_factory=list)


async def _load(
    limiter: RateLimiter, identity: str, outcomes: Outcomes, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            result = await limiter.check_with_info(identity, LOAD_RATE)
        except BackendError:
            outcomes.records.append((time.monotonic(), "error"))
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
    except BackendError:
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
    watcher = RedisClient(f"redis://127.0.0.1:{servers.sentinels[0].port}")
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
        # the replica are lost: asynchronous replication's window.
        lost = 0
        for identity, admitted in closed_outcomes.admitted.items():
            usage = await closed.get_usage(identity, LOAD_RATE)
            lost += admitted - usage["current"]
        assert lost >= 0
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
