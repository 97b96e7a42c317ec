"""The blocking limiter's check, step by step: where a moderato.sync check's time goes.

The blocking counterpart of hot_path.py. Starts its own redis-server (loopback
TCP, as sync_bench.py) and measures one call of each step, from the floor up:

    sync_memory         moderato.sync check_with_info on memory://
    async_memory        moderato.RateLimiter check_with_info on memory://, awaited in a loop
    socket_round_trip   sendall + recv_into of a prebuilt EVALSHA on a bare socket (the floor)
    client_evalsha      moderato's blocking client: evalsha() with prebuilt keys and arguments
    sync_redis          moderato.sync check_with_info over Redis (fixed window)
    redis_py_evalsha    redis-py's evalsha() of the same script, keys and arguments

Two measurements:

* CPU time (this thread's) and wall time per call, the best of several
  trials (the machine may be shared; the load average is printed);
* with ``--callgrind-all``: each step under ``valgrind --tool=callgrind``,
  instructions per call = (total - total with a count of 0) / count, in user
  space only (the kernel's socket work is not counted): a figure other
  processes cannot move;
* with ``--syscalls``: the system calls per check of moderato.sync and of
  sync_bench.py's peers (fixed window), from 1 thread and from 16 sharing
  one limiter, counted by ``strace -f -c`` (a run of N checks minus a run of
  none; the redis-server is started outside the traced process).

    python benchmarks/sync_hot_path.py [--count N] [--trials N]
    python benchmarks/sync_hot_path.py --callgrind-all [--callgrind-count N]
    python benchmarks/sync_hot_path.py --syscalls
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import redis  # noqa: E402
from callgrind_steps import add_callgrind_options, instructions_per_call  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

import moderato  # noqa: E402
from moderato import _accel  # noqa: E402
from moderato.policy import SCALE  # noqa: E402
from moderato.scripts import load_script  # noqa: E402
from moderato.sync import RateLimiter  # noqa: E402

RATE = "1000000/hour"
ALGORITHM = "fixed_window"
NAMES = [f"user:{n}" for n in range(1000)]
WARMUP = 2000
STEPS = (
    "sync_memory",
    "async_memory",
    "socket_round_trip",
    "client_evalsha",
    "sync_redis",
    "redis_py_evalsha",
)

Loop = Callable[[int], None]


def build_loops(url: str, host: str, port: int) -> tuple[dict[str, Loop], Callable[[], None]]:
    """Each step as a function running ``count`` calls of it."""
    blocking_memory = RateLimiter("memory://", key_prefix="hot")
    asyncio_memory = moderato.RateLimiter("memory://", key_prefix="hot")
    limiter = RateLimiter(url, key_prefix="hot-sync")
    plan = limiter.plan_for(RATE, ALGORITHM)
    script = load_script(ALGORITHM)
    backend: Any = limiter.backend
    calls = [backend.decision_keys(plan, name, None, "global") for name in NAMES]
    args = (SCALE, 1, *plan.script_args)
    client = backend.client
    payloads = [_accel.encode_evalsha(script.sha, keys, args) for keys in calls]
    redis_py = redis.Redis.from_url(url)
    redis_py.script_load(script.source)
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(65536)

    def sync_memory(count: int) -> None:
        check = blocking_memory.check_with_info
        for i in range(count):
            check(NAMES[i % 1000], RATE)

    loop = asyncio.new_event_loop()  # one loop for every call: its making is not a check's

    def async_memory(count: int) -> None:
        check = asyncio_memory.check_with_info

        async def run() -> None:
            for i in range(count):
                await check(NAMES[i % 1000], RATE)

        loop.run_until_complete(run())

    def socket_round_trip(count: int) -> None:
        for i in range(count):
            sock.sendall(payloads[i % 1000])
            sock.recv_into(buffer)  # one reply, far below one read

    def client_evalsha(count: int) -> None:
        evalsha = client.evalsha
        for i in range(count):
            evalsha(script, calls[i % 1000], args)

    def sync_redis(count: int) -> None:
        check = limiter.check_with_info
        for i in range(count):
            check(NAMES[i % 1000], RATE, algorithm=ALGORITHM)

    def redis_py_evalsha(count: int) -> None:
        evalsha, sha = redis_py.evalsha, script.sha
        for i in range(count):
            keys = calls[i % 1000]
            evalsha(sha, len(keys), *keys, *args)

    loops = {name: value for name, value in locals().items() if name in STEPS}

    def close() -> None:
        limiter.close()
        redis_py.close()
        sock.close()
        loop.close()

    return loops, close


def per_call(loop: Loop, count: int, trials: int) -> tuple[float, float]:
    """The best trial's (CPU ns, wall ns) per call."""
    cpu, wall = [], []
    for _ in range(trials):
        cpu_started, wall_started = time.thread_time_ns(), time.perf_counter_ns()
        loop(count)
        cpu.append((time.thread_time_ns() - cpu_started) / count)
        wall.append((time.perf_counter_ns() - wall_started) / count)
    return min(cpu), min(wall)


