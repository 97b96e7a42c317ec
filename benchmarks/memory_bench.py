"""memory:// in process against the limits library's MemoryStorage, in one run.

Sequential checks/s on one thread, the same rates and traffic for every
contender:

- hot key: one identity, "1000/second" (mostly denials once a window fills);
- many keys: 10,000 identities in turn, "100/minute" (every check admitted);

moderato ``RateLimiter("memory://").check_with_info`` (awaited, the public API)
for the fixed window, the exact rolling window (sliding_log) and the
two-counter sliding window, against limits' ``FixedWindowRateLimiter``,
``MovingWindowRateLimiter`` and ``SlidingWindowCounterRateLimiter`` over
``MemoryStorage`` (the async API, which is what an async app calls, and the
sync one). The layers under moderato's public API are timed too:
``MemoryBackend.decide`` and the C ``MemoryStore.decide`` on prebuilt keys.

Then the resident memory after 1,000,000 distinct identities (``memory://``'s
default cap is 1,000,000 entries; also at a 100,000 cap) and, for scale,
limits' MemoryStorage after the same traffic.

    python benchmarks/memory_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moderato import RateLimiter, _accel  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.backends.memory import MemoryBackend  # noqa: E402
from moderato.policy import Rate  # noqa: E402

PAIRS = (  # moderato algorithm, limits strategy class name, what the pair is
    ("fixed_window", "FixedWindowRateLimiter", "fixed window"),
    ("sliding_log", "MovingWindowRateLimiter", "moving (exact rolling) window"),
    ("sliding_window", "SlidingWindowCounterRateLimiter", "sliding window counter"),
)
SCENARIOS = (("hot key", "1000/second", 1), ("many keys", "100/minute", 10_000))


async def rate_async(check: Callable[[int], Awaitable[Any]], count: int, trials: int) -> float:
    for i in range(min(count, 20_000)):  # warm up
        await check(i)
    results = []
    for _ in range(trials):
        started = time.perf_counter()
        for i in range(count):
            await check(i)
        results.append(count / (time.perf_counter() - started))
    return statistics.median(results)


def rate_sync(check: Callable[[int], Any], count: int, trials: int) -> float:
    for i in range(min(count, 20_000)):
        check(i)
    results = []
    for _ in range(trials):
        started = time.perf_counter()
        for i in range(count):
            check(i)
        results.append(count / (time.perf_counter() - started))
    return statistics.median(results)


def moderato_check(rate: str, algorithm: str, names: list[str]) -> Callable[[int], Awaitable[Any]]:
    limiter = RateLimiter("memory://", key_prefix="bench")
    count = len(names)

    async def check(i: int) -> Any:
        return await limiter.check_with_info(names[i % count], rate, algorithm=algorithm)

    return check


def limits_checks(
    rate: str, strategy: str, names: list[str]
) -> tuple[Callable[[int], Awaitable[Any]], Callable[[int], Any]]:
    from limits import parse
    from limits import storage as sync_storage
    from limits import strategies as sync_strategies
    from limits.aio import storage as async_storage
    from limits.aio import strategies as async_strategies

    item, count = parse(rate), len(names)
    aio = getattr(async_strategies, strategy)(async_storage.MemoryStorage())
    sync = getattr(sync_strategies, strategy)(sync_storage.MemoryStorage())

    async def aio_check(i: int) -> Any:
        return await aio.hit(item, names[i % count])

    def sync_check(i: int) -> Any:
        return sync.hit(item, names[i % count])

    return aio_check, sync_check


async def throughput(count: int, trials: int) -> None:
    print(f"checks/s, sequential, median of {trials} runs of {count:,} checks\n")
    header = f"{'scenario':<10} {'moderato algorithm / limits strategy':<46} {'moderato':>9} "
    print(header + f"{'limits aio':>11} {'limits sync':>12} {'vs aio':>7} {'vs sync':>8}")
    for scenario, rate, identities in SCENARIOS:
        names = [f"client-{i}" for i in range(identities)]
        for algorithm, strategy, _ in PAIRS:
            ours = await rate_async(moderato_check(rate, algorithm, names), count, trials)
            aio_check, sync_check = limits_checks(rate, strategy, names)
            theirs_aio = await rate_async(aio_check, count, trials)
            theirs_sync = rate_sync(sync_check, count, trials)
            pair = f"{algorithm} / {strategy.removesuffix('RateLimiter')}"
            print(
                f"{scenario:<10} {pair:<46} {ours:>9,.0f} {theirs_aio:>11,.0f} "
                f"{theirs_sync:>12,.0f} {ours / theirs_aio:>6.2f}x {ours / theirs_sync:>7.2f}x"
            )
            gc.collect()


def layer_checks(
    algorithm: str,
) -> tuple[Callable[[int], Any], Callable[[int], Awaitable[Any]], Callable[[int], Awaitable[Any]]]:
    limiter = RateLimiter("memory://", key_prefix="bench")
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    chosen = ALGORITHMS[algorithm]
    keys = _accel.build_keys("bench", chosen.key_tag, "", "global", "u", (1,))
    args = (1000, 1, *chosen.policy_args(Rate(1_000_000, 1)))
    store, now_ms = backend.store, int(time.time() * 1000)

    def store_check(_: int) -> Any:
        return store.decide(algorithm, keys, args, now_ms)

    async def backend_check(_: int) -> Any:
        return await backend.direct_reply(chosen, keys, args)

    async def limiter_check(_: int) -> Any:
        return await limiter.check_with_info("u", "1000000/second", algorithm=algorithm)

    return store_check, backend_check, limiter_check


async def layers(count: int, trials: int) -> None:
    print(f"\nthe layers of one check, one key, '1000000/second', {count:,} calls")
    print(
        f"{'algorithm':<15} {'MemoryStore.decide':>19} {'MemoryBackend.direct_reply':>27} "
        f"{'RateLimiter.check_with_info':>28}   (checks/s; ns/check)"
    )
    for algorithm in ALGORITHMS:
        store_check, backend_check, limiter_check = layer_checks(algorithm)
        rates = (
            rate_sync(store_check, count, trials),
            await rate_async(backend_check, count, trials),
            await rate_async(limiter_check, count, trials),
        )
        cells = [f"{value:,.0f}; {1e9 / value:,.0f}" for value in rates]
        print(f"{algorithm:<15} {cells[0]:>19} {cells[1]:>27} {cells[2]:>28}")


RSS_CHILD = """
import asyncio, gc, logging, os, sys, time
sys.path.insert(0, {root!r})
logging.getLogger("moderato").setLevel(logging.ERROR)

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

