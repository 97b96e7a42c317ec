"""The cost of one check through the public API, for before/after comparisons.

Times ``check_with_info`` on ``memory://`` (one identity, many keys) and on a
private redis-server over a unix socket (sequential, so one round trip each,
and 64 concurrent checks per batch). The figures are this process's CPU time
per check (time.process_time, the least disturbed of several trials): on a
shared machine wall time mostly measures the neighbours, and for Redis the
client's CPU is what the limiter's code decides. Not a unit test: it prints.

    python benchmarks/hot_path.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moderato import RateLimiter  # noqa: E402


async def per_check_us(limiter: RateLimiter, count: int, trials: int, keys: int) -> float:
    names = [f"user-{i}" for i in range(keys)]
    for i in range(min(count, 5000)):
        await limiter.check_with_info(names[i % keys], "1000000/minute")
    best = []
    for _ in range(trials):
        started = time.process_time()
        for i in range(count):
            await limiter.check_with_info(names[i % keys], "1000000/minute")
        best.append((time.process_time() - started) / count * 1e6)
    return min(best)  # the least disturbed trial: the machine is shared


async def batch_us(limiter: RateLimiter, batches: int, width: int) -> float:
    async def one(i: int) -> None:
        await limiter.check_with_info(f"user-{i}", "1000000/minute")

    for _ in range(50):
        await asyncio.gather(*(one(i) for i in range(width)))
    best = []
    for _ in range(5):
        started = time.process_time()
        for _ in range(batches):
            await asyncio.gather(*(one(i) for i in range(width)))
        best.append((time.process_time() - started) / (batches * width) * 1e6)
    return min(best)


async def main() -> None:
    memory = RateLimiter("memory://")
    one_key = await per_check_us(memory, 100_000, 7, 1)
    print(f"memory:// check_with_info, one key:   {one_key:.2f} us CPU")
    many_keys = await per_check_us(memory, 100_000, 7, 10_000)
    print(f"memory:// check_with_info, 10k keys:  {many_keys:.2f} us CPU")
    with tempfile.TemporaryDirectory() as directory:
        sock = os.path.join(directory, "redis.sock")
        server = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", sock, "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                if os.path.exists(sock):
                    break
                time.sleep(0.05)
            redis = RateLimiter(f"unix://{sock}", command_timeout_s=10)
            await redis.connect()
            sequential = await per_check_us(redis, 10_000, 5, 100)
            print(f"unix:// check_with_info, sequential:  {sequential:.2f} us CPU")
            batched = await batch_us(redis, 300, 64)
            print(f"unix:// check_with_info, 64 at once: {batched:.2f} us CPU/check")
            await redis.close()
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    asyncio.run(main())