def syscall_run(subject: str, url: str, threads: int, per_thread: int) -> None:
    """``threads`` threads, each making ``per_thread`` checks of a sync_bench.py subject."""
    import threading

    import sync_bench

    with sync_bench.SUBJECTS[subject](url, ALGORITHM) as check:
        for i in range(500):  # connections, scripts, keys
            check(i)
        start = threading.Barrier(threads)

        def worker(index: int) -> None:
            start.wait()
            for i in range(per_thread):
                check(index + i * threads)

        workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()


def strace_counts(argv: list[str]) -> dict[str, int]:
    """Calls per system call of a process and its threads (``strace -f -c``)."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "strace.txt")
        subprocess.run(["strace", "-f", "-c", "-o", out, *argv], check=True, capture_output=True)
        counts: dict[str, int] = {}
        for line in Path(out).read_text().splitlines():
            fields = line.split()
            # % time, seconds, usecs/call, calls, [errors,] syscall
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] != "total":
                counts[fields[-1]] = int(fields[3])
    return counts


def syscalls(per_thread_total: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sync_bench

    server = RedisServer().start()
    try:
        print(f"load average {os.getloadavg()}; system calls per check (strace -f -c):")
        for threads in (1, 16):
            per_thread = per_thread_total // threads
            for subject in sync_bench.SUBJECTS:
                runs = [
                    strace_counts(
                        [
                            *(sys.executable, __file__, "--syscall-run", subject),
                            *(server.url, str(threads), str(count)),
                        ]
                    )
                    for count in (0, per_thread)
                ]
                checks = per_thread * threads
                per_check = {
                    name: (runs[1].get(name, 0) - runs[0].get(name, 0)) / checks
                    for name in set(runs[0]) | set(runs[1])
                }
                shown = sorted(
                    ((value, name) for name, value in per_check.items() if value >= 0.05),
                    reverse=True,
                )
                detail = ", ".join(f"{name} {value:.2f}" for value, name in shown)
                total = sum(value for value, _ in shown)
                print(f"{threads:>2} threads  {subject:<32} {total:>6.2f}  ({detail})", flush=True)
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="calls per trial")
    parser.add_argument("--trials", type=int, default=5)
    add_callgrind_options(parser, default_count=2_000)
    parser.add_argument("--syscalls", action="store_true")
    parser.add_argument("--syscall-checks", type=int, default=8_000, help="per subject")
    parser.add_argument("--syscall-run", nargs=4, metavar=("SUBJECT", "URL", "THREADS", "N"))
    options = parser.parse_args()

    if options.syscall_run:
        subject, url, threads, per_thread = options.syscall_run
        syscall_run(subject, url, int(threads), int(per_thread))
        return
    if options.syscalls:
        syscalls(options.syscall_checks)
        return

    if options.callgrind_all:
        print(f"load average {os.getloadavg()}; instructions per call (callgrind):")
        instructions_per_call(
            [sys.executable, __file__],
            STEPS,
            options.callgrind_count,
            lambda name, per_call: f"{name:<20} {per_call:>10,.0f}",
        )
        return

    server = RedisServer().start()
    try:
        loops, close = build_loops(server.url, "127.0.0.1", server.port)
        for loop in loops.values():
            loop(WARMUP)  # connections, scripts, every identity's keys, the specialiser
        if options.callgrind:
            step, count = options.callgrind
            if step != "none":
                loops[step](int(count))
            close()
            return
        print(f"load average {os.getloadavg()}; per call, best of {options.trials} trials:")
        for name, loop in loops.items():
            cpu_ns, wall_ns = per_call(loop, options.count, options.trials)
            print(f"{name:<20} CPU {cpu_ns / 1000:>7.2f} us   wall {wall_ns / 1000:>7.2f} us")
        close()
    finally:
        server.close()


if __name__ == "__main__":
    main()
