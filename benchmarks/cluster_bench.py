"""Limiter-only throughput: a 3-primary Redis Cluster against a single node, in one run.

Starts its own servers on free ports: one redis-server, and a cluster of 3
primaries (+ 1 replica each by default, as in production) built with
``redis-cli --cluster create``. Then, for each, the same open workload:
``--tasks`` concurrent tasks each running checks back to back over
``--identities`` identities (spread over all 16384 slots, so over every
shard), for ``--checks`` checks in all. Each measurement is repeated
(``--trials``) and the median reported; ``--processes N`` runs N client
processes at once and sums their rates (one Python process is usually the
bottleneck before three Redis primaries are). Raw numbers go to
benchmarks/results/ as JSON.

    python benchmarks/cluster_bench.py [--quick] [--algorithm token_bucket]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from cluster import RedisCluster  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato import RateLimiter, __version__  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402

RATE = "1000000000/day"  # every check is a full admission


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


async def measure(url: str, algorithm: str, tasks: int, checks: int, identities: int) -> float:
    """checks/s of ``tasks`` concurrent tasks sharing ``checks`` checks (after a warm-up)."""
    async with RateLimiter(url, key_prefix="bench") as limiter:
        # Warm-up: the slot map, one connection per node, the scripts cached everywhere.
        await asyncio.gather(
            *(limiter.check_with_info(f"id{i}", RATE, algorithm=algorithm) for i in range(256))
        )
        per_task = max(1, checks // tasks)

        async def worker(index: int) -> None:
            check = limiter.check_with_info
            for step in range(per_task):
                await check(
                    f"id{(index * per_task + step) % identities}", RATE, algorithm=algorithm
                )

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(tasks)))
        return per_task * tasks / (time.perf_counter() - started)


def _process(args: tuple[str, str, int, int, int], results: Any) -> None:
    results.put(asyncio.run(measure(*args)))


def run(
    url: str, algorithm: str, tasks: int, checks: int, identities: int, processes: int
) -> float:
    if processes == 1:
        return asyncio.run(measure(url, algorithm, tasks, checks, identities))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(
            target=_process, args=((url, algorithm, tasks, checks, identities), results)
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    rates = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    return float(sum(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a fifth of the full run")
    parser.add_argument("--algorithm", default="token_bucket", choices=sorted(ALGORITHMS))
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--checks", type=int, default=None, help="checks per measurement")
    parser.add_argument("--identities", type=int, default=4096)
    parser.add_argument("--tasks", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1, help="replicas per primary")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.trials = args.trials or (3 if args.quick else 5)
    args.checks = args.checks or (20_000 if args.quick else 100_000)

    single = RedisServer().start()
    cluster = RedisCluster(primaries=3, replicas=args.replicas)
    results: dict[str, dict[str, Any]] = {"single": {}, "cluster": {}}
    try:
        cluster.start()
        progress(
            f"single node on port {single.port}; cluster of 3 primaries + "
            f"{3 * args.replicas} replicas; {os.cpu_count()} cores; python "
            f"{platform.python_version()}"
        )
        targets = {"single": single.url, "cluster": cluster.url}
        for tasks in args.tasks:
            for name, url in targets.items():
                samples = [
                    run(url, args.algorithm, tasks, args.checks, args.identities, args.processes)
                    for _ in range(args.trials)
                ]
                results[name][str(tasks)] = {
                    "median": statistics.median(samples),
                    "min": min(samples),
                    "max": max(samples),
                    "samples": samples,
                }
                progress(f"{name:7} {tasks:>5} tasks: {statistics.median(samples):>9,.0f} checks/s")
            # Keys of earlier rounds would only grow the servers' memory.
            single.command("FLUSHALL")
            cluster.flushall()
    finally:
        cluster.close()
        single.close()

    report = {
        "kind": "limiter-only, cluster vs single node",
        "algorithm": args.algorithm,
        "quick": args.quick,
        "trials": args.trials,
        "checks": args.checks,
        "identities": args.identities,
        "processes": args.processes,
        "replicas_per_primary": args.replicas,
        "environment": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "moderato": __version__,
        },
        "results": results,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.output / f"cluster-{args.algorithm}-{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")

    print(
        f"\nlimiter-only, {args.algorithm}, median of {args.trials} trials, "
        f"{args.processes} client process(es), {os.cpu_count()} cores"
    )
    print(f"  {'tasks':>5}  {'single node':>12}  {'cluster (3 primaries)':>22}  ratio")
    for tasks in args.tasks:
        one = results["single"][str(tasks)]["median"]
        many = results["cluster"][str(tasks)]["median"]
        print(f"  {tasks:>5}  {one:>12,.0f}  {many:>22,.0f}  {many / one:.2f}x")
    print(f"raw results: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
