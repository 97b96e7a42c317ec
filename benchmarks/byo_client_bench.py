"""The limiter over a user's own redis-py client, beside moderato's built-in client.

Starts its own redis-server (tests/redis_servers.py) and measures
``RateLimiter.check_with_info`` (fixed window, one key per task from a
10,000-key space) for a fixed time, sequentially and from 10 and 100
concurrent tasks on one event loop, through:

- ``built-in``: ``RateLimiter("redis://...")`` (the defaults: 2 auto-pipelined connections);
- ``redis-py``: ``RateLimiter(redis.asyncio.Redis(connection_pool=BlockingConnectionPool(
  max_connections=50)))``: a pool of up to 50 connections, one command per
  connection at a time, which is how redis-py works.

Prints checks/s per client and concurrency, the median over ``--rounds``
rounds (the clients alternate within a round, as the machine may be shared),
and redis-py's figure as a fraction of the built-in one.

    .venv/bin/python benchmarks/byo_client_bench.py [--seconds S] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis.asyncio  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato import RateLimiter  # noqa: E402

KEY_SPACE = 10_000
CONCURRENCY = (1, 10, 100)


async def checks_per_s(limiter: RateLimiter, tasks: int, duration_s: float) -> float:
    done = 0
    stop_at = time.perf_counter() + duration_s

    async def worker(start: int) -> None:
        nonlocal done
        index = start
        while time.perf_counter() < stop_at:
            await limiter.check_with_info(f"user:{index % KEY_SPACE}", "1000000/hour")
            index += tasks
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(tasks)))
    return done / (time.perf_counter() - started)


def built_in(url: str) -> tuple[RateLimiter, Callable[[], Any]]:
    limiter = RateLimiter(url, key_prefix="bench")
    return limiter, limiter.close


def redis_py(url: str) -> tuple[RateLimiter, Callable[[], Any]]:
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=50, timeout=5)
    client = redis.asyncio.Redis(connection_pool=pool)
    return RateLimiter(client, key_prefix="bench"), client.aclose


async def run(url: str, seconds: float, rounds: int) -> dict[tuple[str, int], list[float]]:
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, make in (("built-in", built_in), ("redis-py", redis_py)):
            limiter, close = make(url)
            await limiter.check_with_info("warm-up", "1000000/hour")
            for tasks in CONCURRENCY:
                rate = await checks_per_s(limiter, tasks, seconds)
                results.setdefault((name, tasks), []).append(rate)
            await close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    server = RedisServer().start()
    try:
        results = asyncio.run(run(server.url, options.seconds, options.rounds))
    finally:
        server.close()
    print(f"checks/s, median of {options.rounds} rounds of {options.seconds:g} s")
    print(f"{'tasks':>6} {'built-in':>10} {'redis-py':>10} {'redis-py/built-in':>18}")
    for tasks in CONCURRENCY:
        ours = statistics.median(results[("built-in", tasks)])
        theirs = statistics.median(results[("redis-py", tasks)])
        print(f"{tasks:>6} {ours:>10,.0f} {theirs:>10,.0f} {theirs / ours:>18.2f}")


if __name__ == "__main__":
    main()
