"""What the batched-decision tests share (tests/redis/test_grouping.py on one node,
tests/cluster/test_cluster_batching.py on a cluster): each algorithm's script
arguments for one request, and what Redis counts of the calls it ran (INFO
commandstats and errorstats since the last CONFIG RESETSTAT).
"""

from __future__ import annotations

from cluster import RedisCluster, call, script_calls
from redis_servers import RedisServer

from moderato.algorithms import ALGORITHMS

# cost 1000 (one request), charge, capacity 100 requests, a day's window.
ARGS = {name: ["1000", "1", "100000", "86400"] for name in ALGORITHMS}
ARGS["token_bucket"] = [*ARGS["token_bucket"], ""]


def calls(server: RedisServer, command: str) -> int:
    """How many times ``server`` ran ``command`` (evalsha, eval or script|load)."""
    return script_calls(server.port)[command][0]


def errors(port: int) -> dict[str, int]:
    """{error prefix: replies} since the last CONFIG RESETSTAT (INFO errorstats)."""
    found = {}
    for line in call(port, "INFO", "errorstats").decode().splitlines():
        if line.startswith("errorstat_"):
            name, _, count = line[len("errorstat_") :].partition(":count=")
            found[name] = int(count)
    return found


def reset_stats(cluster: RedisCluster) -> None:
    """CONFIG RESETSTAT on every primary of ``cluster``."""
    for shard in cluster.shards():
        call(shard.primary, "CONFIG", "RESETSTAT")


def evalsha_calls(cluster: RedisCluster) -> int:
    """EVALSHA calls run on all of ``cluster``'s primaries."""
    return sum(script_calls(shard.primary)["evalsha"][0] for shard in cluster.shards())
