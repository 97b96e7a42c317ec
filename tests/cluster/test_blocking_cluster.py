"""The blocking Redis Cluster client and moderato.sync.RateLimiter on a real 3-primary +
3-replica cluster, from threads: a cold script cache, and a slot migrating under
threaded traffic.

What both clients do alike (MOVED, ASK, TRYAGAIN; exact admission on every shard;
resets) is tested for both in tests/cluster/test_cluster.py, the tests that take ``kind``.
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
    cluster_client,
    identity_slot,
    primary_name,
    report,
    script_calls,
)

from moderato.algorithms import ALGORITHMS
from moderato.redis.blocking import ClusterClient
from moderato.scripts import load_script
from moderato.sync import RateLimiter

pytestmark = pytest.mark.slow

FIXED = load_script("fixed_window")


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


def test_slot_migration_under_threaded_traffic_stays_exact(own_cluster: RedisCluster) -> None:
    """Every algorithm on one hot identity while its slot moves: ASK, then MOVED; exact."""
    limit = 200
    rate = f"{limit}/day"
    identity = "hot"
    slot = identity_slot(identity)
    source, target = own_cluster.migration_ends(slot)
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
    moved_keys = own_cluster.migrate_under_traffic(slot, source, target)
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
