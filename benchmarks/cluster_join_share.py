"""The share of a cluster client's CPU that the Python joining takes with batching on
(issue 30): ``grouping.group_node_checks`` (a node's turn joined across its slots) and
the batched reply's hand-out (``BatchedReply.set_result``, ``done``,
``NodeBatchedReply.set_exception``), each call timed by ``time.process_time_ns``, against
the process's CPU time over the same turns: a real asyncio ``RateLimiter`` over a
3-primary cluster, 100 checks gathered a turn, over 1,000 identities (every node, about
a thousand slots) or one hot identity, after 30 warm-up turns. What moving a cluster
node's joining into C (as csrc/grouping.c did for a single server) could save at most:
the hand-out's future wake-ups stay either way.

    flock /tmp/bench.lock .venv/bin/python benchmarks/cluster_join_share.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from functools import wraps
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cluster import RedisCluster  # noqa: E402

from moderato import RateLimiter  # noqa: E402
from moderato.redis import cluster as cluster_module  # noqa: E402
from moderato.redis import grouping  # noqa: E402

TASKS = 100
RATE = "1000000000/hour"  # admits everything
spent_ns = [0]


def timed(function: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent_ns[0] += time.process_time_ns() - started

    return wrapper


def instrument() -> None:
    """Time the node's joining and the reply's hand-out (NodeBatchedReply.set_exception
    calls the base's for most errors: a failed call is counted twice, none fail here)."""
    cluster_module.group_node_checks = timed(grouping.group_node_checks)  # type: ignore[attr-defined]
    for name in ("set_result", "done", "set_exception"):
        setattr(grouping.BatchedReply, name, timed(getattr(grouping.BatchedReply, name)))
    grouping.NodeBatchedReply.set_exception = timed(  # type: ignore[method-assign]
        grouping.NodeBatchedReply.set_exception
    )


async def measure(url: str, algorithm: str, hot: bool, turns: int) -> tuple[int, int]:
    """CPU nanoseconds of ``turns`` turns, and the joining's and hand-out's among them."""
    limiter = RateLimiter(url, command_timeout_s=10.0)
    limiter._backend.client.batch_decisions = True  # type: ignore[attr-defined]
    names = ["hot"] * TASKS if hot else [f"id{i}" for i in range(1000)]

    async def turn(first: int) -> None:
        picked = [names[(first + i * 7) % len(names)] for i in range(TASKS)]
        await asyncio.gather(
            *(limiter.check_with_info(name, RATE, algorithm=algorithm) for name in picked)
        )

    for index in range(30):
        await turn(index * TASKS)
    spent_ns[0] = 0
    started = time.process_time_ns()
    for index in range(turns):
        await turn(index * TASKS)
    total_ns = time.process_time_ns() - started
    await limiter.close()
    return total_ns, spent_ns[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    options = parser.parse_args()
    instrument()
    cluster = RedisCluster(primaries=3, replicas=0).start()
    try:
        for algorithm in ("fixed_window", "sliding_window"):
            for hot in (False, True):
                total_ns, joining_ns = asyncio.run(
                    measure(cluster.url, algorithm, hot, options.turns)
                )
                checks = options.turns * TASKS
                print(
                    f"{algorithm:<15} {'one hot' if hot else '1,000':>8}: client CPU "
                    f"{total_ns / 1e3 / checks:.1f} us/check, Python joining and hand-out "
                    f"{joining_ns / 1e3 / checks:.1f} us/check ({joining_ns / total_ns:.1%})",
                    flush=True,
                )
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