async def moderato(url, identities):
    from moderato import RateLimiter
    limiter = RateLimiter(url, key_prefix="flood")
    await limiter.check_with_info("warm-up", "10/minute")
    gc.collect()
    before = rss()
    for i in range(identities):
        await limiter.check_with_info(f"client-{{i}}", "10/minute")
    gc.collect()
    return rss() - before, len(limiter.backend.store)

def limits(identities):
    from limits import parse, storage, strategies
    fixed = strategies.FixedWindowRateLimiter(storage.MemoryStorage())
    item = parse("10/minute")
    fixed.hit(item, "warm-up")
    gc.collect()
    before = rss()
    for i in range(identities):
        fixed.hit(item, f"client-{{i}}")
    gc.collect()
    return rss() - before, identities

started = time.perf_counter()
kind, url, identities = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "moderato":
    grown, entries = asyncio.run(moderato(url, identities))
else:
    grown, entries = limits(identities)
print(grown, entries, time.perf_counter() - started)
"""


def memory(identities: int) -> None:
    print(f"\nresident memory added by {identities:,} distinct identities ('10/minute'),")
    print("each measured in a fresh process")
    child = RSS_CHILD.format(root=str(ROOT))
    for label, kind, url in (
        ("memory:// (default cap 1,000,000)", "moderato", "memory://"),
        ("memory://?max_entries=100000", "moderato", "memory://?max_entries=100000"),
        ("limits MemoryStorage, fixed window", "limits", "-"),
    ):
        output = subprocess.run(
            [sys.executable, "-c", child, kind, url, str(identities)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        grown, entries, elapsed = int(output[0]), int(output[1]), float(output[2])
        print(
            f"  {label:<36} +{grown / 2**20:7.1f} MiB  {entries:>9,} entries "
            f"({grown / max(entries, 1):.0f} B/entry)  {elapsed:5.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer checks, fewer identities")
    options = parser.parse_args()
    count, trials, identities = (20_000, 3, 100_000) if options.quick else (100_000, 5, 1_000_000)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    # memory:// says once that its limits are per process; keep the output to the figures.
    import logging

    logging.getLogger("moderato").setLevel(logging.ERROR)
    asyncio.run(throughput(count, trials))
    asyncio.run(layers(count, trials))
    memory(identities)


if __name__ == "__main__":
    main()
