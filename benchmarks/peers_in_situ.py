"""Redis CPU per decision in situ, moderato beside the peers of each algorithm's family
(issue 30's first target): 100 asyncio tasks in one process, real clients, one
redis-server of the benchmark's own.

Every subject checks in a loop from ``TASKS`` tasks at a rate that admits everything,
over 1,000 identities (each check a random one) or one hot identity, for ``--seconds``;
Redis's main-thread CPU (``INFO cpu``, user + system) around the window is divided by
the checks made. Subjects:

* moderato's asyncio ``RateLimiter`` (its one-call check over Redis), with the client's
  batching off (a script call a check) and on (``RedisClient(batch_decisions=True)``:
  a loop turn's checks joined into batched calls, moderato/redis/grouping.py);
* limits' asyncio strategies over ``limits.aio.storage.RedisStorage`` (redis-py), the
  fixed window, the sliding window counter and the moving window (a sliding log);
* throttled-py's asyncio ``Throttled`` over its ``RedisStore``: the fixed and sliding
  windows, the token and leaky buckets and GCRA;
* two references for checks/s, not limiters (never the "best peer"): the bare asyncio
  client (benchmarks/subjects.py: hiredis on one connection, the same EVALSHA built
  by moderato's C functions, a loop turn's commands in one write, a future a check:
  what any client that sends a script call a check and answers each caller does at
  the least), and the loop alone (each check waits one loop turn, ``asyncio.sleep(0)``: the
  ceiling of 100 tasks that each wait for something per check, no I/O at all).

A trial runs every subject of an algorithm in turn, the order rotated trial by trial so
a drift of the shared machine spreads over all of them; figures are medians of the
trials, and each ratio (moderato / the best peer of the family, the peer costing Redis
least) is taken from those medians.

    flock /tmp/bench.lock .venv/bin/python benchmarks/peers_in_situ.py [--trials N] [--seconds S]

Writes ``benchmarks/results/peers-in-situ-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import redis  # noqa: E402
from batch_floor import redis_cpu_s  # noqa: E402
from in_situ import IDENTITIES, checks_window, in_situ_options, run_in_situ  # noqa: E402
from redis_servers import RedisServer  # noqa: E402
from subjects import LIMITS_STRATEGIES, THROTTLED_PAIRS, bare_client  # noqa: E402

from moderato import RateLimiter, _accel  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.policy import policy_for  # noqa: E402
from moderato.scripts import load_script  # noqa: E402

LIMIT = 1_000_000_000  # per hour: admits everything
Check = Callable[[str], Awaitable[Any]]


@dataclass
class Subject:
    name: str
    library: str
    check: Check
    close: Callable[[], Awaitable[None]]


async def moderato_subject(url: str, algorithm: str, batched: bool) -> Subject:
    mode = "on" if batched else "off"
    limiter = RateLimiter(url, key_prefix=f"moderato-{mode}", command_timeout_s=10.0)
    limiter.backend.client.batch_decisions = batched  # type: ignore[attr-defined]
    rate = f"{LIMIT}/hour"
    check_with_info = limiter.check_with_info

    def check(key: str) -> Awaitable[Any]:
        return check_with_info(key, rate, algorithm=algorithm)

    return Subject(f"moderato, batching {mode}", "moderato", check, limiter.close)


def limits_subjects(port: int, algorithm: str) -> list[Subject]:
    from limits import RateLimitItemPerHour
    from limits.aio import strategies
    from limits.aio.storage import RedisStorage

    subjects = []
    for strategy_name, (slug, pair) in LIMITS_STRATEGIES.items():
        if pair != algorithm:
            continue
        storage = RedisStorage(f"async+redis://127.0.0.1:{port}", implementation="redispy")
        hit = getattr(strategies, strategy_name)(storage).hit
        item = RateLimitItemPerHour(LIMIT)

        def check(key: str, hit: Any = hit, item: Any = item, slug: str = slug) -> Awaitable[Any]:
            return hit(item, f"limits-{slug}:{key}")

        async def close(storage: Any = storage) -> None:
            await storage.reset()

        subjects.append(Subject(f"limits {slug} (redis-py)", "limits", check, close))
    return subjects


def throttled_subjects(port: int, algorithm: str) -> list[Subject]:
    import throttled.asyncio as throttled_asyncio

    subjects = []
    for using, pair in THROTTLED_PAIRS.items():
        if pair != algorithm:
            continue
        throttle = throttled_asyncio.Throttled(
            using=using,
            quota=throttled_asyncio.per_duration(timedelta(hours=1), limit=LIMIT),
            store=throttled_asyncio.RedisStore(server=f"redis://127.0.0.1:{port}/0"),
        )
        limit = throttle.limit

        def check(key: str, limit: Any = limit, using: str = using) -> Awaitable[Any]:
            return limit(f"throttled-{using}:{key}")

        async def close() -> None:
            return None

        subjects.append(Subject(f"throttled-py {using}", "throttled-py", check, close))
    return subjects


async def reference_subjects(port: int, algorithm: str) -> list[Subject]:
    loop = asyncio.get_running_loop()
    chosen = ALGORITHMS[algorithm]
    rate = f"{LIMIT}/hour"
    script = load_script(chosen.name)
    args = (1000, 1, *chosen.policy_args(policy_for(rate).rates[0]))
    transport, send = await bare_client(
        lambda protocol: loop.create_connection(protocol, "127.0.0.1", port),
        script.source,
        per_turn=True,
    )

    def bare(key: str) -> Awaitable[Any]:
        keys = _accel.build_keys("bare", chosen.key_tag, "", "global", key, (3600,))
        return send(_accel.encode_evalsha(script.sha, keys, args))

    async def close_bare() -> None:
        transport.close()

    def nothing(key: str) -> Awaitable[Any]:
        return asyncio.sleep(0)  # one loop turn, as a reply's wait takes at the least

    async def close_nothing() -> None:
        return None

    return [
        Subject("bare asyncio client (reference)", "reference", bare, close_bare),
        Subject("the loop alone (reference)", "reference", nothing, close_nothing),
    ]


async def trial(
    subject: Subject, admin: redis.Redis, hot: bool, seconds: float
) -> tuple[float, float]:
    """Redis µs per decision of ``subject`` over one window, and its checks a second."""
    checks, elapsed, cpu_before, cpu_after = await checks_window(
        subject.check, hot, seconds, 0.3, lambda: redis_cpu_s(admin)
    )
    return (cpu_after - cpu_before) / checks * 1e6, checks / elapsed


async def run(options: argparse.Namespace, url: str, port: int) -> list[dict[str, Any]]:
    admin = redis.Redis(port=port)
    rows: list[dict[str, Any]] = []
    for algorithm in options.algorithms:
        subjects = [
            await moderato_subject(url, algorithm, batched=False),
            await moderato_subject(url, algorithm, batched=True),
            *limits_subjects(port, algorithm),
            *throttled_subjects(port, algorithm),
            *await reference_subjects(port, algorithm),
        ]
        for hot in (False, True):
            samples: dict[str, list[float]] = {s.name: [] for s in subjects}
            rates: dict[str, list[float]] = {s.name: [] for s in subjects}
            for turn in range(options.trials):
                order = subjects[turn % len(subjects) :] + subjects[: turn % len(subjects)]
                for subject in order:
                    us, checks_per_s = await trial(subject, admin, hot, options.seconds)
                    samples[subject.name].append(us)
                    rates[subject.name].append(checks_per_s)
            medians = {name: statistics.median(values) for name, values in samples.items()}
            peers = {
                s.name: medians[s.name]
                for s in subjects
                if s.library not in ("moderato", "reference")
            }
            best_name = min(peers, key=peers.__getitem__) if peers else None
            row: dict[str, Any] = {
                "algorithm": algorithm,
                "identities": "one hot" if hot else f"{IDENTITIES:,}",
                "redis_us_per_decision": medians,
                "checks_per_s": {name: statistics.median(v) for name, v in rates.items()},
                "trials_us": samples,
                "best_peer": best_name,
            }
            if best_name is not None:
                for mode in ("off", "on"):
                    row[f"batching_{mode}_over_best_peer"] = (
                        medians[f"moderato, batching {mode}"] / peers[best_name]
                    )
            rows.append(row)
            line = ", ".join(
                f"{name} {us:.2f} ({row['checks_per_s'][name]:,.0f}/s)"
                for name, us in medians.items()
            )
            ratios = (
                f"; on/best peer {row['batching_on_over_best_peer']:.2f}x"
                if best_name is not None
                else ""
            )
            print(
                f"{algorithm:<15} {row['identities']:>8}: Redis us/decision {line}{ratios}",
                flush=True,
            )
        for subject in subjects:
            await subject.close()
    return rows


def main() -> None:
    options = in_situ_options(__doc__, ALGORITHMS).parse_args()
    server = RedisServer().start()
    run_in_situ("peers_in_situ", options, server, lambda: run(options, server.url, server.port))


if __name__ == "__main__":
    main()
