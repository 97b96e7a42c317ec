"""The blocking Redis Cluster client on a real 3-primary + 3-replica cluster.

The asyncio client's rules (tests/test_cluster.py), followed from threads:
MOVED, ASK, TRYAGAIN, a script whose reply was lost, a cold script cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from cluster import RedisCluster, call, script_calls, slot_of

from moderato.redis.blocking import ClusterClient
from moderato.redis.errors import RedisReplyError
from moderato.scripts import load_script

pytestmark = pytest.mark.slow

FIXED = load_script("fixed_window")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """The shared cluster: tests use their own keys and leave slots where they are."""
    shared = RedisCluster().start()
    try:
        yield shared
    finally:
        shared.close()


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    mine = RedisCluster().start()
    try:
        yield mine
    finally:
        mine.close()


def primary_name(port: int) -> str:
    return f"127.0.0.1:{port}"


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
