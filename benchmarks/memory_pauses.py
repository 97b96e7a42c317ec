"""How long memory:// holds the event loop in one go, at 1,000,000 entries.

memory:// decides inside the event loop's thread, holding the GIL, so the
longest single store call is the longest stall every other request on that
loop sees. Three figures:

- growth: every ``MemoryStore.decide`` timed on its own while the table fills
  to ``--entries`` distinct keys (one fixed-window key per identity, keys
  built as the limiter builds them, the store swept as ``MemoryBackend``
  sweeps it): the longest call, the calls above 1 ms, and percentiles;
- reset: ``RateLimiter.reset(identity)`` without a rate, unscoped and with a
  scope, on the full table (the identity holds a few keys on a few scopes);
- sweep: ``MemoryBackend.sweep()`` on the full table, once with nothing to
  drop and once with every entry expired;
- and what the table's bookkeeping costs a decision: CPU ns per
  ``MemoryStore.decide`` for a new key at the cap (each evicts one) and for a
  key already there (best of three runs of 100,000), and the resident memory
  a store of ``--entries`` keys takes per entry.

For reset and sweep the figure is the longest stretch during which a
concurrent task on the same loop could not run (a task that yields in a loop
and records the longest gap between its turns), beside the call's total time.
The growth's pauses are single C calls. Every figure is given twice: in wall
time, and in the thread's CPU time (``time.thread_time_ns``), which a busy
machine taking the core away does not inflate; on a shared machine the CPU
figures are the ones to compare.

    python benchmarks/memory_pauses.py --label after [--entries 1000000]

Writes benchmarks/results/memory-pauses-<label>-<UTC time>.json and prints a
summary. Wall times on a shared machine are noisy: the load average is
recorded with the results; compare runs made under a similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import platform
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
from moderato.backends.memory import MemoryBackend  # noqa: E402

PREFIX = "pauses"
TAG = "fw"  # the fixed window's key tag
WINDOW_S = 60
ARGS = (1000, 1, 100_000, WINDOW_S)  # cost 1, charge, 100/minute
START_MS = 1_800_000_000_000
SCOPES = ("GET:/items", "POST:/items", "GET:/users")
RESET_SAMPLES = 20


class Clock:
    """The backend's clock: moved by hand, so nothing expires unless asked."""

    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


def identity_keys(identity: str, scope: str) -> list[bytes]:
    return _accel.build_keys(PREFIX, TAG, "", scope, identity, (WINDOW_S,))


