"""Redis Cluster: routing, exact admission across shards, migration and failover.

One 3-primary + 3-replica cluster serves the tests that leave it as they found
it; the ones that migrate slots or kill a primary build their own. Rates are
per day so that no window boundary falls inside a test.

The tests that take ``kind`` run the asyncio client and limiter and the blocking
ones (moderato.redis.blocking, moderato.sync) through the same steps: a blocking
call's reply is there at once, an asyncio one's awaited (``answer``); the blocking
client's own tests are in test_blocking_cluster.py.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from cluster import (
    CommandError,
    RedisCluster,
    Shard,
    call,
    cluster_client,
    identities_per_shard,
    identity_slot,
    primary_name,
    report,
    script_calls,
    slot_of,
)

from moderato import (
    BackendError,
    BackendUnavailableError,
    CheckResult,
    RateLimitConfigError,
    RateLimiter,
)
from moderato.algorithms import ALGORITHMS
from moderato.errors import RedisReplyError
from moderato.redis import ClusterClient
from moderato.redis.blocking import ClusterClient as BlockingClusterClient
from moderato.redis.cluster_map import command_slot, parse_shards, parse_slots
from moderato.redis.errors import RedisClientError
from moderato.sync import RateLimiter as BlockingRateLimiter

pytestmark = pytest.mark.slow

KINDS = ["asyncio", "blocking"]
CLIENTS = {"asyncio": ClusterClient, "blocking": BlockingClusterClient}
LIMITERS = {"asyncio": RateLimiter, "blocking": BlockingRateLimiter}


async def answer(reply: Any) -> Any:
    """A call's reply: awaited from the asyncio client or limiter, a blocking one's as it is."""
    return await reply if inspect.isawaitable(reply) else reply


async def at_once(
    limiter: RateLimiter | BlockingRateLimiter, checks: list[tuple[str, str, str]]
) -> list[CheckResult]:
    """check_with_info(identity, rate, algorithm=algorithm) for each (identity, rate,
    algorithm) at once: gathered on the asyncio limiter, over 16 threads on the blocking one."""
    if isinstance(limiter, BlockingRateLimiter):
        blocking = limiter
        with ThreadPoolExecutor(16) as pool:
            return list(
                pool.map(lambda c: blocking.check_with_info(c[0], c[1], algorithm=c[2]), checks)
            )
    return list(
        await asyncio.gather(*(limiter.check_with_info(i, r, algorithm=a) for i, r, a in checks))
    )


# -- wiring and routing ------------------------------------------------------------


async def test_cluster_url_selects_the_cluster_client(cluster: RedisCluster) -> None:
    limiter = RateLimiter(cluster.url, key_prefix="wire")
    client = cluster_client(limiter)
    await limiter.connect()
    assert sorted(client.primaries()) == sorted(primary_name(s.primary) for s in cluster.shards())
    for shard in cluster.shards():
        for start, end in shard.slots:
            assert client.node_for_slot(start) == client.node_for_slot(end)
            assert client.node_for_slot(start) == primary_name(shard.primary)
    await limiter.close()

    with pytest.raises(RateLimitConfigError, match="Redis Cluster has only database 0"):
        RateLimiter(cluster.url + "/1")
    with pytest.raises(RateLimitConfigError, match="use rediss\\+cluster://"):
        import ssl

        RateLimiter(cluster.url, ssl_context=ssl.create_default_context())


async def test_a_dead_seed_is_skipped(cluster: RedisCluster) -> None:
    port = cluster.servers[0].port
    client = ClusterClient.from_url(f"redis+cluster://127.0.0.1:1,127.0.0.1:{port}")
    await client.connect()
    assert len(client.primaries()) == 3
    assert await client.execute("SET", "{seed}:k", "v") == b"OK"
    assert await client.execute("GET", "{seed}:k") == b"v"
    await client.close()


async def test_unreachable_cluster_fails_within_the_timeout() -> None:
    client = ClusterClient.from_url("redis+cluster://127.0.0.1:1", command_timeout_s=0.2)
    started = time.perf_counter()
    with pytest.raises(RedisClientError, match="cannot load the Redis Cluster slot map"):
        await client.execute("GET", "k")
    assert time.perf_counter() - started < 0.4
    with pytest.raises(RedisClientError, match=r"127\.0\.0\.1:1\b"):
        await client.connect()
    await client.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stale_map_is_corrected_by_moved(cluster: RedisCluster, kind: str) -> None:
    client = CLIENTS[kind].from_url(cluster.url)
    await answer(client.connect())
    assert sorted(client.primaries()) == sorted(primary_name(s.primary) for s in cluster.shards())
    slot = slot_of("stale")
    owner = client.node_for_slot(slot)
    wrong = next(name for name in client.primaries() if name != owner)
    assert client._table is not None
    client._table[slot] = client._nodes[wrong]  # as if the slot had moved since
    assert await answer(client.execute("SET", "stale", "1")) == b"OK"
    assert client.counters.moved == 1
    assert client.node_for_slot(slot) == owner
    assert await answer(client.execute("GET", "stale")) == b"1"
    assert client.counters.moved == 1
    await answer(client.close())


def test_command_routing() -> None:
    assert command_slot(("GET", "{user1}:a")) == slot_of("user1")
    assert command_slot((b"set", b"plain", b"v")) == slot_of("plain")
    assert command_slot(("EVALSHA", "ab" * 20, 2, "{t}:a", "{t}:b", 1)) == slot_of("t")
    assert command_slot(("EVAL", "return 1", 0)) is None
    assert command_slot(("PING",)) is None
    assert command_slot(("CLUSTER", "SHARDS")) is None
    assert command_slot(("SCAN", 0, "MATCH", "p:*:{t:s:i}:*", "COUNT", 10)) == slot_of("t:s:i")
    for args, problem in [
        (("SCAN", 0), "no MATCH pattern"),
        (("SCAN", 0, "MATCH", "p:*"), "no {hash tag}"),
        (("SCAN", 0, "MATCH", "p:{t*}"), "not literal"),
    ]:
        with pytest.raises(RedisClientError, match=problem):
            command_slot(args)


async def test_cluster_slots_fallback_gives_the_same_map(cluster: RedisCluster) -> None:
    port = cluster.servers[0].port
    from_shards = parse_shards(call(port, "CLUSTER", "SHARDS"), "127.0.0.1", False)
    from_slots = parse_slots(call(port, "CLUSTER", "SLOTS"), "127.0.0.1")
    assert sorted(from_shards[0]) == sorted(from_slots[0])
    # CLUSTER SLOTS leaves out replicas that have replicated nothing yet; SHARDS
    # lists every node: all candidates for a map reload.
    assert set(from_slots[1]) <= set(from_shards[1])
    assert len(set(from_shards[1])) == 6


async def test_client_works_from_several_event_loops(cluster: RedisCluster) -> None:
    client = ClusterClient.from_url(cluster.url)

    async def roundtrip(value: str) -> Any:
        await client.execute("SET", "{loops}:k", value)
        return await client.execute("GET", "{loops}:k")

    assert await roundtrip("a") == b"a"
    # Another loop in another thread shares the slot map, not the connections.
    assert await asyncio.to_thread(asyncio.run, roundtrip("b")) == b"b"
    assert await roundtrip("c") == b"c"
    assert client.counters.refreshes == 1
    await client.close()


# -- exact admission across shards -----------------------------------------------------


# At once (at_once): the checks on the hot key, and on each of the 12 spread identities.
BURSTS = {"asyncio": (500, 60), "blocking": (300, 40)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_every_shard_admits_exactly_the_limit(
    cluster: RedisCluster, algorithm: str, kind: str
) -> None:
    """500 concurrent checks on one key admit 100; 12 identities on 3 shards, 60 checks
    each, admit 25 each (the blocking limiter over 16 threads: 300 and 40)."""
    hot_checks, per_identity = BURSTS[kind]
    # Exactness is under test, not the timeout: a burst on a loaded machine may
    # take longer than the default 0.5 s to be answered whole.
    limiter = LIMITERS[kind](
        cluster.url, key_prefix=f"exact-{kind}-{algorithm}", command_timeout_s=10.0
    )
    client = cluster_client(limiter)

    hot = await at_once(limiter, [("hot", "100/day", algorithm)] * hot_checks)
    assert sum(result.allowed for result in hot) == 100

    spread = identities_per_shard(cluster.shards(), 4)
    assert len(spread) == 3
    names = [name for group in spread.values() for name in group]
    calls = [name for name in names for _ in range(per_identity)]
    results = await at_once(limiter, [(name, "25/day", algorithm) for name in calls])
    admitted = Counter(name for name, result in zip(calls, results) if result.allowed)
    assert admitted == {name: 25 for name in names}
    for name in names:
        usage = await answer(limiter.get_usage(name, "25/day", algorithm=algorithm))
        assert (usage["current"], usage["remaining"]) == (25, 0)
    assert client.counters.moved == client.counters.ask == 0
    await answer(limiter.close())


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_multi_policy_decisions_on_every_shard(cluster: RedisCluster, algorithm: str) -> None:
    limiter = RateLimiter(cluster.url, key_prefix=f"multi-{algorithm}", command_timeout_s=10.0)
    for port, (name,) in identities_per_shard(cluster.shards(), 1, stem="multi").items():
        results = await asyncio.gather(
            *(
                limiter.check_with_info(name, "10/hour;30/day", algorithm=algorithm)
                for _ in range(50)
            )
        )
        assert sum(result.allowed for result in results) == 10, port
        usage = await limiter.get_usage(name, "10/hour;30/day", algorithm=algorithm)
        assert [p["current"] for p in usage["policies"]] == [10, 10]
        assert [p["remaining"] for p in usage["policies"]] == [0, 20]
    await limiter.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_reset_and_usage_on_every_shard(cluster: RedisCluster, kind: str) -> None:
    limiter = LIMITERS[kind](cluster.url, key_prefix=f"reset-{kind}")
    spread = identities_per_shard(cluster.shards(), 2, stem=f"reset-{kind}")
    for port, names in spread.items():
        for name in names:
            for algorithm in ALGORITHMS:
                for _ in range(3):
                    await answer(limiter.check(name, "10/day", algorithm=algorithm, scope="api"))
                usage = await answer(
                    limiter.get_usage(name, "10/day", algorithm=algorithm, scope="api")
                )
                assert usage["current"] == 3
        # With the rate: the keys are known, one script call on the owning shard.
        first, second = names
        assert await answer(limiter.reset(first, rate="10/day", scope="api")) >= len(ALGORITHMS)
        # Without it: SCAN on the one node that owns the identity's hash tag.
        assert await answer(limiter.reset(second, scope="api")) >= len(ALGORITHMS)
        for name in names:
            for algorithm in ALGORITHMS:
                usage = await answer(
                    limiter.get_usage(name, "10/day", algorithm=algorithm, scope="api")
                )
                assert usage["current"] == 0, (port, name, algorithm)
            slot = identity_slot(name, scope="api")
            assert call(port, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    # Every scope: no one slot, so every primary is walked.
    deleted = 0
    for names in spread.values():
        for name in names:
            await answer(limiter.check(name, "10/day", scope="a"))
            await answer(limiter.check(name, "10/day", scope="b"))
    for names in spread.values():
        for name in names:
            deleted += await answer(limiter.reset(name))
    assert deleted == 12
    await answer(limiter.close())


async def test_script_flush_on_every_primary_mid_load(cluster: RedisCluster) -> None:
    limiter = RateLimiter(cluster.url, key_prefix="flush", command_timeout_s=10.0)
    admin = ClusterClient.from_url(cluster.url)
    names = [
        n for group in identities_per_shard(cluster.shards(), 1, "flush").values() for n in group
    ]
    flushes = 0
    stop = asyncio.Event()

    async def flusher() -> None:
        nonlocal flushes
        while not stop.is_set():
            replies = await admin.execute_on_primaries("SCRIPT", "FLUSH")
            assert list(replies.values()) == [b"OK"] * 3
            flushes += 1
            await asyncio.sleep(0.005)

    flushing = asyncio.create_task(flusher())
    calls = [(name, algorithm) for name in names for algorithm in ALGORITHMS for _ in range(10)]
    admitted: Counter[tuple[str, str]] = Counter()
    for _ in range(8):
        results = await asyncio.gather(
            *(limiter.check_with_info(n, "50/day", algorithm=a) for n, a in calls)
        )  # any failure raises here
        admitted.update(call for call, result in zip(calls, results) if result.allowed)
    stop.set()
    await flushing
    report(f"cluster SCRIPT FLUSH x{flushes}: attempted {8 * len(calls)} / admitted "
           f"{sum(admitted.values())} / failed 0")  # fmt: skip
    assert flushes >= 5
    assert admitted == {(n, a): 50 for n in names for a in ALGORITHMS}
    await admin.close()
    await limiter.close()


async def test_a_cold_script_cache_under_a_burst_is_loaded_once_per_node(
    cluster: RedisCluster,
) -> None:
    """4,000 checks in flight over three primaries whose script caches are empty.

    Each node's connection loads the script once and re-sends each of its calls
    once, as EVALSHA: every check is decided, one identity gets exactly its
    limit. (A generous timeout: the counts are the test, not the machine's speed.)
    """
    burst, hot_limit = 4000, 3000
    limiter = RateLimiter(cluster.url, key_prefix="cold", command_timeout_s=10.0)
    primaries = [shard.primary for shard in cluster.shards()]
    owner = {}
    for shard in cluster.shards():
        for start, end in shard.slots:
            owner.update(dict.fromkeys(range(start, end + 1), shard.primary))
    try:
        await limiter.connect()
        for identities, rate in (
            ([f"user-{i}" for i in range(burst)], "10/day"),
            (["hot"] * burst, f"{hot_limit}/day"),
        ):
            for port in primaries:
                assert call(port, "SCRIPT", "FLUSH") == b"OK"
                assert call(port, "CONFIG", "RESETSTAT") == b"OK"
            outcomes = await asyncio.gather(
                *(limiter.check_with_info(identity, rate) for identity in identities),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            admitted = sum(1 for o in outcomes if not isinstance(o, BaseException) and o.allowed)
            report(f"cluster, cold script caches, {burst} concurrent checks at {rate} over "
                   f"{len(set(identities))} identities: admitted {admitted} / denied "
                   f"{burst - admitted - len(errors)} / failed {len(errors)}")  # fmt: skip
            assert errors == []
            per_node = Counter(owner[identity_slot(identity)] for identity in identities)
            for port in primaries:
                checks = per_node[port]
                assert script_calls(port) == {
                    "evalsha": (2 * checks, checks),
                    "eval": (0, 0),
                    "script|load": (1 if checks else 0, 0),
                }, port
            if len(set(identities)) == 1:
                assert admitted == hot_limit
                usage = await limiter.get_usage("hot", rate)
                assert (usage["current"], usage["remaining"]) == (hot_limit, 0)
            else:
                assert len(per_node) == len(primaries)  # the burst reached every node
                assert admitted == burst
        assert limiter.breaker.state == "closed"
        assert set(limiter._breakers.nodes().values()) <= {"closed"}
    finally:
        await limiter.close()


async def test_a_script_whose_reply_was_lost_is_not_retried(cluster: RedisCluster) -> None:
    """The script ran and charged, then its connection broke before the reply was read.

    Retrying it would charge the request twice: the caller gets the BackendError.
    (The break is made by hand, as a garbled reply stream would make it.)
    """
    limiter = RateLimiter(cluster.url, key_prefix="lost", connections_per_loop=1)
    client = cluster_client(limiter)
    await limiter.connect()
    slot = identity_slot("lost-1")
    owner = client.node_for_slot(slot)
    assert owner is not None
    port = int(owner.rpartition(":")[2])
    assert (await limiter.check_with_info("lost-1", "5/day")).remaining == 4
    connection = client.node_client(owner).connections()[0]
    assert connection.transport is not None
    connection.transport.pause_reading()  # the reply will wait unread in the socket
    check = asyncio.ensure_future(limiter.check_with_info("lost-1", "5/day"))
    key = next(k for k in call(port, "KEYS", "lost:fw:*"))
    for _ in range(200):
        await asyncio.sleep(0.005)
        if int(call(port, "GET", key)) == 2 * 1000:  # charged (costs travel scaled by 1000)
            break
    connection._abort(BackendError("test: the reply stream broke"))
    with pytest.raises(BackendError, match="test: the reply stream broke"):
        await check
    assert client.counters.lost_replies == 1
    assert client.counters.connection_errors == 0
    # Charged once, never twice; the next check sees exactly that.
    assert int(call(port, "GET", key)) == 2 * 1000
    assert (await limiter.check_with_info("lost-1", "5/day")).remaining == 2
    await limiter.close()


# -- resharding -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_plain_commands_follow_ask_tryagain_and_moved(
    own_cluster: RedisCluster, kind: str
) -> None:
    client = CLIENTS[kind].from_url(own_cluster.url, command_timeout_s=2.0)
    first, second = "{plain}:a", "{plain}:b"
    await answer(client.execute("SET", first, "1"))
    await answer(client.execute("SET", second, "2"))
    slot = slot_of(first)
    source, target = own_cluster.migration_ends(slot)

    own_cluster.begin_migration(slot, source, target)
    call(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", first)
    assert await answer(client.execute("GET", first)) == b"1"  # ASK: only the target has it
    assert await answer(client.execute("GET", second)) == b"2"  # still on the source
    assert client.counters.ask == 1

    # Half the keys moved: TRYAGAIN until the other half follows (from a thread: a
    # blocking client's MGET holds this one until it is answered).
    later = threading.Timer(
        0.2, call, (source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", second)
    )
    later.start()
    assert await answer(client.execute("MGET", first, second)) == [b"1", b"2"]
    later.join()
    assert client.counters.tryagain >= 1
    assert client.counters.ask == 2

    own_cluster.end_migration(slot, source, target)
    assert await answer(client.execute("GET", second)) == b"2"
    assert client.counters.moved == 1
    assert client.node_for_slot(slot) == primary_name(target)
    assert await answer(client.execute("GET", first)) == b"1"
    assert client.counters.moved == 1  # the map was updated: no second redirection

    with pytest.raises(RedisReplyError, match="CROSSSLOT"):
        await answer(client.execute("MGET", "a", "b"))
    await answer(client.close())


async def test_slot_migration_under_traffic_stays_exact(own_cluster: RedisCluster) -> None:
    """Every algorithm on one hot identity while its slot moves: ASK, then MOVED; exact count."""
    limit = 300
    rate = f"{limit}/day"
    identity = "hot"
    slot = identity_slot(identity)
    source, target = own_cluster.migration_ends(slot)
    limiter = RateLimiter(own_cluster.url, key_prefix="mig")
    client = cluster_client(limiter)
    await limiter.connect()

    phase = "before"
    admitted: Counter[tuple[str, str]] = Counter()
    attempted: Counter[str] = Counter()
    denied: Counter[str] = Counter()
    failures: list[BaseException] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():
            issued = phase
            batch = [algorithm for algorithm in ALGORITHMS for _ in range(2)]
            results = await asyncio.gather(
                *(limiter.check_with_info(identity, rate, algorithm=a) for a in batch),
                return_exceptions=True,
            )
            for algorithm, result in zip(batch, results):
                attempted[algorithm] += 1
                if isinstance(result, BaseException):
                    failures.append(result)
                elif result.allowed:
                    admitted[(algorithm, issued)] += 1
                else:
                    denied[algorithm] += 1
            await asyncio.sleep(0.005)

    def enter(new_phase: str) -> None:
        nonlocal phase
        phase = new_phase

    started = time.perf_counter()
    runner = asyncio.create_task(traffic())
    moved_keys = await asyncio.to_thread(
        own_cluster.migrate_under_traffic, slot, source, target, enter
    )
    while min(attempted[a] for a in ALGORITHMS) < limit + 300:
        await asyncio.sleep(0.02)
    stop.set()
    await runner
    elapsed = time.perf_counter() - started

    counters = client.counters
    total_admitted = sum(admitted.values())
    report(
        f"cluster slot migration: attempted {sum(attempted.values())} / admitted "
        f"{total_admitted} / denied {sum(denied.values())} / failed {len(failures)} "
        f"in {elapsed:.2f} s; {moved_keys} keys moved; ASK followed {counters.ask}, "
        f"ASK deferred {counters.ask_deferred}, MOVED {counters.moved}; admitted by phase "
        f"{dict(Counter(p for (_, p), n in admitted.items() for _ in range(n)))}"
    )
    assert not failures, failures[:3]
    for algorithm in ALGORITHMS:
        by_phase = {p: admitted[(algorithm, p)] for p in ("before", "migrating", "ask", "moved")}
        assert sum(by_phase.values()) == limit, (algorithm, by_phase)
        usage = await limiter.get_usage(identity, rate, algorithm=algorithm)
        assert usage["current"] == limit
    assert counters.ask > 0 and counters.ask_deferred > 0 and counters.moved > 0
    assert sum(admitted[(a, "ask")] for a in ALGORITHMS) > 0
    assert moved_keys >= len(ALGORITHMS)
    assert call(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert call(target, "CLUSTER", "COUNTKEYSINSLOT", slot) == moved_keys
    assert client.node_for_slot(slot) == primary_name(target)
    await limiter.close()


# -- failover -----------------------------------------------------------------------


async def test_primary_killed_replica_takes_over(own_cluster: RedisCluster) -> None:
    shards = own_cluster.shards()
    spread = {port: names[0] for port, names in identities_per_shard(shards, 1).items()}
    victim = shards[0].primary
    replica = shards[0].replicas[0]
    healthy = [shard.primary for shard in shards[1:]]
    # A command timeout well above a busy machine's stalls: the kill itself is seen at
    # once (the dead node's sockets are reset), and a check that merely ran late must
    # not be taken for a failover failure.
    limiter = RateLimiter(own_cluster.url, key_prefix="failover", command_timeout_s=2)
    client = cluster_client(limiter)
    await limiter.connect()

    log: list[tuple[float, int, str]] = []  # (when answered, shard, outcome)
    stop = asyncio.Event()

    async def traffic(port: int) -> None:
        # One loop per shard: a shard without a primary does not slow the others.
        while not stop.is_set():
            try:
                result = await limiter.check_with_info(spread[port], "1000000/day")
                outcome = "admitted" if result.allowed else "denied"
            except BackendError:
                outcome = "failed"
            log.append((time.monotonic(), port, outcome))
            await asyncio.sleep(0.005)

    runners = [asyncio.create_task(traffic(port)) for port in spread]
    watching = threading.Event()
    watcher = asyncio.ensure_future(
        asyncio.to_thread(watch_cluster_state, own_cluster, healthy, watching)
    )
    await asyncio.sleep(0.3)
    killed_at = time.monotonic()
    own_cluster.kill(victim)
    waited_s, forced = await asyncio.to_thread(own_cluster.failover, replica)
    promoted_at = time.monotonic()

    def recovered_at() -> float | None:
        return next(
            (t for t, p, o in log if p == victim and t > killed_at and o == "admitted"), None
        )

    deadline = time.monotonic() + 10
    while recovered_at() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.to_thread(own_cluster.wait_ok)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*runners)
    watching.set()
    changes = await watcher
    recovered = recovered_at()
    assert recovered is not None, "checks on the failed shard never resumed"
    # The healthy primaries answer CLUSTERDOWN (Redis's default full coverage) from
    # when they agree the victim failed until they learn of the promotion, which
    # gossip may bring them a little after the promoted replica is already serving.
    assert changes[-1][1], "the healthy primaries never said cluster_state:ok again"
    healthy_ok_at = changes[-1][0]

    outcomes = Counter(o for _, _, o in log)
    victim_failed = sum(1 for _, p, o in log if p == victim and o == "failed")
    others_failed = outcomes["failed"] - victim_failed
    report(
        f"cluster failover: attempted {len(log)} / admitted {outcomes['admitted']} / "
        f"denied {outcomes['denied']} / failed {outcomes['failed']} ({victim_failed} on the "
        f"killed shard, {others_failed} on the 2 healthy ones); replica promoted "
        f"{waited_s:.2f} s after the kill ({'TAKEOVER forced' if forced else 'automatic'}), "
        f"checks resumed {recovered - killed_at:.2f} s after the kill "
        f"({recovered - promoted_at:+.2f} s from the promotion); connection retries "
        f"{client.counters.connection_errors}, CLUSTERDOWN {client.counters.clusterdown}, "
        f"map loads {client.counters.refreshes}, breaker {limiter.breaker.state}"
    )
    assert client.node_for_slot(identity_slot(spread[victim])) == primary_name(replica)
    late_on_victim = [(t - recovered, o) for t, p, o in log if p == victim and t > recovered + 0.1]
    assert all(o == "admitted" for _, o in late_on_victim), late_on_victim
    failed_on_victim = [t for t, p, o in log if p == victim and o == "failed"]
    assert all(killed_at <= t <= recovered for t in failed_on_victim)
    failed_on_healthy = [t - killed_at for t, p, o in log if p != victim and o == "failed"]
    assert all(0 <= t <= healthy_ok_at - killed_at + 0.1 for t in failed_on_healthy), (
        failed_on_healthy,
        healthy_ok_at - killed_at,
    )
    assert recovered - promoted_at < 1.5  # the map reload, plus a breaker cool-down at most

    # Exact again on the promoted primary.
    fresh = identities_per_shard(own_cluster.shards(), 1, stem="after")[replica][0]
    results = await asyncio.gather(*(limiter.check_with_info(fresh, "50/day") for _ in range(200)))
    assert sum(r.allowed for r in results) == 50
    await limiter.close()


# -- full coverage: CLUSTERDOWN on every node until the promotion ----------------------


def watch_cluster_state(
    cluster: RedisCluster, ports: list[int], stop: threading.Event
) -> list[tuple[float, bool]]:
    """(when, every one of ``ports`` says cluster_state:ok) at each change, until ``stop``."""
    changes: list[tuple[float, bool]] = []
    while not stop.is_set():
        try:
            all_ok = all(cluster.info(port).get("cluster_state") == "ok" for port in ports)
        except (OSError, CommandError):
            all_ok = False
        if not changes or changes[-1][1] != all_ok:
            changes.append((time.monotonic(), all_ok))
        time.sleep(0.005)
    return changes


def shards_with_replicas(cluster: RedisCluster, timeout_s: float = 10.0) -> list[Shard]:
    """The shards once every primary lists its replica (gossip may still be settling)."""
    deadline = time.monotonic() + timeout_s
    while True:
        shards = cluster.shards()
        if len(shards) == cluster.primaries and all(shard.replicas for shard in shards):
            return shards
        assert time.monotonic() < deadline, f"replicas not listed: {shards}"
        time.sleep(0.05)


@pytest.mark.parametrize("full_coverage", ["yes", "no"])
async def test_a_dead_primary_opens_no_healthy_node_breaker(
    own_cluster: RedisCluster, full_coverage: str
) -> None:
    """SIGKILL one primary under concurrent traffic on every shard.

    With ``cluster-require-full-coverage yes`` (Redis's default) every node
    answers CLUSTERDOWN from the moment the failure is agreed until a replica
    is promoted: checks on the healthy shards fail then (CLUSTERDOWN, a
    503), but their nodes' breakers stay closed, so every check started once
    the cluster is ok again is decided. With ``no`` the healthy shards never
    notice. Either way each healthy identity is admitted exactly its limit.
    """
    for server in own_cluster.servers:
        call(server.port, "CONFIG", "SET", "cluster-require-full-coverage", full_coverage)
    shards = shards_with_replicas(own_cluster)
    workers = 6
    identities = identities_per_shard(shards, workers, stem=f"cov-{full_coverage}")
    victim, replica = shards[0].primary, shards[0].replicas[0]
    healthy = [shard.primary for shard in shards[1:]]
    limit = 150  # more than the checks before the kill: admissions go on during and after
    limiter = RateLimiter(own_cluster.url, key_prefix=f"cov-{full_coverage}", breaker_failures=3)
    client = cluster_client(limiter)
    await limiter.connect()

    # (started, port, identity, outcome): admitted, denied, clusterdown, breaker or other.
    log: list[tuple[float, int, str, str]] = []
    healthy_breakers_opened = 0
    stop = asyncio.Event()

    async def traffic(port: int, identity: str) -> None:
        nonlocal healthy_breakers_opened
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = await limiter.check_with_info(identity, f"{limit}/day")
                outcome = "admitted" if result.allowed else "denied"
            except BackendError as error:
                if str(error).startswith("CLUSTERDOWN"):
                    # An answer: never counted toward a breaker as a lost call would be.
                    assert not isinstance(error, BackendUnavailableError), error
                    outcome = "clusterdown"
                elif "circuit breaker" in str(error):
                    outcome = "breaker"
                else:
                    outcome = f"other: {error}"
            log.append((started, port, identity, outcome))
            states = limiter._breakers.nodes()
            healthy_breakers_opened += sum(
                states.get(primary_name(port), "closed") != "closed" for port in healthy
            )
            await asyncio.sleep(0.01)

    runners = [
        asyncio.create_task(traffic(port, identity))
        for port, names in identities.items()
        for identity in names
    ]
    watching = threading.Event()
    watcher = asyncio.ensure_future(
        asyncio.to_thread(watch_cluster_state, own_cluster, healthy, watching)
    )
    await asyncio.sleep(0.5)
    killed_at = time.monotonic()
    own_cluster.kill(victim)
    waited_s, forced = await asyncio.to_thread(own_cluster.failover, replica)
    promoted_at = time.monotonic()
    await asyncio.to_thread(own_cluster.wait_ok)
    await asyncio.sleep(1.5)
    # Until every healthy identity has been refused once (its limit reached), however slow.
    deadline = time.monotonic() + 60

    def all_denied() -> bool:
        denied = {who for _, _, who, outcome in log if outcome == "denied"}
        return all(name in denied for port in healthy for name in identities[port])

    while not all_denied():
        assert time.monotonic() < deadline, "some identity never reached its limit"
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*runners)
    watching.set()
    changes = await watcher
    charged = {
        identity: (await limiter.get_usage(identity, f"{limit}/day"))["current"]
        for port in healthy
        for identity in identities[port]
    }
    await limiter.close()

    down = [when for when, ok in changes if not ok and when > killed_at]
    ok_again_at = changes[-1][0]
    assert changes[-1][1]
    on_healthy = [entry for entry in log if entry[1] in healthy and entry[0] > killed_at]
    healthy_outcomes = Counter(outcome for *_, outcome in on_healthy)
    failed_after_ok = [
        entry
        for entry in on_healthy
        if entry[0] > ok_again_at and entry[3] not in ("admitted", "denied")
    ]
    victim_resumed_at = min(
        (
            started
            for started, port, _, outcome in log
            if port == victim and started > killed_at and outcome in ("admitted", "denied")
        ),
        default=None,
    )
    report(
        f"cluster-require-full-coverage {full_coverage}: primary killed, replica promoted "
        f"{waited_s:.2f} s later ({'TAKEOVER forced' if forced else 'automatic'}); healthy "
        f"nodes down {ok_again_at - down[0] if down else 0:.2f} s; "
        f"{sum(healthy_outcomes.values())} checks on the 2 healthy shards after the kill: "
        f"{dict(healthy_outcomes)}; CLUSTERDOWN replies {client.counters.clusterdown}; "
        f"killed shard resumed {victim_resumed_at - promoted_at if victim_resumed_at else -1:+.2f}"
        " s from the promotion"
    )
    # Nothing but CLUSTERDOWN (never a short circuit) on the healthy shards, no breaker
    # of theirs ever left closed, and nothing failed once the cluster was ok again.
    assert healthy_breakers_opened == 0
    assert set(healthy_outcomes) <= {"admitted", "denied", "clusterdown"}
    assert failed_after_ok == []
    if full_coverage == "yes":
        assert down and healthy_outcomes["clusterdown"] > 0
    else:
        assert not down and healthy_outcomes["clusterdown"] == 0
    # Exact on the healthy shards, outage or not: each identity that was denied had
    # been charged exactly its limit, and never admitted more. (A check whose reply
    # missed its deadline fails though its script ran: that one is charged.)
    for port in healthy:
        for identity in identities[port]:
            decided = Counter(o for _, _, who, o in log if who == identity)
            assert decided["denied"] > 0, (port, identity, decided)
            assert charged[identity] == limit, (port, identity, charged[identity])
            failed = decided["clusterdown"]
            assert limit - failed <= decided["admitted"] <= limit, (port, identity, decided)
    assert victim_resumed_at is not None
    assert victim_resumed_at - promoted_at < 1.5


# -- circuit breaker per node ---------------------------------------------------------


async def test_a_paused_primary_opens_only_its_own_breaker(own_cluster: RedisCluster) -> None:
    """SIGSTOP one primary: checks on the other primaries go on being decided exactly."""
    shards = own_cluster.shards()
    spread = {port: names[0] for port, names in identities_per_shard(shards, 1, "brk").items()}
    paused = shards[0].primary
    healthy = [shard.primary for shard in shards[1:]]
    limiter = RateLimiter(
        own_cluster.url,
        key_prefix="brk",
        command_timeout_s=0.25,
        breaker_failures=3,
        breaker_cooldown_s=1.0,
    )
    await limiter.connect()
    rate, limit, rounds = "15/day", 15, 20
    errors: list[str] = []
    healthy_admitted: Counter[int] = Counter()
    healthy_results = 0

    async def one_round() -> None:
        nonlocal healthy_results
        # Three on the paused primary: enough to open its breaker in the first round.
        ports = [paused, paused, paused, *healthy]
        outcomes = await asyncio.gather(
            *(limiter.check_with_info(spread[port], rate) for port in ports),
            return_exceptions=True,
        )
        for port, outcome in zip(ports, outcomes):
            if port == paused:
                assert isinstance(outcome, BackendError), outcome
                errors.append(str(outcome))
            else:
                assert not isinstance(outcome, BaseException), f"shard {port}: {outcome!r}"
                healthy_results += 1
                healthy_admitted[port] += outcome.allowed

    own_cluster.server(paused).pause()
    paused_at = time.monotonic()
    try:
        for _ in range(rounds):
            await one_round()
            await asyncio.sleep(0.02)
        paused_for = time.monotonic() - paused_at
    finally:
        own_cluster.server(paused).resume()
    # Well under cluster-node-timeout (1 s): no failover was started.
    assert paused_for < 0.9

    node = primary_name(paused)
    short_circuited = sum(f"circuit breaker for node {node} is open" in e for e in errors)
    report(
        f"cluster breaker per node: primary {node} SIGSTOPped {paused_for:.2f} s; "
        f"{healthy_results} checks on the 2 other primaries all decided, admitted "
        f"{dict(healthy_admitted)} (limit {limit} each); {len(errors)} failed on the paused "
        f"one ({short_circuited} short-circuited by its breaker)"
    )
    assert healthy_results == rounds * len(healthy)
    assert healthy_admitted == {port: limit for port in healthy}
    assert len(errors) == 3 * rounds
    assert short_circuited >= 3 * (rounds - 1)
    states = limiter._breakers.nodes()
    assert states[node] == "open"
    assert all(states[primary_name(port)] == "closed" for port in healthy)
    assert limiter.breaker.state == "closed"

    # Once the node answers again, a probe closes its breaker and it decides exactly.
    deadline = time.monotonic() + 5
    while True:
        try:
            result = await limiter.check_with_info(spread[paused], rate)
            break
        except BackendError:
            assert time.monotonic() < deadline, "the paused primary's checks never resumed"
            await asyncio.sleep(0.05)
    assert result.remaining == limit - 1
    assert limiter._breakers.nodes()[node] == "closed"
    await limiter.close()
