"""What the dashboard's recorder adds to a check, and what its lock costs under threads.

The recorder (moderato/dashboard/recorder.py) is called once per check when
one is attached. Its counters are changed under a lock, so that the blocking
limiter's threads count exactly. Two measurements, on ``memory://`` (the
recorder's work does not depend on the backend):

* instructions per call under ``valgrind --tool=callgrind``: the process runs
  every step's warm-up, then COUNT calls of one step; a step's figure is
  (its total - the total of a run with no calls) / COUNT, which the machine's
  other work cannot disturb. Steps:

      recorder_decided      recorder.decided() alone (one admitted check's result)
      sync_check            moderato.sync.RateLimiter.check_with_info, no recorder
      sync_check_recorded   the same with a recorder attached
      async_check           moderato.RateLimiter.check_with_info, awaited, no recorder
      async_check_recorded  the same with a recorder attached

* the CPU time (the process's, every thread's) of THREADS threads each
  making CHECKS blocking checks (each its own identity) without and with a
  recorder, alternated trial by trial, on
  ``memory://`` (no I/O: the threads contend for the interpreter all the
  time, the lock's worst case) and on a private redis-server (unix socket):
  what recording costs when every thread records at once.

    python benchmarks/recorder_threads.py                  # both
    python benchmarks/recorder_threads.py --no-threads     # instructions only

Run it from another checkout's root (copied there) to measure that
checkout's recorder: it imports moderato from the directory above its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.callgrind_steps import callgrind_total  # noqa: E402
from moderato import RateLimiter  # noqa: E402
from moderato.dashboard.recorder import DecisionRecorder  # noqa: E402
from moderato.sync import RateLimiter as SyncRateLimiter  # noqa: E402

RATE = "1000000/minute"
KEY = "user-1"
WARMUP = 500  # the interpreter specialises after a few dozen calls
STEPS = (
    "recorder_decided",
    "sync_check",
    "sync_check_recorded",
    "async_check",
    "async_check_recorded",
)


def build_steps() -> dict[str, Callable[[int], None]]:
    """Each step as a function making ``count`` calls of it."""
    quiet = {"key_prefix": "bench"}
    sync_plain = SyncRateLimiter("memory://", **quiet)
    sync_recorded = SyncRateLimiter("memory://", **quiet)
    sync_recorded.recorder = DecisionRecorder()
    async_plain = RateLimiter("memory://", **quiet)
    async_recorded = RateLimiter("memory://", **quiet)
    async_recorded.recorder = DecisionRecorder()
    recorder = DecisionRecorder()
    plan = sync_plain._plans.get(RATE, None)
    result = sync_plain.check_with_info(KEY, RATE)

    def recorder_decided(count: int) -> None:
        decided, started_s = recorder.decided, time.perf_counter()
        for _ in range(count):
            decided(plan, KEY, "global", result, started_s)

    def sync_check(count: int) -> None:
        check = sync_plain.check_with_info
        for _ in range(count):
            check(KEY, RATE)

    def sync_check_recorded(count: int) -> None:
        check = sync_recorded.check_with_info
        for _ in range(count):
            check(KEY, RATE)

    def awaited(limiter: RateLimiter) -> Callable[[int], None]:
        async def calls(count: int) -> None:
            check = limiter.check_with_info
            for _ in range(count):
                await check(KEY, RATE)

        loop = asyncio.new_event_loop()
        return lambda count: loop.run_until_complete(calls(count))

    return {
        "recorder_decided": recorder_decided,
        "sync_check": sync_check,
        "sync_check_recorded": sync_check_recorded,
        "async_check": awaited(async_plain),
        "async_check_recorded": awaited(async_recorded),
    }


def run_step(name: str, count: int) -> None:
    """Every step's warm-up, then ``count`` calls of ``name`` (the callgrind child)."""
    steps = build_steps()
    for step in steps.values():
        step(WARMUP)
    if name != "none":
        steps[name](count)


def instructions(count: int) -> dict[str, float]:
    script = [sys.executable, str(Path(__file__).resolve()), "--child"]
    base = callgrind_total([*script, "none", "0"])
    figures = {}
    for name in STEPS:
        total = callgrind_total([*script, name, str(count)])
        figures[name] = (total - base) / count
        print(f"{name:22} {figures[name]:9.0f} instructions per call", flush=True)
    added = figures["sync_check_recorded"] - figures["sync_check"]
    print(f"{'recording, blocking':22} {added:+9.0f} per check", flush=True)
    added = figures["async_check_recorded"] - figures["async_check"]
    print(f"{'recording, asyncio':22} {added:+9.0f} per check", flush=True)
    return figures


def threaded_s(url: str, threads: int, checks: int, recorded: bool) -> float:
    """CPU seconds this process spent (every thread's) while ``threads`` threads made
    ``checks`` checks each: on a shared machine, steadier than the wall time."""
    limiter = SyncRateLimiter(url, key_prefix="bench-threads", max_connections=threads)
    if recorded:
        limiter.recorder = DecisionRecorder()
    start = threading.Barrier(threads + 1)

    def work(thread: int) -> None:
        check, identity = limiter.check_with_info, f"user-{thread}"
        check(identity, RATE)
        start.wait()
        for _ in range(checks):
            check(identity, RATE)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.process_time()
    for worker in workers:
        worker.join()
    spent_s = time.process_time() - began
    limiter.close()
    return spent_s


def threaded(url: str, threads: int, checks: int, trials: int) -> None:
    ratios = []
    for trial in range(trials):
        order = (False, True) if trial % 2 == 0 else (True, False)
        seconds = {recorded: threaded_s(url, threads, checks, recorded) for recorded in order}
        ratios.append(seconds[True] / seconds[False])
        print(
            f"{url.split(':')[0]} trial {trial + 1}: {threads} threads x {checks} checks: "
            f"{seconds[False] * 1e6 / (threads * checks):.2f} us of CPU per check without, "
            f"{seconds[True] * 1e6 / (threads * checks):.2f} with a recorder "
            f"(x{ratios[-1]:.3f})",
            flush=True,
        )
    print(f"median with/without: x{statistics.median(ratios):.3f} over {trials} trials")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("STEP", "COUNT"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=5000, help="calls per callgrind run")
    parser.add_argument("--no-instructions", action="store_true")
    parser.add_argument("--no-threads", action="store_true")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--checks", type=int, default=5000, help="checks per thread")
    parser.add_argument("--trials", type=int, default=6)
    options = parser.parse_args()
    if options.child:
        run_step(options.child[0], int(options.child[1]))
        return
    print(f"moderato from {ROOT}; load average {os.getloadavg()}", flush=True)
    if not options.no_instructions:
        instructions(options.count)
    if not options.no_threads:
        threaded("memory://", options.threads, options.checks, options.trials)
        with tempfile.TemporaryDirectory() as directory:
            socket_path = os.path.join(directory, "redis.sock")
            server = subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", socket_path, "--save", ""],
                stdout=subprocess.DEVNULL,
            )
            try:
                while not os.path.exists(socket_path):
                    time.sleep(0.05)
                threaded(f"unix://{socket_path}", options.threads, options.checks, options.trials)
            finally:
                server.terminate()
                server.wait()
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
