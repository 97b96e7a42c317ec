"""Batched decisions in situ (issue 30): Redis CPU per decision and checks/s of a real
asyncio RateLimiter, 100 tasks in one process, with the client's batching off
("before": a call a check) and on ("after": a loop turn's checks joined into batched
calls, moderato/redis/grouping.py), interleaved in one run on one redis-server.

Each trial runs 100 tasks for ``--seconds``, each checking in a loop at a rate that
admits everything, either over 1,000 identities (each check a random one) or on one
hot identity; Redis's CPU is read from ``INFO cpu`` (the main thread's user + system
time) around the window and divided by the checks made, and the checks are counted
per second of wall clock. The server's ``cmdstat_evalsha`` gives the calls made, so
checks per call. Medians of the trials; ratios after/before from the medians.

    flock /tmp/bench.lock .venv/bin/python benchmarks/batch_in_situ.py [--trials N] [--seconds S]
        [--rate RATE] [--hot-only]

``--rate`` sets the limit checked (default: one that admits everything); a small one,
say ``--rate 100/hour --hot-only``, makes the limit the bottleneck on the hot key (after
the warm-up every check is denied: the abuse case).

Writes ``benchmarks/results/batch-in-situ-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_floor import redis_cpu_s  # noqa: E402
from in_situ import IDENTITIES, checks_window, in_situ_options, run_in_situ  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato import RateLimiter  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402

RATE = "1000000000/hour"  # admits everything


# Redis's CPU seconds so far and the EVALSHA calls it served: what a trial reads around its window.
Meter = Callable[[], tuple[float, int]]


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def server_meter(admin: redis.Redis) -> Meter:
    """One redis-server's main-thread CPU and calls."""
    return lambda: (redis_cpu_s(admin), evalsha_calls(admin))


async def trial(
    limiter: RateLimiter, meter: Meter, algorithm: str, hot: bool, seconds: float, rate: str
) -> dict[str, float]:
    checks, elapsed, (cpu_before, calls_before), (cpu_after, calls_after) = await checks_window(
        limiter.check_with_info, hot, seconds, 0.2, meter, rate, algorithm=algorithm
    )
    calls = calls_after - calls_before
    return {
        "checks": checks,
        "checks_per_s": checks / elapsed,
        "redis_us_per_decision": (cpu_after - cpu_before) / checks * 1e6,
        "checks_per_call": checks / calls if calls else 0.0,
    }


async def run(options: argparse.Namespace, url: str, meter: Meter) -> list[dict[str, Any]]:
    limiters = {}
    for mode in ("before", "after"):
        limiter = RateLimiter(url, key_prefix=mode, command_timeout_s=10.0)
        limiter._backend.client.batch_decisions = mode == "after"  # type: ignore[attr-defined]
        for algorithm in options.algorithms:
            await limiter.check_with_info("warm-up", options.rate, algorithm=algorithm)
        limiters[mode] = limiter
    rows: list[dict[str, Any]] = []
    for algorithm in options.algorithms:
        for hot in (True,) if options.hot_only else (False, True):
            samples: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for _ in range(options.trials):
                for mode in ("before", "after"):
                    samples[mode].append(
                        await trial(
                            limiters[mode], meter, algorithm, hot, options.seconds, options.rate
                        )
                    )
            row: dict[str, Any] = {
                "algorithm": algorithm,
                "identities": "one hot" if hot else f"{IDENTITIES:,}",
            }
            for mode, trials in samples.items():
                for field in ("checks_per_s", "redis_us_per_decision", "checks_per_call"):
                    row[f"{mode}_{field}"] = statistics.median(t[field] for t in trials)
                row[f"{mode}_trials"] = trials
            row["checks_per_s_ratio"] = row["after_checks_per_s"] / row["before_checks_per_s"]
            row["redis_cpu_ratio"] = (
                row["after_redis_us_per_decision"] / row["before_redis_us_per_decision"]
            )
            row["after_decisions_per_core_s"] = 1e6 / row["after_redis_us_per_decision"]
            row["before_decisions_per_core_s"] = 1e6 / row["before_redis_us_per_decision"]
            rows.append(row)
            print(
                f"{algorithm:<15} {row['identities']:>8}: checks/s "
                f"{row['before_checks_per_s']:>9,.0f} -> {row['after_checks_per_s']:>9,.0f} "
                f"({row['checks_per_s_ratio']:.2f}x); Redis us/decision "
                f"{row['before_redis_us_per_decision']:6.2f} -> "
                f"{row['after_redis_us_per_decision']:6.2f} ({row['redis_cpu_ratio']:.2f}x); "
                f"checks/call {row['after_checks_per_call']:.1f}; one core "
                f"{row['after_decisions_per_core_s']:,.0f}/s",
                flush=True,
            )
    for limiter in limiters.values():
        await limiter.close()
    return rows


def main() -> None:
    parser = in_situ_options(__doc__, ALGORITHMS)
    parser.add_argument("--rate", default=RATE, help="the limit checked (default: admits all)")
    parser.add_argument("--hot-only", action="store_true", help="the hot identity's rows only")
    options = parser.parse_args()
    server = RedisServer().start()
    admin = redis.Redis(port=server.port)
    run_in_situ(
        "batch_in_situ", options, server, lambda: run(options, server.url, server_meter(admin))
    )


if __name__ == "__main__":
    main()
