"""A blocking and an asyncio limiter on one Redis enforce one quota exactly.

Four processes (two blocking RateLimiters with 50 threads each, two asyncio
RateLimiters with 50 tasks each) check one key at "100/minute", 400 checks
at the same instant, on every algorithm: exactly 100 are admitted in total,
and Redis holds exactly 100 charged.
"""

from __future__ import annotations

from redis_servers import RedisServer
from shared_quota_worker import run_workers

from moderato.algorithms import ALGORITHMS
from moderato.sync import RateLimiter

RATE = "100/minute"


KINDS = ("sync", "async", "sync", "async")


def test_two_blocking_and_two_asyncio_processes_admit_exactly_100(
    redis_server: RedisServer, redis_url: str
) -> None:
    algorithms = list(ALGORITHMS)
    reports = run_workers(KINDS, redis_url, "shared", RATE, algorithms)
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
