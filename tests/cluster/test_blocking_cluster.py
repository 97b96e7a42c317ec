"""The blocking Redis Cluster client and moderato.sync.RateLimiter on a real 3-primary +
3-replica cluster.

The asyncio client's rules (tests/cluster/test_cluster.py), followed from threads:
MOVED, ASK, TRYAGAIN, a cold script cache; exact admission on every shard,
resets, and a slot migrating under threaded traffic.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from cluster import (
    RedisCluster,
    call,
    identities_per_shard,
    identity_slot,
    primary_name,
    report,
    script_calls,
    slot_of,
)

from moderato.algorithms import ALGORITHMS
from moderato.redis.blocking import ClusterClient
from moderato.redis.errors import RedisReplyError
from moderato.scripts import load_script
from moderato.sync import RateLimiter

pytestmark = pytest.mark.slow

FIXED = load_script("fixed_window")


def test_a_stale_map_is_corrected_by_moved(cluster: RedisCluster) -> None:
    client = ClusterClient.from_url(cluster.url)
    client.connect()
    assert sorted(client.primaries()) == sorted(primary_name(s.primary) for s in cluster.shards())
    slot = slot_of("stale")
    owner = client.node_for_slot(slot)
    wrong = next(name for name in client.primaries() if name != owner)
    assert client._table is not None
    client._table[slot] = client._nodes[wrong]  # as if the slot had moved since
    assert client.execute("SET", "stale", "1") == b"OK"
    assert client.counters.moved == 1
    assert client.node_for_slot(slot) == owner
    assert client.execute("GET", "stale") == b"1"
    assert client.counters.moved == 1
    client.close()


def test_scripts_on_every_shard_after_a_flush_load_once_per_connection(
    cluster: RedisCluster,
) -> None:
    client = ClusterClient.from_url(cluster.url, max_connections=2)
    keys = [f"sync:{{tag{n}}}:86400".encode() for n in range(30)]
    assert {client.node_for_key(key) for key in keys} == {None}  # no map yet
    for key in keys:
        assert client.evalsha(FIXED, [key], [1000, 1, 100_000, 86_400])[0] == 1
    assert len({client.node_for_key(key) for key in keys}) == 3
    client.execute_on_primaries("SCRIPT", "FLUSH")
    for shard in cluster.shards():
        call(shard.primary, "CONFIG", "RESETSTAT")
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(
                lambda n: client.evalsha(FIXED, [keys[n % 30]], [1000, 1, 100_000, 86_400]),
                range(600),
            )
        )
    assert all(reply[0] == 1 for reply in replies)
    loads = 0
    for shard in cluster.shards():
        stats = script_calls(shard.primary)
        assert 1 <= stats["script|load"][0] <= 2  # one per connection that met NOSCRIPT
        assert stats["eval"] == (0, 0)
        loads += stats["script|load"][0]
    total_calls = sum(script_calls(s.primary)["evalsha"][0] for s in cluster.shards())
    assert total_calls == 600 + loads
    client.close()


def test_plain_commands_follow_ask_tryagain_and_moved(own_cluster: RedisCluster) -> None:
    client = ClusterClient.from_url(own_cluster.url, command_timeout_s=2.0)
    first, second = "{plain}:a", "{plain}:b"
    client.execute("SET", first, "1")
    client.execute("SET", second, "2")
    slot = slot_of(first)
    source = own_cluster.owner(slot)
    target = next(s.primary for s in own_cluster.shards() if s.primary != source)

    own_cluster.begin_migration(slot, source, target)
    call(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", first)
    assert client.execute("GET", first) == b"1"  # ASK: only the target has it
    assert client.execute("GET", second) == b"2"  # still on the source
    assert client.counters.ask == 1

    # Half the keys moved: TRYAGAIN until the other half follows.
    later = threading.Timer(
        0.2, call, (source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", second)
    )
    later.start()
    assert client.execute("MGET", first, second) == [b"1", b"2"]
    later.join()
    assert client.counters.tryagain >= 1
    assert client.counters.ask == 2

    own_cluster.end_migration(slot, source, target)
    assert client.execute("GET", second) == b"2"
    assert client.counters.moved == 1
    assert client.node_for_slot(slot) == primary_name(target)
    assert client.execute("GET", first) == b"1"
    assert client.counters.moved == 1  # the map was updated: no second redirection

    with pytest.raises(RedisReplyError, match="CROSSSLOT"):
        client.execute("MGET", "a", "b")
    client.close()


def cluster_client(limiter: RateLimiter) -> ClusterClient:
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert isinstance(client, ClusterClient)
    return client


# -- the blocking RateLimiter -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_every_shard_admits_exactly_the_limit(cluster: RedisCluster, algorithm: str) -> None:
    """16 threads: 300 checks on one key admit 100; 12 identities on 3 shards admit 25 each."""
    limiter = RateLimiter(cluster.url, key_prefix=f"sync-exact-{algorithm}")
    with ThreadPoolExecutor(16) as pool:
        hot = list(
            pool.map(
                lambda _: limiter.check_with_info("hot", "100/day", algorithm=algorithm),
                range(300),
            )
        )
        assert sum(result.allowed for result in hot) == 100
        spread = identities_per_shard(cluster.shards(), 4, stem="sync")
        names = [name for group in spread.values() for name in group]
        calls = [name for name in names for _ in range(40)]
        results = list(
            pool.map(
                lambda name: limiter.check_with_info(name, "25/day", algorithm=algorithm), calls
            )
        )
    admitted = Counter(name for name, result in zip(calls, results) if result.allowed)
    assert admitted == {name: 25 for name in names}
    for name in names:
        usage = limiter.get_usage(name, "25/day", algorithm=algorithm)
        assert (usage["current"], usage["remaining"]) == (25, 0)
    client = cluster_client(limiter)
    assert client.counters.moved == client.counters.ask == 0
    limiter.close()


def test_reset_and_usage_on_every_shard(cluster: RedisCluster) -> None:
    limiter = RateLimiter(cluster.url, key_prefix="sync-reset")
    spread = identities_per_shard(cluster.shards(), 2, stem="sync-reset")
    for port, names in spread.items():
        for name in names:
            for algorithm in ALGORITHMS:
                for _ in range(3):
                    limiter.check(name, "10/day", algorithm=algorithm, scope="api")
        first, second = names
        assert limiter.reset(first, rate="10/day", scope="api") >= len(ALGORITHMS)
        assert limiter.reset(second, scope="api") >= len(ALGORITHMS)  # SCAN on its node
        for name in names:
            for algorithm in ALGORITHMS:
                usage = limiter.get_usage(name, "10/day", algorithm=algorithm, scope="api")
                assert usage["current"] == 0, (port, name, algorithm)
            assert call(port, "CLUSTER", "COUNTKEYSINSLOT", identity_slot(name, scope="api")) == 0
    # Every scope: no one slot, so every primary is walked.
    for names in spread.values():
        for name in names:
            limiter.check(name, "10/day", scope="a")
            limiter.check(name, "10/day", scope="b")
    assert sum(limiter.reset(name) for names in spread.values() for name in names) == 12
    limiter.close()


def test_slot_migration_under_threaded_traffic_stays_exact(own_cluster: RedisCluster) -> None:
    """Every algorithm on one hot identity while its slot moves: ASK, then MOVED; exact."""
    limit = 200
    rate = f"{limit}/day"
    identity = "hot"
    slot = identity_slot(identity)
    source = own_cluster.owner(slot)
    target = next(s.primary for s in own_cluster.shards() if s.primary != source)
    limiter = RateLimiter(own_cluster.url, key_prefix="sync-mig", command_timeout_s=2.0)
    client = cluster_client(limiter)
    limiter.connect()

    admitted: Counter[str] = Counter()
    attempted: Counter[str] = Counter()
    failures: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def traffic(algorithm: str) -> None:
        while not stop.is_set():
            try:
                allowed = limiter.check_with_info(identity, rate, algorithm=algorithm).allowed
            except Exception as error:  # reported: no check may fail
                with lock:
                    failures.append(error)
                continue
            with lock:
                attempted[algorithm] += 1
                admitted[algorithm] += allowed
            time.sleep(0.002)

    threads = [
        threading.Thread(target=traffic, args=(algorithm,), daemon=True)
        for algorithm in ALGORITHMS
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.25)
    own_cluster.begin_migration(slot, source, target)
    time.sleep(0.15)  # ASK answered while the source still holds the keys: scripts wait
    moved_keys = own_cluster.move_keys(slot, source, target)
    time.sleep(0.3)  # the source is drained: ASK is followed to the target
    own_cluster.end_migration(slot, source, target)
    deadline = time.monotonic() + 60
    while min(attempted[a] for a in ALGORITHMS) < limit + 200:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stop.set()
    for thread in threads:
        thread.join(10)

    counters = client.counters
    report(
        f"blocking cluster slot migration: attempted {sum(attempted.values())} / admitted "
        f"{sum(admitted.values())} / failed {len(failures)}; {moved_keys} keys moved; ASK "
        f"followed {counters.ask}, deferred {counters.ask_deferred}, MOVED {counters.moved}"
    )
    assert failures == []
    assert admitted == dict.fromkeys(ALGORITHMS, limit)
    for algorithm in ALGORITHMS:
        assert limiter.get_usage(identity, rate, algorithm=algorithm)["current"] == limit
    assert counters.ask > 0 and counters.ask_deferred > 0 and counters.moved > 0
    assert call(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert client.node_for_slot(slot) == primary_name(target)
    limiter.close()
