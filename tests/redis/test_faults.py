"""Fault tests on real single-node servers: crash and restart, SIGSTOP, a full Redis, SCRIPT FLUSH.

Each test drives a bounded load (a few hundred checks a second for a few
seconds), injects one fault, asserts exact outcomes and prints a one-line
summary (attempted / admitted / denied / failed / recovery); set
MODERATO_FAULT_REPORT=<file> to collect the lines.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import hiredis
import pytest
from cluster import call, report, script_calls
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer

from moderato import BackendError, RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisClient

pytestmark = pytest.mark.slow


# moderato.metrics caches collectors by (namespace, id(registry)) without keeping the
# registry alive: a new registry may reuse a collected one's id and inherit its stale
# collectors. Keeping every test's registry alive keeps the ids distinct.
_REGISTRIES: list[CollectorRegistry] = []


def registry_for_test() -> CollectorRegistry:
    registry = CollectorRegistry()
    _REGISTRIES.append(registry)
    return registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@dataclass
class Record:
    issued: float
    answered: float
    outcome: str  # admitted, denied, bypassed, failed
    error: str = ""


class Load:
    """Fires ``per_tick`` checks every ``tick_s`` without waiting for answers (open loop)."""

    def __init__(self, limiter: RateLimiter, identity: str, rate: str, per_tick: int = 3,
                 tick_s: float = 0.01) -> None:  # fmt: skip
        self.limiter = limiter
        self.identity = identity
        self.rate = rate
        self.per_tick = per_tick
        self.tick_s = tick_s
        self.records: list[Record] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _one(self) -> None:
        issued = time.monotonic()
        try:
            result = await self.limiter.check_with_info(self.identity, self.rate)
        except BackendError as error:
            self.records.append(Record(issued, time.monotonic(), "failed", str(error)))
            return
        outcome = "bypassed" if result.bypassed else "admitted" if result.allowed else "denied"
        self.records.append(Record(issued, time.monotonic(), outcome))

    async def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._tasks.extend(asyncio.create_task(self._one()) for _ in range(self.per_tick))
            next_at += self.tick_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._runner = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        assert self._runner is not None
        await self._runner
        await asyncio.gather(*self._tasks)

    def count(self, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
        return Counter(r.outcome for r in self.records if since <= r.issued < until)

    def summary(self) -> str:
        counts = self.count()
        return (
            f"attempted {len(self.records)} / admitted {counts['admitted']} / denied "
            f"{counts['denied']} / bypassed {counts['bypassed']} / failed {counts['failed']}"
        )


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    server = RedisServer(
        extra_args=("--maxmemory", "2mb", "--maxmemory-policy", "noeviction")
    ).start()
    try:
        yield server
    finally:
        server.close()


# -- Redis killed and restarted -------------------------------------------------------


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail_closed", "fail_open"])
async def test_redis_killed_and_restarted_under_load(
    own_redis_server: RedisServer, fail_open: bool
) -> None:
    limit = 100
    registry = registry_for_test()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="kill",
        fail_open=fail_open,
        enable_metrics=True,
        metrics_registry=registry,
        # A killed server resets its connections and a stopped one refuses new ones,
        # both at once: a longer command timeout only keeps a busy machine's late
        # reply from being counted as a failure outside the outage.
        command_timeout_s=2,
    )
    await limiter.connect()
    load = Load(limiter, "victim", f"{limit}/day")  # 300 checks/s
    load.start()
    await asyncio.sleep(1.2)
    killed_at = time.monotonic()
    own_redis_server.stop()  # SIGKILL: no goodbye to the clients
    await asyncio.sleep(0.5)
    await asyncio.to_thread(own_redis_server.start)  # empty: no persistence
    returned_at = time.monotonic()
    await asyncio.sleep(max(0.0, killed_at + 3.0 - time.monotonic()))
    await load.stop()
    await limiter.close()

    decided = ("admitted", "denied")
    back = min(
        (r.answered for r in load.records if r.issued >= returned_at and r.outcome in decided),
        default=None,
    )
    assert back is not None, "no decision after Redis returned"
    recovery_s = back - returned_at
    report(
        f"kill+restart ({'fail-open' if fail_open else 'fail-closed'}): {load.summary()}; "
        f"outage {returned_at - killed_at:.2f} s; decisions back {recovery_s:.2f} s after "
        f"Redis returned"
    )

    # Answered before the kill: a check still in flight when the server died fails (or
    # is bypassed) however early it was issued, and a busy machine leaves more in flight.
    before = Counter(r.outcome for r in load.records if r.answered < killed_at)
    assert before["admitted"] == limit and before["failed"] == before["bypassed"] == 0
    # While Redis is down nothing is decided: an error, or a bypass under fail-open.
    down = load.count(since=killed_at + 0.01, until=returned_at)
    assert down["admitted"] == down["denied"] == 0
    if fail_open:
        assert down["bypassed"] > 0 and load.count()["failed"] == 0
        bypassed = load.count()["bypassed"]
        assert sample(registry, "moderato_fail_open_total", algorithm="fixed_window") == bypassed
        assert (
            sample(registry, "moderato_checks_total", algorithm="fixed_window", result="bypassed")
            == bypassed
        )
    else:
        assert down["failed"] > 0 and load.count()["bypassed"] == 0
        assert all(
            "circuit breaker" in r.error or "127.0.0.1" in r.error
            for r in load.records
            if r.outcome == "failed"
        )
    assert recovery_s < 1.0
    # The restarted server is empty: exactly one more limit, never more.
    after = load.count(since=returned_at)
    assert after["admitted"] == limit
    assert all(r.outcome in decided for r in load.records if r.issued > back + 0.01)


# -- Redis paused ------------------------------------------------------------------------


async def test_redis_sigstopped_checks_stay_bounded(own_redis_server: RedisServer) -> None:
    timeout_s = 0.2
    cooldown_s = 0.5
    registry = registry_for_test()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="stop",
        command_timeout_s=timeout_s,
        breaker_failures=5,
        breaker_cooldown_s=cooldown_s,
        enable_metrics=True,
        metrics_registry=registry,
    )
    await limiter.connect()
    states: list[tuple[float, str]] = []

    async def watch_breaker() -> None:
        while True:
            if not states or states[-1][1] != limiter.breaker.state:
                states.append((time.monotonic(), limiter.breaker.state))
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch_breaker())
    load = Load(limiter, "paused", "1000/day", per_tick=2)  # 200 checks/s
    load.start()
    await asyncio.sleep(0.5)
    paused_at = time.monotonic()
    own_redis_server.pause()
    try:
        await asyncio.sleep(1.2)
    finally:
        own_redis_server.resume()
    resumed_at = time.monotonic()
    await asyncio.sleep(1.5)
    await load.stop()
    watcher.cancel()
    await limiter.close()

    slowest = max(r.answered - r.issued for r in load.records)
    back = min(
        r.answered for r in load.records if r.issued >= resumed_at and r.outcome == "admitted"
    )
    opened = [t for t, state in states if state == "open" and paused_at <= t <= resumed_at]
    closed = [t for t, state in states if state == "closed" and t > resumed_at]
    short_circuited = sample(
        registry, "moderato_backend_operations_total", operation="decide", status="short_circuited"
    )
    report(
        f"SIGSTOP {resumed_at - paused_at:.1f} s: {load.summary()}; slowest answer "
        f"{slowest * 1000:.0f} ms (timeout {timeout_s * 1000:.0f} ms); breaker opened "
        f"{(opened[0] - paused_at) if opened else float('nan'):.2f} s after SIGSTOP, "
        f"{short_circuited:.0f} checks short-circuited; decisions back "
        f"{back - resumed_at:.2f} s after SIGCONT, breaker closed "
        f"{(closed[0] - resumed_at) if closed else float('nan'):.2f} s after SIGCONT"
    )
    assert slowest < timeout_s + 0.1  # timer granularity and a busy machine
    assert opened, states
    assert short_circuited > 0
    assert closed and closed[0] - resumed_at < cooldown_s + timeout_s + 0.1, states
    assert states[-1][1] == "closed"
    during = load.count(since=paused_at + timeout_s, until=resumed_at)
    assert during["admitted"] == during["denied"] == 0
    assert all(r.outcome == "admitted" for r in load.records if r.issued > back + 0.01)
    assert load.count()["admitted"] <= 1000


# -- Redis out of memory ---------------------------------------------------------------


class JunkWriter:
    """One connection that fills Redis with junk until even a 1-byte SET is refused (OOM).

    It stays open until closed: Redis counts each client's buffers in its
    memory, so a writer that disconnected would leave room behind it. A refused
    big value proves little on its own (its query buffer may be what crossed
    the limit), so the values shrink until a tiny one is refused too.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = hiredis.Reader()

    def command(self, *args: str) -> object:
        self.sock.sendall(_accel.encode_command(*args))
        while True:
            reply = self.reader.gets()
            if reply is not False:
                return reply
            self.reader.feed(self.sock.recv(65536))

    def fill(self) -> int:
        written = 0
        size = 16384
        while written < 100_000:
            reply = self.command("SET", f"junk:{written}", "x" * size)
            if isinstance(reply, hiredis.ReplyError):
                assert "OOM" in str(reply), reply
                if size == 1:
                    return written
                size = max(1, size // 8)
            else:
                written += 1
        raise AssertionError("maxmemory was never reached")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("fail_open", [False, True], ids=["fail_closed", "fail_open"])
async def test_full_redis_never_allows_silently(
    full_redis: RedisServer, fail_open: bool, algorithm: str
) -> None:
    registry = registry_for_test()
    limiter = RateLimiter(
        full_redis.url,
        key_prefix="oom",
        fail_open=fail_open,
        enable_metrics=True,
        metrics_registry=registry,
        breaker_failures=1000,  # every check must reach Redis and be refused by it
    )
    # The script cached while there is room, as in a running application.
    assert await limiter.check("warm", "10/day", algorithm=algorithm)
    writer = JunkWriter(full_redis.port)
    junk_keys = writer.fill()
    # Full to the last byte is an edge: Redis shrinking a client's buffers in its
    # cron frees a few kilobytes, and then one write fits again. Full is meant
    # here, so the limit drops far below what is used until the test is done.
    assert writer.command("CONFIG", "SET", "maxmemory", "1") == b"OK"

    outcomes: Counter[str] = Counter()
    errors: set[str] = set()
    attempted = 20
    for index in range(attempted):
        try:
            result = await limiter.check_with_info(f"fresh-{index}", "10/day", algorithm=algorithm)
        except BackendError as error:
            outcomes["failed"] += 1
            errors.add(str(error)[:40])
            continue
        outcomes["bypassed" if result.bypassed else "admitted" if result.allowed else "denied"] += 1

    assert writer.command("CONFIG", "SET", "maxmemory", "2mb") == b"OK"
    writer.close()
    call(full_redis.port, "FLUSHALL")
    started = time.monotonic()
    result = await limiter.check_with_info("fresh-0", "10/day", algorithm=algorithm)
    recovery_s = time.monotonic() - started
    await limiter.close()
    report(
        f"maxmemory noeviction, {algorithm} ({'fail-open' if fail_open else 'fail-closed'}): "
        f"attempted {attempted} / admitted {outcomes['admitted']} / denied "
        f"{outcomes['denied']} / bypassed {outcomes['bypassed']} / failed {outcomes['failed']} "
        f"after {junk_keys} junk keys; after FLUSHALL the next check is decided in "
        f"{recovery_s * 1000:.1f} ms"
    )
    assert outcomes["admitted"] == outcomes["denied"] == 0
    if fail_open:
        assert outcomes["bypassed"] == attempted
        assert sample(registry, "moderato_fail_open_total", algorithm=algorithm) == attempted
        assert (
            sample(registry, "moderato_checks_total", algorithm=algorithm, result="bypassed")
            == attempted
        )
    else:
        assert outcomes["failed"] == attempted
        assert all("OOM command not allowed" in error for error in errors), errors
    assert result.allowed and not result.bypassed and result.remaining == 9


# -- scripts flushed under load -----------------------------------------------------------


async def test_script_flush_mid_load_fails_no_check(own_redis_server: RedisServer) -> None:
    limit = 200
    limiter = RateLimiter(own_redis_server.url, key_prefix="flush")
    admin = RedisClient(own_redis_server.url)
    flushes = 0
    stop = asyncio.Event()

    async def flusher() -> None:
        nonlocal flushes
        while not stop.is_set():
            assert await admin.execute("SCRIPT", "FLUSH") == b"OK"
            flushes += 1
            await asyncio.sleep(0.003)

    flushing = asyncio.create_task(flusher())
    outcomes: Counter[tuple[str, str]] = Counter()
    started = time.monotonic()
    rounds = 0
    # At least 20 rounds, and on until 50 flushes fell among them (bounded).
    while rounds < 20 or (flushes < 50 and rounds < 500):
        rounds += 1
        batch = [algorithm for algorithm in ALGORITHMS for _ in range(30)]
        results = await asyncio.gather(
            *(limiter.check_with_info("flushed", f"{limit}/day", algorithm=a) for a in batch),
            return_exceptions=True,
        )
        for algorithm, result in zip(batch, results):
            if isinstance(result, BaseException):
                outcomes[(algorithm, "failed")] += 1
            else:
                outcomes[(algorithm, "admitted" if result.allowed else "denied")] += 1
        await asyncio.sleep(0.005)
    elapsed = time.monotonic() - started
    stop.set()
    await flushing
    await admin.close()
    await limiter.close()

    total = Counter({kind: 0 for kind in ("admitted", "denied", "failed")})
    for (_, kind), count in outcomes.items():
        total[kind] += count
    report(
        f"SCRIPT FLUSH x{flushes} in {elapsed:.2f} s: attempted {sum(total.values())} / "
        f"admitted {total['admitted']} / denied {total['denied']} / failed {total['failed']}"
    )
    assert flushes >= 50
    assert total["failed"] == 0
    for algorithm in ALGORITHMS:
        assert outcomes[(algorithm, "admitted")] == limit
        assert outcomes[(algorithm, "denied")] == rounds * 30 - limit


COLD_BURST = 4000
HOT_LIMIT = 3000


async def test_a_cold_script_cache_under_a_burst_is_decided_like_a_warm_one(
    own_redis_server: RedisServer,
) -> None:
    """4,000 checks in flight when the script cache is empty: all answered NOSCRIPT.

    The connection loads the script once and re-sends each call once, as
    EVALSHA: every check is decided, one identity gets exactly its limit, and
    Redis sees one SCRIPT LOAD, no EVAL. (A generous timeout: the counts are
    the test, not the machine's speed.)
    """
    port = own_redis_server.port
    limiter = RateLimiter(own_redis_server.url, key_prefix="cold", command_timeout_s=10.0)
    try:
        assert (await limiter.check_with_info("warm-up", "1/day")).allowed
        for identities, rate in (
            ([f"user-{i}" for i in range(COLD_BURST)], "10/day"),
            (["hot"] * COLD_BURST, f"{HOT_LIMIT}/day"),
        ):
            assert call(port, "SCRIPT", "FLUSH") == b"OK"
            assert call(port, "CONFIG", "RESETSTAT") == b"OK"
            outcomes = await asyncio.gather(
                *(limiter.check_with_info(identity, rate) for identity in identities),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            admitted = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.allowed)
            report(f"cold script cache, {COLD_BURST} concurrent checks at {rate} over "
                   f"{len(set(identities))} identities: admitted {admitted} / denied "
                   f"{COLD_BURST - admitted - len(errors)} / failed {len(errors)}")  # fmt: skip
            assert errors == []
            # Each call answered NOSCRIPT once, then re-sent once behind the one load.
            assert script_calls(port) == {
                "evalsha": (2 * COLD_BURST, COLD_BURST),
                "eval": (0, 0),
                "script|load": (1, 0),
            }
            if len(set(identities)) == 1:
                assert admitted == HOT_LIMIT
                usage = await limiter.get_usage("hot", rate)
                assert (usage["current"], usage["remaining"]) == (HOT_LIMIT, 0)
            else:
                assert admitted == COLD_BURST
        assert limiter.breaker.state == "closed"
    finally:
        await limiter.close()


# -- min-replicas-to-write ------------------------------------------------------------


async def test_min_replicas_to_write_stops_charges_when_the_replica_stalls() -> None:
    """What docs/operations.md says min-replicas-to-write buys: a stalled replica stops
    the primary accepting charges after about min-replicas-max-lag seconds, so checks
    fail (and charge nothing) instead of piling up charges a failover would lose."""
    primary = RedisServer(
        extra_args=(
            "--min-replicas-to-write", "1",
            "--min-replicas-max-lag", "1",
            "--repl-diskless-sync-delay", "0",
        )
    ).start()  # fmt: skip
    replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    limiter = RateLimiter(primary.url, key_prefix="minrep", breaker_failures=1000)
    try:
        replica.start()
        deadline = time.monotonic() + 10
        while b"master_link_status:up" not in replica.command("INFO", "replication"):
            assert time.monotonic() < deadline, "the replica never synced"
            await asyncio.sleep(0.05)
        admitted = failed = 0
        while True:  # until the primary has seen its replica acknowledge
            try:
                await limiter.check_with_info("u", "1000000/day")
                admitted += 1
                break
            except BackendError as error:
                assert "NOREPLICAS" in str(error)
                assert time.monotonic() < deadline, "the primary never accepted writes"
                await asyncio.sleep(0.05)

        replica.pause()
        stalled_at = time.monotonic()
        refused_after: float | None = None
        errors: set[str] = set()
        while time.monotonic() - stalled_at < 4.0:
            try:
                result = await limiter.check_with_info("u", "1000000/day")
                assert result.allowed
                admitted += 1
            except BackendError as error:
                failed += 1
                errors.add(str(error))
                if refused_after is None:
                    refused_after = time.monotonic() - stalled_at
            await asyncio.sleep(0.01)
        replica.resume()
        report(
            f"min-replicas-to-write 1 / max-lag 1 s: replica SIGSTOPped, charges refused "
            f"after {refused_after} s; {admitted} admitted, {failed} failed ({errors})"
        )
        assert refused_after is not None and 0.9 <= refused_after <= 3.0
        assert errors and all("NOREPLICAS Not enough good replicas" in e for e in errors)
        # A refused check charged nothing: the counter holds exactly the admissions.
        usage = await limiter.get_usage("u", "1000000/day")
        assert usage["current"] == admitted
    finally:
        replica.resume()
        await limiter.close()
        replica.close()
        primary.close()