def percentile(sorted_values: list[int], fraction: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def distribution(durations_ns: list[int], slot_counts: list[int]) -> dict[str, Any]:
    longest = sorted(range(len(durations_ns)), key=durations_ns.__getitem__, reverse=True)[:8]
    ordered = sorted(durations_ns)
    return {
        "longest_ms": durations_ns[longest[0]] / 1e6,
        "longest_calls": [
            {"entries_before": i, "ms": durations_ns[i] / 1e6, "slot_count_after": slot_counts[i]}
            for i in longest
        ],
        "calls_over_1ms": sum(1 for d in durations_ns if d > 1_000_000),
        "calls_over_100us": sum(1 for d in durations_ns if d > 100_000),
        "median_us": statistics.median(ordered) / 1e3,
        "p99_us": percentile(ordered, 0.99) / 1e3,
        "p99_99_us": percentile(ordered, 0.9999) / 1e3,
        "total_s": sum(durations_ns) / 1e9,
    }


def grow(store: _accel.MemoryStore, entries: int, reset_identities: int) -> dict[str, Any]:
    """Fill the table to ``entries`` keys, timing every decide call."""
    wall_ns: list[int] = []
    cpu_ns: list[int] = []
    slot_counts: list[int] = []
    resizing: list[bool] = []
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    decide = store.decide
    # Stores with incremental resizes say whether one is in progress (read
    # outside the timed call).
    stats = getattr(store, "table_stats", None)
    # The identities reset later hold one key on every scope; the rest one key each.
    keys = [identity_keys(f"reset-{i}", scope) for i in range(reset_identities) for scope in SCOPES]
    keys += [identity_keys(f"client-{i}", SCOPES[0]) for i in range(entries - len(keys))]
    for key in keys:
        if stats is not None:
            resizing.append(stats()["resize_slots_left"] > 0)
        started_cpu = cpu()
        started = wall()
        decide("fixed_window", key, ARGS, START_MS)
        ended = wall()
        cpu_ns.append(cpu() - started_cpu)
        wall_ns.append(ended - started)
        slot_counts.append(store.slot_count)
    assert len(store) == entries, (len(store), entries)
    figures: dict[str, Any] = {
        "entries": entries,
        "slot_count": store.slot_count,
        "wall": distribution(wall_ns, slot_counts),
        "cpu": distribution(cpu_ns, slot_counts),
    }
    if resizing:
        during = [d for d, busy in zip(cpu_ns, resizing) if busy]
        figures["cpu_during_a_resize"] = {
            "calls": len(during),
            "longest_ms": max(during, default=0) / 1e6,
            "calls_over_100us": sum(1 for d in during if d > 100_000),
        }
        outside = [d for d, busy in zip(cpu_ns, resizing) if not busy]
        figures["cpu_outside_a_resize"] = {
            "calls": len(outside),
            "longest_ms": max(outside, default=0) / 1e6,
            "calls_over_100us": sum(1 for d in outside if d > 100_000),
        }
    return figures


Stall = tuple[Any, float, float, float, float]


async def loop_stall(operation: Callable[[], Awaitable[Any]]) -> Stall:
    """Run ``operation`` beside a task that yields in a loop: (result, the longest
    gap between that task's turns in wall ms and in CPU ms, the operation's total
    wall ms and CPU ms)."""
    gaps: list[float] = []
    cpu_gaps: list[float] = []
    running = True

    async def ticker() -> None:
        last, last_cpu = time.perf_counter(), time.thread_time()
        while running:
            await asyncio.sleep(0)
            now, now_cpu = time.perf_counter(), time.thread_time()
            gaps.append(now - last)
            cpu_gaps.append(now_cpu - last_cpu)
            last, last_cpu = now, now_cpu

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started, started_cpu = time.perf_counter(), time.thread_time()
    result = await operation()
    total_ms = (time.perf_counter() - started) * 1e3
    total_cpu_ms = (time.thread_time() - started_cpu) * 1e3
    running = False
    await task
    return result, max(gaps) * 1e3, max(cpu_gaps) * 1e3, total_ms, total_cpu_ms


async def sweep_now(backend: MemoryBackend) -> int:
    # sweep() is a plain call that walks the whole table on older versions.
    result = backend.sweep()
    if inspect.isawaitable(result):
        result = await result
    return int(result)


def summary(samples: list[Stall]) -> dict[str, Any]:
    figures: dict[str, Any] = {"samples": len(samples), "results": [s[0] for s in samples]}
    for index, name in ((1, "stall_ms"), (2, "stall_cpu_ms"), (3, "total_ms"), (4, "total_cpu_ms")):
        values = sorted(s[index] for s in samples)
        figures[f"longest_{name}"] = values[-1]
        figures[f"median_{name}"] = statistics.median(values)
    return figures


def decide_cost_ns() -> dict[str, float]:
    """CPU ns per decide: a new key on a table at its cap (100,000), a key it holds."""
    cap = 100_000
    store = MemoryBackend(max_entries=cap).store  # swept as memory:// sweeps it
    keys = [identity_keys(f"cost-{i}", SCOPES[0]) for i in range(cap + 300_000)]
    decide = store.decide
    for key in keys[:cap]:
        decide("fixed_window", key, ARGS, START_MS)
    figures: dict[str, float] = {}
    for name, batches in (
        ("new_key_at_cap_ns", [keys[cap + i * cap : cap + (i + 1) * cap] for i in range(3)]),
        ("held_key_ns", [keys[-cap:]] * 3),
    ):
        best = float("inf")
        for batch in batches:
            started = time.thread_time_ns()
            for key in batch:
                decide("fixed_window", key, ARGS, START_MS)
            best = min(best, (time.thread_time_ns() - started) / len(batch))
        figures[name] = best
    return figures


def store_bytes_per_entry(entries: int) -> float:
    """Resident memory a MemoryBackend's store adds per entry, at ``entries``
    fixed-window keys of distinct identities (keys not kept by this process)."""
    gc.collect()
    before = rss_mib()
    store = MemoryBackend(max_entries=entries).store
    for i in range(entries):
        store.decide("fixed_window", identity_keys(f"size-{i}", SCOPES[0]), ARGS, START_MS)
    gc.collect()
    grown_mib = rss_mib() - before
    del store
    return grown_mib * 2**20 / entries


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def run(entries: int) -> dict[str, Any]:
    # First, while the process is fresh: nothing freed earlier to reuse.
    bytes_per_entry = store_bytes_per_entry(entries)
    clock = Clock()
    rss_before = rss_mib()
    limiter = RateLimiter(f"memory://?max_entries={entries}", key_prefix=PREFIX)
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    backend.clock = clock
    results: dict[str, Any] = {"store_bytes_per_entry": bytes_per_entry}

    results["growth"] = grow(backend.store, entries, 2 * RESET_SAMPLES)
    results["rss_mib_at_entries"] = rss_mib() - rss_before

    results["sweep_nothing_to_drop"] = summary(
        [await loop_stall(lambda: sweep_now(backend)) for _ in range(3)]
    )
    unscoped = [
        await loop_stall(lambda i=i: limiter.reset(f"reset-{i}")) for i in range(RESET_SAMPLES)
    ]
    results["reset_unscoped"] = summary(unscoped)
    scoped = [
        await loop_stall(lambda i=i: limiter.reset(f"reset-{RESET_SAMPLES + i}", scope=SCOPES[1]))
        for i in range(RESET_SAMPLES)
    ]
    results["reset_one_scope_no_rate"] = summary(scoped)
    assert all(s[0] == len(SCOPES) for s in unscoped), [s[0] for s in unscoped]
    assert all(s[0] == 1 for s in scoped), [s[0] for s in scoped]

    live = len(backend.store)
    clock.now_ms += 3 * WINDOW_S * 1000  # every window has ended
    results["sweep_all_expired"] = summary([await loop_stall(lambda: sweep_now(backend))])
    results["sweep_all_expired"]["entries_before"] = live
    results["sweep_all_expired"]["entries_after"] = len(backend.store)
    results["decide_cost"] = decide_cost_ns()
    return results


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--label", default="run", help="a word for the result file's name")
    parser.add_argument("--no-save", action="store_true", help="print only")
    parser.add_argument("--commit", help="the commit measured, when the tree is not a checkout")
    options = parser.parse_args()

    load_before = os.getloadavg()
    results = asyncio.run(run(options.entries))
    record = {
        "what": "memory:// event-loop pauses (benchmarks/memory_pauses.py)",
        "label": options.label,
        "commit": options.commit or commit(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": results,
    }
    growth = results["growth"]
    print(f"growth to {growth['entries']:,} entries, RSS +{results['rss_mib_at_entries']:.0f} MiB:")
    for clock in ("wall", "cpu"):
        part = growth[clock]
        print(
            f"  {clock}: longest call {part['longest_ms']:.2f} ms "
            f"(at {part['longest_calls'][0]['entries_before']:,} entries), "
            f"{part['calls_over_1ms']} calls over 1 ms, {part['calls_over_100us']} over 100 us; "
            f"median {part['median_us']:.2f} us, p99.99 {part['p99_99_us']:.1f} us"
        )
    for name in ("cpu_during_a_resize", "cpu_outside_a_resize"):
        if name in growth:
            part = growth[name]
            print(
                f"  {name}: {part['calls']:,} calls, longest {part['longest_ms']:.2f} ms, "
                f"{part['calls_over_100us']} over 100 us"
            )
    for name in (
        "sweep_nothing_to_drop",
        "reset_unscoped",
        "reset_one_scope_no_rate",
        "sweep_all_expired",
    ):
        part = results[name]
        print(
            f"{name} ({part['samples']} samples): longest stall {part['longest_stall_ms']:.3f} ms"
            f" wall, {part['longest_stall_cpu_ms']:.3f} ms CPU (medians "
            f"{part['median_stall_ms']:.3f}, {part['median_stall_cpu_ms']:.3f}); total "
            f"{part['longest_total_ms']:.1f} ms wall, {part['longest_total_cpu_ms']:.1f} ms CPU"
        )
    cost = results["decide_cost"]
    print(
        f"decide, CPU per call: new key at the cap {cost['new_key_at_cap_ns']:.0f} ns, "
        f"held key {cost['held_key_ns']:.0f} ns"
    )
    print(f"store memory: {results['store_bytes_per_entry']:.0f} bytes per entry (RSS)")
    print(f"load average {load_before} -> {record['load_average_after']}")
    if not options.no_save:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = ROOT / "benchmarks" / "results" / f"memory-pauses-{options.label}-{stamp}.json"
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
