"""A blocking and an asyncio limiter on one Redis enforce one quota exactly.

Four processes (two blocking RateLimiters with 50 threads each, two asyncio
RateLimiters with 50 tasks each) check one key at "100/minute", 400 checks
at the same instant, on every algorithm: exactly 100 are admitted in total,
and Redis holds exactly 100 charged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from redis_servers import RedisServer

from moderato.algorithms import ALGORITHMS
from moderato.sync import RateLimiter

WORKER = Path(__file__).resolve().parents[1] / "shared_quota_worker.py"
RATE = "100/minute"


KINDS = ("sync", "async", "sync", "async")


def start_instant() -> float:
    """Half a second from now, with no minute boundary in the 8 s after it (the fixed
    and sliding windows would start over there)."""
    start_at = time.time() + 0.5
    if start_at % 60 > 50:
        start_at += 61 - start_at % 60
    return start_at


def test_two_blocking_and_two_asyncio_processes_admit_exactly_100(
    redis_server: RedisServer, redis_url: str
) -> None:
    algorithms = list(ALGORITHMS)
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), kind, redis_url, "shared", RATE, *algorithms],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for kind in KINDS
    ]
    for worker in workers:  # connected, scripts loaded
        assert worker.stdout is not None
        assert worker.stdout.readline() == "ready\n"
    start_at = repr(start_instant())
    for worker in workers:  # every one told before any is waited for
        assert worker.stdin is not None
        worker.stdin.write(start_at + "\n")
        worker.stdin.flush()
    reports = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0, out
        reports.append(json.loads(out.splitlines()[-1]))
    totals = {name: sum(report[name] for report in reports) for name in algorithms}
    print(f"\nadmitted per process ({', '.join(KINDS)}): {reports}")
    assert totals == dict.fromkeys(algorithms, 100)
    # Both kinds of limiter took part in the admissions.
    for kind in ("sync", "async"):
        assert sum(sum(r.values()) for r, k in zip(reports, KINDS) if k == kind) > 0, reports
    # What Redis holds agrees: the window counters and the log are spent, exactly
    # (the buckets have refilled a little by now: 100 per minute).
    limiter = RateLimiter(redis_url, key_prefix="shared")
    for name in ("fixed_window", "sliding_window", "sliding_log"):
        usage = limiter.get_usage("hot", RATE, algorithm=name)
        assert (usage["current"], usage["remaining"]) == (100, 0), (name, usage)
    limiter.close()
