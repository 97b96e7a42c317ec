"""One process of tests/redis/test_sync_shared_quota.py: 50 threads (blocking limiter) or 50 tasks
(asyncio limiter) checking one key at the same instant; prints how many were admitted.

    python shared_quota_worker.py sync|async URL PREFIX RATE ALGORITHM...

(SHARED_QUOTA_WORKERS and SHARED_QUOTA_CHECKS_EACH in the environment change the
50 threads or tasks and the 2 checks each; SHARED_QUOTA_TIMEOUT_S both limiters'
command timeout, 10 s by default, since the counts are what is checked and a busy
machine must not turn a late reply into an error.) Tests start the processes with
``run_workers``.

It connects and loads the scripts first (a check on another key), prints
``ready`` and reads the start instant (a wall-clock time) from its standard
input; then it runs each algorithm's burst at its own instant (the start,
then one STEP_S later for each next algorithm, the same in every process)
and prints one JSON line: {algorithm: admitted}.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from moderato import RateLimiter
from moderato.sync import RateLimiter as BlockingRateLimiter

WORKERS = int(os.environ.get("SHARED_QUOTA_WORKERS", "50"))
CHECKS_EACH = int(os.environ.get("SHARED_QUOTA_CHECKS_EACH", "2"))
STEP_S = 1.0


def wait_until(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def ready() -> float:
    """Say so, and read the start instant."""
    print("ready", flush=True)
    return float(sys.stdin.readline())


def blocking(url: str, prefix: str, rate: str, algorithms: list[str]) -> None:
    limiter = BlockingRateLimiter(
        url,
        key_prefix=prefix,
        max_connections=WORKERS,
        command_timeout_s=float(os.environ.get("SHARED_QUOTA_TIMEOUT_S", "10")),
    )
    for algorithm in algorithms:
        limiter.check_with_info("warm-up", rate, algorithm=algorithm)
    start_at = ready()
    admitted: dict[str, int] = {}
    with ThreadPoolExecutor(WORKERS) as pool:
        for index, algorithm in enumerate(algorithms):
            at = start_at + index * STEP_S

            def burst(_: int, algorithm: str = algorithm, at: float = at) -> int:
                wait_until(at)
                return sum(
                    limiter.check_with_info("hot", rate, algorithm=algorithm).allowed
                    for _ in range(CHECKS_EACH)
                )

            admitted[algorithm] = sum(pool.map(burst, range(WORKERS)))
    limiter.close()
    print(json.dumps(admitted), flush=True)


async def asynchronous(url: str, prefix: str, rate: str, algorithms: list[str]) -> None:
    limiter = RateLimiter(
        url,
        key_prefix=prefix,
        command_timeout_s=float(os.environ.get("SHARED_QUOTA_TIMEOUT_S", "10")),
    )
    # SHARED_QUOTA_BATCH=1: the client joins a loop turn's checks into batched calls (0:
    # it does not); unset, the URL decides (?batch_decisions=true), off by default.
    if "SHARED_QUOTA_BATCH" in os.environ:
        batch = os.environ["SHARED_QUOTA_BATCH"] == "1"
        limiter.backend.client.batch_decisions = batch  # type: ignore[attr-defined]
    for algorithm in algorithms:
        # Two at once: when batching, one batched call, its script loaded before the start.
        await asyncio.gather(
            *(limiter.check_with_info("warm-up", rate, algorithm=algorithm) for _ in range(2))
        )
    start_at = ready()
    admitted: dict[str, int] = {}
    for index, algorithm in enumerate(algorithms):
        await asyncio.sleep(max(0.0, start_at + index * STEP_S - time.time()))

        async def burst(algorithm: str = algorithm) -> int:
            allowed = 0
            for _ in range(CHECKS_EACH):
                allowed += (await limiter.check_with_info("hot", rate, algorithm=algorithm)).allowed
            return allowed

        admitted[algorithm] = sum(await asyncio.gather(*(burst() for _ in range(WORKERS))))
    await limiter.close()
    print(json.dumps(admitted), flush=True)


def start_instant() -> float:
    """Half a second from now, with no minute boundary in the 8 s after it (the fixed
    and sliding windows would start over there)."""
    start_at = time.time() + 0.5
    if start_at % 60 > 50:
        start_at += 61 - start_at % 60
    return start_at


def run_workers(
    kinds: Sequence[str],
    url: str,
    prefix: str,
    rate: str,
    algorithms: Sequence[str],
    environment: Optional[Mapping[str, str]] = None,
) -> list[dict[str, int]]:
    """Start one worker process per kind ("sync" or "async"), wait until every one is
    ready, give them one start instant, and return each one's {algorithm: admitted}."""
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, kind, url, prefix, rate, *algorithms],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=None if environment is None else {**os.environ, **environment},
        )
        for kind in kinds
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
    return reports


def main() -> None:
    kind, url, prefix, rate, *algorithms = sys.argv[1:]
    if kind == "sync":
        blocking(url, prefix, rate, algorithms)
    else:
        asyncio.run(asynchronous(url, prefix, rate, algorithms))


if __name__ == "__main__":
    main()
