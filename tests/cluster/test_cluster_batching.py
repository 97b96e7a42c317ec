"""Batched decisions on a Redis Cluster (issue 30, the cluster step): a node joins a loop
turn's checks across the slots it serves into one call (moderato/redis/grouping.py,
``group_node_checks``); a batch Redis refuses before running (MOVED, ASK, a slot no longer
served) is split and each check sent alone; every decision made exactly once; 4 processes
x 125 tasks on one key admit exactly the limit while its slot migrates back and forth.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from batching_helpers import (
    ARGS,
    EXACT_N_CHECKS,
    errors,
    evalsha_calls,
    exact_n_admitted,
    repeats_per_call,
    reset_stats,
)
from cluster import (
    RedisCluster,
    call,
    identities_per_shard,
    identity_slot,
    report,
    script_calls,
    slot_of,
)

from moderato import RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.redis import ClusterClient
from moderato.redis.grouping import cluster_batched_script
from moderato.scripts import batched_script, load_script

pytestmark = pytest.mark.slow

# The module's cluster (tests/cluster/conftest.py): 3 primaries, no replicas; the tests
# here move slots and leave them moved.
CLUSTER_REPLICAS = 0


def base_key(identity: str, prefix: str) -> str:
    """The base key moderato builds for ``identity`` (its slot is the identity's)."""
    return str(_accel.build_keys(prefix, "fw", "", "global", identity, (60,))[0])


def counter(cluster: RedisCluster, key: str) -> int:
    """A fixed window key's counter (its one state key, ``<base>:<window index>``)."""
    port = cluster.owner(slot_of(key))
    state = call(port, "KEYS", f"{key}:*")
    assert len(state) == 1, state
    return int(call(port, "GET", state[0]))


def expected_remaining(algorithm: str, used: int) -> int:
    """What a check's reply says is left of 100 requests after ``used`` admissions."""
    del algorithm
    return 100_000 - used * 1000


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_one_call_per_node_joins_checks_of_several_slots(
    cluster: RedisCluster, algorithm: str
) -> None:
    """8 identities on each primary, each in its own slot, 3 checks each in one turn:
    one call per node per 16 checks, and each reply the one a check alone would get."""
    script = load_script(algorithm)
    client = ClusterClient.from_url(cluster.url, batch_decisions=True, command_timeout_s=5)
    try:
        await client.connect()
        by_node = identities_per_shard(cluster.shards(), 8, stem=f"several-{algorithm}")
        keys = [base_key(name, "several") for names in by_node.values() for name in names]
        for names in by_node.values():
            assert len({identity_slot(name) for name in names}) > 1
        reset_stats(cluster)
        rounds = 3
        calls = [key for _ in range(rounds) for key in keys]  # one turn, keys interleaved
        replies = await asyncio.gather(
            *(client.evalsha(script, [key], ARGS[algorithm]) for key in calls)
        )
        seen: dict[str, int] = {}
        for key, reply in zip(calls, replies):
            seen[key] = seen.get(key, 0) + 1
            assert reply[0] == 1, reply
            assert reply[2] == expected_remaining(algorithm, seen[key]), (key, reply)
        stats = {shard.primary: script_calls(shard.primary) for shard in cluster.shards()}
        sent = sum(stat["evalsha"][0] for stat in stats.values())
        # 24 checks a node: calls of at most the algorithm's batch_parts each (16: 2; the
        # sliding log's 8: 3; plus, the first time, a SCRIPT LOAD of each form used), not 24.
        assert sent == 3 * math.ceil(24 / ALGORITHMS[algorithm].batch_parts), stats
        assert all(stat["evalsha"][1] == 0 and stat["eval"][0] == 0 for stat in stats.values())
        assert client.counters.batch_splits == 0
        # The cluster form (the flag, several slots in one call) is what went.
        for shard in cluster.shards():
            exists = call(shard.primary, "SCRIPT", "EXISTS", cluster_batched_script(algorithm).sha)
            assert exists == [1]
    finally:
        await client.close()


async def test_one_slot_batch_is_the_plain_batched_script(cluster: RedisCluster) -> None:
    """Checks on one key (one slot) go as the batched script itself, every key declared."""
    script = load_script("fixed_window")
    client = ClusterClient.from_url(cluster.url, batch_decisions=True, command_timeout_s=5)
    try:
        await client.connect()
        key = base_key("one-slot", "plain")
        owner = cluster.owner(slot_of(key))
        call(owner, "SCRIPT", "FLUSH")
        reset_stats(cluster)
        replies = await asyncio.gather(
            *(client.evalsha(script, [key], ARGS["fixed_window"]) for _ in range(40))
        )
        assert sorted(reply[2] for reply in replies) == [
            expected_remaining("fixed_window", used) for used in range(40, 0, -1)
        ]
        # One call: a check and its 39 repeats (61 at most).
        assert script_calls(owner)["evalsha"][0] == math.ceil(40 / repeats_per_call("fixed_window"))
        assert script_calls(owner)["evalsha"][0] == 1
        assert call(owner, "SCRIPT", "EXISTS", batched_script("fixed_window").sha) == [1]
        assert call(owner, "SCRIPT", "EXISTS", cluster_batched_script("fixed_window").sha) == [0]
    finally:
        await client.close()


@pytest.mark.parametrize("position", ["declared", "after"])
async def test_a_batch_refused_by_moved_is_split_each_check_decided_once(
    cluster: RedisCluster, position: str
) -> None:
    """The client's map gives a node a slot it no longer serves. A batch whose declared keys
    are in it is answered MOVED; one where a later slot group is in it is refused by the
    cluster form's own check. Either way nothing ran: each check is sent alone, follows
    MOVED, and is decided once (every counter exact)."""
    algorithm = "fixed_window"
    script = load_script(algorithm)
    client = ClusterClient.from_url(cluster.url, batch_decisions=True, command_timeout_s=5)
    try:
        await client.connect()
        shards = cluster.shards()
        by_node = identities_per_shard(shards, 6, stem=f"moved-{position}")
        node, elsewhere = shards[0].primary, shards[1].primary
        local = [base_key(name, "split") for name in by_node[node]]
        strays = [base_key(name, "split") for name in by_node[elsewhere][:2]]
        assert client._table is not None
        for key in strays:  # as if their slots had moved since the map was loaded
            client._table[slot_of(key)] = client._nodes[f"127.0.0.1:{node}"]
        keys = [*strays, *local] if position == "declared" else [*local, *strays]
        rounds = 2
        calls = [key for _ in range(rounds) for key in keys]
        reset_stats(cluster)
        replies = await asyncio.gather(
            *(client.evalsha(script, [key], ARGS[algorithm]) for key in calls)
        )
        assert all(reply[0] == 1 for reply in replies)
        # What refused the batch: Redis's own check of the declared keys, or the cluster
        # form's check of the slot groups after the first.
        refusal = "MOVED" if position == "declared" else "MODERATO_NOT_RUN"
        assert errors(node).get(refusal, 0) > 0, errors(node)
        assert client.counters.batch_splits > 0
        assert client.counters.moved > 0
        assert client.node_for_key(strays[0]) == f"127.0.0.1:{elsewhere}"
        # Each check decided exactly once: every key charged twice, no more.
        for key in keys:
            assert counter(cluster, key) == rounds * 1000, key
    finally:
        await client.close()


def migrate_back_and_forth(
    cluster: RedisCluster, slot: int, stop: threading.Event, moves: list[tuple[int, int, int]]
) -> None:
    """Move ``slot`` from primary to primary (begin, a pause, its keys, the end, a pause)
    until ``stop`` is set; each move recorded as (source, target, keys moved)."""
    primaries = [shard.primary for shard in cluster.shards()]
    while not stop.is_set():
        source = cluster.owner(slot)
        target = next(port for port in primaries if port != source)
        primaries.append(primaries.pop(0))
        cluster.begin_migration(slot, source, target)
        time.sleep(0.05)  # ASK answered while the source still holds the keys
        moved = cluster.move_keys(slot, source, target)
        time.sleep(0.05)  # drained: ASK followed to the target
        cluster.end_migration(slot, source, target)
        moves.append((source, target, moved))
        stop.wait(0.3)  # MOVED once, then batches on the new owner


def test_four_processes_of_125_tasks_admit_exactly_the_limit_while_the_slot_migrates(
    cluster: RedisCluster,
) -> None:
    """Every algorithm, 4 processes x 125 tasks on one key, batching on, the key's slot
    migrating from node to node all through: exactly the limit admitted."""
    slot = identity_slot("hot")
    moves: list[tuple[int, int, int]] = []
    reset_stats(cluster)
    stop = threading.Event()
    mover = threading.Thread(target=migrate_back_and_forth, args=(cluster, slot, stop, moves))
    mover.start()
    try:
        # An hour's rate: the buckets refill one request in 36 s, so checks a migration
        # holds back for a second or more cannot earn another (at 100/minute one
        # refilled request every 0.6 s is rightly admitted).
        exact_n_admitted(cluster.url, "clustered", "100/hour", context=moves)
    finally:
        stop.set()
        mover.join()
    assert len(moves) >= 3, moves
    assert any(moved > 0 for _, _, moved in moves), moves
    # The calls that ran, reported, not asserted: every check of a batch a migration
    # refused is re-sent alone, and on a loaded machine a turn holds few checks, so the
    # count comes near the checks or passes them (2026-12-04: 2,876 for 3,000 on a quiet
    # machine, 3,004 once under load). That checks are joined per node is
    # test_one_call_per_node_joins_checks_of_several_slots's to show; this test's is
    # exactness while the slot moves.
    ran = evalsha_calls(cluster)
    report(
        f"cluster batching, slot migrating: {ran} calls ran for {EXACT_N_CHECKS} checks; "
        f"moves {moves}"
    )


@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket"])
async def test_checks_over_many_slots_stay_exact_while_one_slot_migrates(
    cluster: RedisCluster, algorithm: str
) -> None:
    """40 identities on one node, a burst of checks each in every turn, while one of their
    slots migrates away: batches touching it are refused before running (ASK, or the
    cluster form's check) and split; every identity ends with exactly its admissions."""
    limiter = RateLimiter(cluster.url, key_prefix=f"many-{algorithm}", command_timeout_s=5)
    client = limiter.backend.client
    assert isinstance(client, ClusterClient)
    client.batch_decisions = True
    shards = cluster.shards()
    node = shards[0].primary
    names = identities_per_shard(shards, 40, stem=f"many-{algorithm}")[node]
    moving = identity_slot(names[len(names) // 2])
    target = shards[1].primary
    admitted: dict[str, int] = dict.fromkeys(names, 0)
    try:
        await limiter.connect()

        async def turns(count: int) -> None:
            for _ in range(count):
                outcomes = await asyncio.gather(
                    *(
                        limiter.check_with_info(name, "30/day", algorithm=algorithm)
                        for name in names
                    )
                )
                for name, outcome in zip(names, outcomes):
                    admitted[name] += outcome.allowed
                await asyncio.sleep(0.01)

        runner = asyncio.ensure_future(turns(40))
        await asyncio.sleep(0.1)
        await asyncio.to_thread(cluster.begin_migration, moving, node, target)
        await asyncio.sleep(0.1)
        await asyncio.to_thread(cluster.move_keys, moving, node, target)
        await asyncio.sleep(0.1)
        await asyncio.to_thread(cluster.end_migration, moving, node, target)
        await runner
        assert client.counters.batch_splits > 0
        for name in names:
            usage = await limiter.get_usage(name, "30/day", algorithm=algorithm)
            assert usage["current"] == admitted[name] == 30, (name, usage)
    finally:
        await limiter.close()


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_log"])
async def test_a_flushed_script_cache_is_repaired_once_per_batch(
    cluster: RedisCluster, algorithm: str
) -> None:
    """SCRIPT FLUSH on every primary, then a turn of checks over several slots of each:
    each node loads each form once, re-sends each batch once, and every reply is exact."""
    script = load_script(algorithm)
    client = ClusterClient.from_url(cluster.url, batch_decisions=True, command_timeout_s=5)
    try:
        await client.connect()
        by_node = identities_per_shard(cluster.shards(), 10, stem=f"flushed-{algorithm}")
        keys = [base_key(name, "flushed") for names in by_node.values() for name in names]
        # A first turn: every connection has loaded its forms.
        await asyncio.gather(*(client.evalsha(script, [key], ARGS[algorithm]) for key in keys))
        for shard in cluster.shards():
            call(shard.primary, "SCRIPT", "FLUSH")
        reset_stats(cluster)
        replies = await asyncio.gather(
            *(client.evalsha(script, [key], ARGS[algorithm]) for key in keys)
        )
        assert [reply[2] for reply in replies] == [expected_remaining(algorithm, 2)] * len(keys)
        for shard in cluster.shards():
            stats = script_calls(shard.primary)
            # 10 checks: one batch (two of the sliding log's 8 at most), each answered
            # NOSCRIPT (a failed call), then run once.
            batches = math.ceil(10 / ALGORITHMS[algorithm].batch_parts)
            assert stats["evalsha"] == (2 * batches, batches), stats
            assert stats["script|load"][0] == 1, stats  # its form, loaded once
            assert errors(shard.primary) == {"NOSCRIPT": batches}
        assert client.counters.batch_splits == 0
    finally:
        await client.close()


async def test_a_limiter_from_a_cluster_url_with_batch_decisions_batches(
    cluster: RedisCluster,
) -> None:
    """``?batch_decisions=true`` in the cluster URL: 40 concurrent checks of one identity
    go as one call (a check and its repeats) and admit exactly 25; without it, a call a
    check."""

    async def burst(url: str, prefix: str) -> tuple[int, int]:
        limiter = RateLimiter(url, key_prefix=prefix, command_timeout_s=5)
        try:
            # A warm-up (the slot map, the scripts; another window: another key), then the
            # burst, counted alone.
            await asyncio.gather(*(limiter.check_with_info("hot", "100/hour") for _ in range(2)))
            reset_stats(cluster)
            results = await asyncio.gather(
                *(limiter.check_with_info("hot", "25/minute") for _ in range(40))
            )
            return sum(result.allowed for result in results), evalsha_calls(cluster)
        finally:
            await limiter.close()

    parts = repeats_per_call("fixed_window")  # one identity: a check, then its repeats
    assert await burst(f"{cluster.url}?batch_decisions=true", "urlbatch-on") == (
        25,
        math.ceil(40 / parts),
    )
    assert await burst(cluster.url, "urlbatch-off") == (25, 40)
