"""Redis CPU per decision of the batched decision scripts (issue 30) against the scripts
alone, every algorithm, at the script level (no client, no limiter).

Each row is ``redis-benchmark -c 8 -P 16`` sending one ``EVALSHA`` of the shipped script
(one check a call) or of its batched form (``moderato.scripts.batched_script``: N checks a
call), to a redis-server this script starts. "1,000 identities": every key is
``id:__rand_int__`` with ``-r 1000`` (redis-benchmark draws each occurrence anew); "hot":
one key. Redis's CPU is read from ``INFO cpu`` (the main thread's user + system time)
around each trial and divided by the decisions the trial made; three trials, the median.
Every check is admitted (a capacity far above the decisions sent), so each row is the
admitted path; the hot rows check the counters at the end (fixed window: exact).

    .venv/bin/python benchmarks/batch_scripts.py [--trials N] [--decisions N]

Writes ``benchmarks/results/batch-scripts-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_floor import calls_for, trial, write_results  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.redis.grouping import batch_layout  # noqa: E402
from moderato.scripts import batched_script, load_script  # noqa: E402

COST_SCALED = "1000"
CAPACITY_SCALED = "9000000000000"
WINDOW_S = "3600"
BATCH_SIZES = (8, 16)


def fields(algorithm: str) -> list[str]:
    extra = [""] if algorithm == "token_bucket" else []  # its refill rate: the public rule
    return [COST_SCALED, "1", CAPACITY_SCALED, WINDOW_S, *extra]


def rows_for(algorithm: str) -> list[tuple[str, int, list[str]]]:
    alone, batch = load_script(algorithm).sha, batched_script(algorithm).sha
    args = fields(algorithm)
    rows: list[tuple[str, int, list[str]]] = []
    for where, key in (("1,000 identities", "id:__rand_int__"), ("hot", f"hot:{algorithm}")):
        rows.append((f"{where}, alone", 1, ["EVALSHA", alone, "1", key, *args]))
        for n in BATCH_SIZES:
            # As the client sends it (grouping's encoder): n checks of one key, or of n
            # keys (stand-ins, each then the row's key, which redis-benchmark draws anew
            # at each occurrence), under one policy.
            same = where == "hot"
            checks = [([key if same else f"{key}:{i}"], args) for i in range(n)]
            call_keys, call_args = batch_layout(checks)
            argv = ["EVALSHA", batch, str(len(call_keys)), *[key] * len(call_keys)]
            rows.append((f"{where}, batch of {n}", n, argv + [str(arg) for arg in call_args]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=200_000, help="per trial, about")
    parser.add_argument("--algorithms", nargs="*", default=list(ALGORITHMS))
    options = parser.parse_args()
    if shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-benchmark was not found: it comes with redis-server")
    server = RedisServer().start()
    results: list[dict[str, Any]] = []
    try:
        client = redis.Redis(port=server.port)
        for algorithm in options.algorithms:
            client.script_load(load_script(algorithm).source)
            client.script_load(batched_script(algorithm).source)
            baseline: dict[str, float] = {}
            for label, per_call, argv in rows_for(algorithm):
                calls = calls_for(per_call, options.decisions)
                if label.startswith("1,000"):
                    argv = ["-r", "1000", *argv]
                us = sorted(
                    trial(client, server.port, argv, calls) / (calls * per_call) * 1e6
                    for _ in range(options.trials)
                )
                median_us = statistics.median(us)
                where = label.split(",")[0]
                baseline.setdefault(where, median_us)
                ratio = median_us / baseline[where]
                results.append(
                    {
                        "algorithm": algorithm,
                        "row": label,
                        "decisions_per_call": per_call,
                        "calls": calls,
                        "redis_us_per_decision": us,
                        "median_us": median_us,
                        "ratio_to_alone": ratio,
                        "decisions_per_core_s": 1e6 / median_us,
                    }
                )
                print(
                    f"{algorithm:<15} {label:<28} {median_us:7.3f} us/decision "
                    f"{ratio:5.2f}x alone {1e6 / median_us:>12,.0f} decisions/s/core "
                    f"trials {[round(t, 3) for t in us]}",
                    flush=True,
                )
            client.flushall()
    finally:
        server.close()
    path = write_results("batch_scripts", vars(options), results)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
