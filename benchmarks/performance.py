"""Limiter-only throughput against redis-benchmark's floor and ceiling, in one run.

Starts its own redis-server on a free port (or uses --redis-url), then:

1. redis-benchmark: EVALSHA of the shipped token-bucket script with the same
   arguments moderato sends, at ``-c 1 -P 1`` (round-trip floor) and
   ``-c 50 -P 16`` (what the server can do when pipelined);
2. moderato sequential checks/s with p50 / p99 latency;
3. moderato concurrent checks/s at 1, 10, 100 and 1000 tasks.

Each measurement is repeated (``--trials``); the median and the spread are
reported, and the raw numbers are written as JSON to benchmarks/results/.

    python benchmarks/performance.py [--quick] [--algorithm token_bucket]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from redis_servers import RedisServer  # noqa: E402

from moderato import RateLimiter, __version__  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.scripts import load_script  # noqa: E402

RATE = "1000000/minute"  # large enough that every check is a full admission


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def redis_benchmark(port: int, clients: int, pipeline: int, requests: int, algorithm: str) -> float:
    """ops/s of EVALSHA on the shipped script with moderato's own arguments."""
    algo = ALGORITHMS[algorithm]
    script = load_script(algo.script)
    subprocess.run(
        ["redis-cli", "-p", str(port), "SCRIPT", "LOAD", script.source.decode()],
        check=True,
        capture_output=True,
    )
    key = f"bench:{algo.key_tag}:{{:global:rb}}:60"
    args = [str(1000), "1", str(1_000_000 * 1000), "60"]
    if algorithm == "token_bucket":
        args.append("")
    command = ["EVALSHA", script.sha, "1", key, *args]
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-n",
            str(requests),
            "-c",
            str(clients),
            "-P",
            str(pipeline),
            "-q",
            "--csv",
            *command,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    match = re.search(r'"[^"]*","([0-9.]+)"', out)
    if not match:
        raise RuntimeError(f"could not read redis-benchmark output: {out!r}")
    return float(match.group(1))


async def sequential(limiter: RateLimiter, count: int, algorithm: str) -> dict[str, float]:
    latencies_us: list[float] = []
    clock = time.perf_counter
    start = clock()
    for _ in range(count):
        begin = clock()
        await limiter.check_with_info("seq", RATE, algorithm=algorithm)
        latencies_us.append((clock() - begin) * 1e6)
    elapsed = clock() - start
    latencies_us.sort()
    return {
        "checks_per_s": count / elapsed,
        "p50_us": latencies_us[len(latencies_us) // 2],
        "p99_us": latencies_us[int(len(latencies_us) * 0.99)],
    }


async def concurrent(limiter: RateLimiter, tasks: int, count: int, algorithm: str) -> float:
    per_task = max(1, count // tasks)

    async def worker(index: int) -> None:
        for _ in range(per_task):
            await limiter.check_with_info(f"c{index % 64}", RATE, algorithm=algorithm)

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return per_task * tasks / (time.perf_counter() - start)


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def environment(redis_port: int) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    redis_version = subprocess.run(
        ["redis-cli", "-p", str(redis_port), "INFO", "server"], capture_output=True, text=True
    ).stdout
    version = re.search(r"redis_version:(\S+)", redis_version)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis": version.group(1) if version else "unknown",
        "moderato": __version__,
        "git_commit": commit or "unknown",
    }


async def run_moderato(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with RateLimiter(url, key_prefix="bench") as limiter:
        await limiter.check_with_info("warmup", RATE, algorithm=args.algorithm)
        seq = [
            await sequential(limiter, args.sequential, args.algorithm) for _ in range(args.trials)
        ]
        progress(f"sequential: {statistics.median(s['checks_per_s'] for s in seq):,.0f} checks/s")
        results["sequential"] = {
            "checks_per_s": summary([s["checks_per_s"] for s in seq]),
            "p50_us": summary([s["p50_us"] for s in seq]),
            "p99_us": summary([s["p99_us"] for s in seq]),
        }
        results["concurrent"] = {}
        for tasks in (1, 10, 100, 1000):
            samples = [
                await concurrent(limiter, tasks, args.concurrent, args.algorithm)
                for _ in range(args.trials)
            ]
            progress(f"{tasks} tasks: {statistics.median(samples):,.0f} checks/s")
            results["concurrent"][str(tasks)] = summary(samples)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a fifth of the full run")
    parser.add_argument("--algorithm", default="token_bucket", choices=sorted(ALGORITHMS))
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    args.trials = args.trials or (3 if args.quick else 5)
    args.sequential = int(20_000 * scale)
    args.concurrent = int(100_000 * scale)
    bench_requests = int(200_000 * scale)

    server = RedisServer().start()
    try:
        env = environment(server.port)
        progress(f"redis-server {env['redis']} on port {server.port}; python {env['python']}")
        floor = [
            redis_benchmark(server.port, 1, 1, bench_requests // 4, args.algorithm)
            for _ in range(args.trials)
        ]
        progress(f"redis-benchmark -c 1 -P 1: {statistics.median(floor):,.0f} ops/s")
        ceiling = [
            redis_benchmark(server.port, 50, 16, bench_requests, args.algorithm)
            for _ in range(args.trials)
        ]
        progress(f"redis-benchmark -c 50 -P 16: {statistics.median(ceiling):,.0f} ops/s")
        moderato = asyncio.run(run_moderato(server.url, args))
    finally:
        server.close()

    floor_median = statistics.median(floor)
    ceiling_median = statistics.median(ceiling)
    seq_median = moderato["sequential"]["checks_per_s"]["median"]
    report = {
        "kind": "limiter-only",
        "algorithm": args.algorithm,
        "quick": args.quick,
        "trials": args.trials,
        "environment": env,
        "redis_benchmark": {"c1_p1": summary(floor), "c50_p16": summary(ceiling)},
        "moderato": moderato,
        "ratios": {
            "sequential_vs_floor": seq_median / floor_median,
            **{
                f"tasks_{tasks}_vs_ceiling": moderato["concurrent"][tasks]["median"]
                / ceiling_median
                for tasks in moderato["concurrent"]
            },
        },
    }
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.output / f"limiter-{args.algorithm}-{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\nlimiter-only, {args.algorithm}, median of {args.trials} trials")
    print(f"  redis-benchmark -c 1 -P 1    {floor_median:>10,.0f} ops/s")
    print(f"  redis-benchmark -c 50 -P 16  {ceiling_median:>10,.0f} ops/s")
    seq = moderato["sequential"]
    print(
        f"  moderato sequential          {seq_median:>10,.0f} checks/s "
        f"(p50 {seq['p50_us']['median']:.0f} us, p99 {seq['p99_us']['median']:.0f} us) "
        f"= {report['ratios']['sequential_vs_floor']:.0%} of the floor"
    )
    for tasks, stats in moderato["concurrent"].items():
        print(
            f"  moderato {tasks:>4} tasks           {stats['median']:>10,.0f} checks/s "
            f"= {report['ratios'][f'tasks_{tasks}_vs_ceiling']:.0%} of the ceiling"
        )
    print(f"raw results: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
