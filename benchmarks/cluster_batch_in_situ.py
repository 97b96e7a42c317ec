"""Batched decisions on a Redis Cluster in situ (issue 30, the cluster step): Redis CPU per
decision and checks/s of a real asyncio RateLimiter over a 3-primary cluster (no replicas),
100 tasks in one process, the cluster client's ``batch_decisions`` off ("before": a call a
check) and on ("after": each node joins a loop turn's checks across its slots,
moderato/redis/grouping.py), interleaved in one run.

The trials are batch_in_situ.py's (100 tasks checking in a loop at a rate that admits
everything, over 1,000 identities, so over every node and about a thousand slots, or on one
hot identity); the meter here sums every primary's ``used_cpu_sys + used_cpu_user`` (all
threads) and ``cmdstat_evalsha`` calls around each window.

    flock /tmp/bench.lock .venv/bin/python benchmarks/cluster_batch_in_situ.py \
        [--trials N] [--seconds S] [--algorithms fixed_window token_bucket]

Writes ``benchmarks/results/cluster-batch-in-situ-<UTC time>.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_in_situ import Meter, evalsha_calls, run  # noqa: E402
from cluster import RedisCluster  # noqa: E402
from in_situ import in_situ_options, run_in_situ  # noqa: E402

from moderato.redis import ClusterClient  # noqa: E402


def cluster_meter(cluster: RedisCluster) -> Meter:
    """The primaries' CPU seconds (user + system, every thread) and EVALSHA calls, summed."""
    admins = [redis.Redis(port=shard.primary) for shard in cluster.shards()]

    def read() -> tuple[float, int]:
        cpu_s, calls = 0.0, 0
        for admin in admins:
            info = admin.info("cpu")
            cpu_s += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
            calls += evalsha_calls(admin)
        return cpu_s, calls

    return read


def _per_slot(topology: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def loaded(self: ClusterClient, node: Any) -> Any:
        found = await topology(self, node)
        self._node_batching.cross_slot = False
        return found

    return loaded


def main() -> None:
    parser = in_situ_options(__doc__, ["fixed_window", "token_bucket"])
    parser.add_argument(
        "--per-slot",
        action="store_true",
        help="'after' joins checks within one slot only (as on Redis before 7.0), for comparison",
    )
    options = parser.parse_args()
    if options.per_slot:
        # What a cluster answering only CLUSTER SLOTS gets: runs cut where the slot changes.
        ClusterClient._topology = _per_slot(ClusterClient._topology)  # type: ignore[method-assign]
    cluster = RedisCluster(primaries=3, replicas=0).start()
    run_in_situ(
        "cluster_batch_in_situ" + ("_per_slot" if options.per_slot else ""),
        options,
        cluster,
        lambda: run(options, cluster.url, cluster_meter(cluster)),
        primaries=3,
        replicas=0,
    )


if __name__ == "__main__":
    main()
