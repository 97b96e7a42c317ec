"""The blocking RateLimiter (moderato.sync) against the sync peers, and its floor.

Starts its own redis-server (tests/redis_servers.py) and measures, over Redis:

- checks/s from 1 thread (sequential) and from 16 threads sharing one
  limiter, for two algorithm families every peer has: fixed window and
  sliding window (counter). Subjects: ``moderato.sync.RateLimiter``,
  limits' sync ``RedisStorage`` (``FixedWindowRateLimiter`` /
  ``SlidingWindowCounterRateLimiter``) and throttled-py's sync
  ``RedisStore`` (``Throttled(using=...)``). Every check is admitted
  (1,000,000/hour) on one of 10,000 identities in turn;
- the sequential latency of a bare redis-py ``EVALSHA`` round trip of
  moderato's own fixed-window script with the keys and arguments a check
  sends (the floor a blocking check stands on), beside moderato's check;
- for each family, the same call on a bare socket: the EVALSHA encoded once
  beforehand, then one ``sendall`` and one ``recv_into`` per check (no pool,
  no timeouts, no parsing): the round trip no client can beat, which bounds
  the ratio any client can reach against a peer from one thread;
- under 16 threads, the client process's CPU per check as well (all its
  threads: what the GIL lets one process spend);

and in process, the cost of one ``memory://`` check, blocking
(``moderato.sync``) beside asyncio (``moderato.RateLimiter``, awaited in a
loop).

Within each of ``--rounds`` rounds, the sequential figures are taken in
``--slices`` short slices, the subjects taking turns slice by slice (so a drift
of the round trip falls on all of them), and a one-thread ratio is the median of
the ratios within each turn; the 16-thread figures follow, subject after
subject. Medians over the rounds are reported; the load average before and after
is recorded with them. Writes ``benchmarks/results/sync-<UTC time>.json``
and prints the tables BENCHMARKS.md quotes.

    .venv/bin/python benchmarks/sync_bench.py [--seconds S] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import limits  # noqa: E402
import redis  # noqa: E402
from limits.storage import RedisStorage  # noqa: E402
from limits.strategies import (  # noqa: E402
    FixedWindowRateLimiter,
    SlidingWindowCounterRateLimiter,
)
from redis_servers import RedisServer, redis_server_binary  # noqa: E402
from throttled import RateLimiterType, RedisStore, Throttled, per_hour  # noqa: E402

import moderato  # noqa: E402
from moderato import _accel  # noqa: E402
from moderato.scripts import load_script  # noqa: E402
from moderato.sync import RateLimiter  # noqa: E402

KEY_SPACE = 10_000
RATE = "1000000/hour"
THREADS = 16
NAMES = [f"user:{n}" for n in range(KEY_SPACE)]
FAMILIES = {
    "fixed_window": (FixedWindowRateLimiter, RateLimiterType.FIXED_WINDOW),
    "sliding_window": (SlidingWindowCounterRateLimiter, RateLimiterType.SLIDING_WINDOW),
}

Check = Callable[[int], Any]


# -- the subjects --------------------------------------------------------------------


@contextmanager
def moderato_subject(url: str, algorithm: str) -> Iterator[Check]:
    limiter = RateLimiter(url, key_prefix="bench-sync", max_connections=THREADS)
    try:
        yield lambda i: limiter.check_with_info(NAMES[i % KEY_SPACE], RATE, algorithm=algorithm)
    finally:
        limiter.close()


@contextmanager
def limits_subject(url: str, algorithm: str) -> Iterator[Check]:
    storage = RedisStorage(url)
    strategy = FAMILIES[algorithm][0](storage)
    item = limits.parse(RATE)
    yield lambda i: strategy.hit(item, NAMES[i % KEY_SPACE])


@contextmanager
def throttled_subject(url: str, algorithm: str) -> Iterator[Check]:
    throttle = Throttled(
        using=FAMILIES[algorithm][1].value,
        quota=per_hour(1_000_000),
        store=RedisStore(server=url),
    )
    yield lambda i: throttle.limit(NAMES[i % KEY_SPACE])


@contextmanager
def evalsha_subject(url: str, algorithm: str) -> Iterator[Check]:
    """redis-py's EVALSHA of moderato's script, with the keys and arguments of a check."""
    limiter = RateLimiter(url, key_prefix="bench-floor")
    plan = limiter.plan_for(RATE, algorithm)
    script = load_script(algorithm)
    calls = [
        (*limiter.backend.decision_keys(plan, name, None, "global"), 1000, 1, *plan.script_args)
        for name in NAMES
    ]
    client = redis.Redis.from_url(url)
    client.script_load(script.source)
    sha = script.sha
    yield lambda i: client.evalsha(sha, 1, *calls[i % KEY_SPACE])
    client.close()
    limiter.close()


@contextmanager
def socket_subject(url: str, algorithm: str) -> Iterator[Check]:
    """The same EVALSHA as a check's, encoded beforehand, on a bare socket: one sendall and
    one recv_into per call (a reply of a few dozen bytes arrives in one read)."""
    limiter = RateLimiter(url, key_prefix="bench-socket")
    plan = limiter.plan_for(RATE, algorithm)
    script = load_script(algorithm)
    payloads = [
        _accel.encode_evalsha(
            script.sha,
            limiter.backend.decision_keys(plan, name, None, "global"),
            (1000, 1, *plan.script_args),
        )
        for name in NAMES
    ]
    redis.Redis.from_url(url).script_load(script.source)
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(65536)
    send, receive = sock.sendall, sock.recv_into

    def check(i: int) -> None:
        send(payloads[i % KEY_SPACE])
        receive(buffer)

    yield check
    sock.close()
    limiter.close()


# Not limiters: measured sequentially only, as the floors under a check.
FLOORS = {
    "bare socket EVALSHA (no client)": socket_subject,
    "redis-py EVALSHA (the floor)": evalsha_subject,
}

SUBJECTS = {
    "moderato.sync": moderato_subject,
    "limits (sync RedisStorage)": limits_subject,
    "throttled-py (sync RedisStore)": throttled_subject,
}


# -- measuring -------------------------------------------------------------------------


def sequential(check: Check, duration_s: float) -> dict[str, float]:
    """Checks/s and the latency percentiles of one thread calling ``check`` in a loop."""
    latencies: list[int] = []
    clock = time.perf_counter_ns
    stop_at = clock() + int(duration_s * 1e9)
    i = 0
    cpu_started = time.thread_time_ns()
    started = clock()
    while True:
        before = clock()
        check(i)
        after = clock()
        latencies.append(after - before)
        i += 1
        if after >= stop_at:
            break
    elapsed_s = (clock() - started) / 1e9
    cpu_us = (time.thread_time_ns() - cpu_started) / i / 1000
    latencies.sort()
    return {
        "checks_per_s": i / elapsed_s,
        "elapsed_s": elapsed_s,
        # The client's own CPU per check (this thread's time: not Redis's, not waiting,
        # not what other processes take from the shared cores).
        "client_cpu_us": cpu_us,
        "mean_us": sum(latencies) / len(latencies) / 1000,
        "p50_us": latencies[len(latencies) // 2] / 1000,
        "p99_us": latencies[int(len(latencies) * 0.99)] / 1000,
    }


def threaded(check: Check, threads: int, duration_s: float) -> tuple[float, float]:
    """Checks/s of ``threads`` threads calling ``check`` in a loop, together, and the
    process's CPU per check (every thread's, in µs)."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(index: int) -> None:
        start.wait()
        i = index
        done = 0
        while not stop.is_set():
            check(i)
            i += threads
            done += 1
        counts[index] = done

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    start.wait()
    started = time.perf_counter()
    cpu_started = time.process_time()
    time.sleep(duration_s)
    stop.set()
    for thread in workers:
        thread.join()
    cpu_s = time.process_time() - cpu_started
    done = sum(counts)
    return done / (time.perf_counter() - started), cpu_s / done * 1e6


def memory_costs(count: int, trials: int = 7) -> dict[str, float]:
    """ns of CPU per memory:// check: the blocking limiter, and the asyncio one awaited in a
    loop. No I/O is involved, so the thread's CPU time is measured (time.thread_time_ns):
    what other processes take from the shared cores does not count. The best of
    ``trials`` alternated trials each, and the median."""
    blocking = RateLimiter("memory://", key_prefix="mem")
    asynchronous = moderato.RateLimiter("memory://", key_prefix="mem")
    names = NAMES[:1000]

    def blocking_loop() -> float:
        check = blocking.check_with_info
        started = time.thread_time_ns()
        for i in range(count):
            check(names[i % 1000], RATE)
        return (time.thread_time_ns() - started) / count

    async def asyncio_loop() -> float:
        check = asynchronous.check_with_info
        started = time.thread_time_ns()
        for i in range(count):
            await check(names[i % 1000], RATE)
        return (time.thread_time_ns() - started) / count

    async def asyncio_trials() -> list[float]:
        return [await asyncio_loop() for _ in range(1)]

    blocking_loop()  # warm-up: every identity's entry made
    asyncio.run(asyncio_loop())
    sync_ns: list[float] = []
    asyncio_ns: list[float] = []
    for _ in range(trials):
        sync_ns.append(blocking_loop())
        asyncio_ns.extend(asyncio.run(asyncio_trials()))
    return {
        "sync_ns": min(sync_ns),
        "asyncio_ns": min(asyncio_ns),
        "sync_ns_median": statistics.median(sync_ns),
        "asyncio_ns_median": statistics.median(asyncio_ns),
    }


# -- the run -----------------------------------------------------------------------------


def load_average() -> list[float]:
    return list(os.getloadavg())


def environment(server: RedisServer) -> dict[str, Any]:
    version = subprocess.run(
        [redis_server_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "redis_server": version,
        "moderato": moderato.__version__,
        "limits": limits.__version__,
        "redis_py": redis.__version__,
        "throttled_py": _version("throttled-py"),
        "hiredis": _version("hiredis"),
        # The reply parser redis-py gives every connection the peers open (limits'
        # RedisStorage and throttled-py's RedisStore use redis-py's default).
        "redis_py_parser": redis.connection.DefaultParser.__name__,
        "commit": _commit(),
    }


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def measure_family(
    url: str, algorithm: str, round_number: int, options: argparse.Namespace, raw: dict[str, Any]
) -> None:
    """One round of one family: every subject's connections open together; the sequential
    figures taken in short slices, the subjects taking turns slice by slice (the order
    rotated each time), so that a drift of the loopback's round trip, which on a shared
    VM swings by half within a minute, falls on every subject alike; then 16 threads per
    subject."""
    subjects = {**SUBJECTS, **FLOORS}
    if algorithm != "fixed_window":
        del subjects["redis-py EVALSHA (the floor)"]
    names = list(subjects)
    with ExitStack() as stack:
        checks = {name: stack.enter_context(subjects[name](url, algorithm)) for name in names}
        for check in checks.values():
            for i in range(2000):  # warm: connections, scripts, keys
                check(i)
        slices: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        slice_s = options.seconds / options.slices
        for turn in range(options.slices):
            shift = turn % len(names)
            for name in names[shift:] + names[:shift]:
                slices[name].append(sequential(checks[name], slice_s))
        for name in names:
            together, together_cpu_us = (
                threaded(checks[name], THREADS, options.seconds)
                if name not in FLOORS
                else (None, None)
            )
            alone = merged(slices[name])
            raw.setdefault(f"{algorithm}|{name}", []).append(
                {
                    "sequential": alone,
                    "sequential_slices": slices[name],
                    "threads_checks_per_s": together,
                    "threads_client_cpu_us": together_cpu_us,
                }
            )
            print(
                f"round {round_number + 1} {algorithm:<15} {name:<32} "
                f"1 thread {alone['checks_per_s']:>8.0f}/s "
                f"(mean {alone['mean_us']:.1f} us)"
                + (f", {THREADS} threads {together:>8.0f}/s" if together else ""),
                flush=True,
            )


def merged(slices: list[dict[str, float]]) -> dict[str, float]:
    """One subject's sequential figures over its slices: checks/s, CPU and latency as
    the whole of its measured time gives them (percentiles: the slices' medians)."""
    checks = [one["checks_per_s"] * one["elapsed_s"] for one in slices]
    elapsed_s = sum(one["elapsed_s"] for one in slices)
    weights = [count / sum(checks) for count in checks]
    return {
        "checks_per_s": sum(checks) / elapsed_s,
        "client_cpu_us": sum(w * one["client_cpu_us"] for w, one in zip(weights, slices)),
        "mean_us": sum(w * one["mean_us"] for w, one in zip(weights, slices)),
        "p50_us": statistics.median(one["p50_us"] for one in slices),
        "p99_us": statistics.median(one["p99_us"] for one in slices),
        "elapsed_s": elapsed_s,
    }


def slice_ratios(ours: list[Any], theirs: list[Any]) -> list[float]:
    """moderato.sync's checks/s over a peer's, slice by slice (each pair taken within one
    turn of the subjects), over every round."""
    return [
        mine["checks_per_s"] / peer["checks_per_s"]
        for our_round, their_round in zip(ours, theirs)
        for mine, peer in zip(our_round["sequential_slices"], their_round["sequential_slices"])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--slices", type=int, default=10, help="sequential turns per subject and round"
    )
    parser.add_argument("--memory-checks", type=int, default=20_000, help="per memory trial")
    options = parser.parse_args()

    server = RedisServer().start()
    load_before = load_average()
    raw: dict[str, list[Any]] = {}
    try:
        for round_number in range(options.rounds):
            for algorithm in FAMILIES:
                measure_family(server.url, algorithm, round_number, options, raw)
            memory = memory_costs(options.memory_checks)
            raw.setdefault("memory", []).append(memory)
            print(
                f"round {round_number + 1} memory:// sync {memory['sync_ns']:.0f} ns/check, "
                f"asyncio {memory['asyncio_ns']:.0f} ns/check",
                flush=True,
            )
        load_after = load_average()
        report = summary(raw)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        results = {
            "benchmark": "sync_bench",
            "when": stamp,
            "options": vars(options),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "environment": environment(server),
            "raw": raw,
            "medians": report,
        }
        path = ROOT / "benchmarks" / "results" / f"sync-{stamp}.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nload average before {load_before}, after {load_after}")
        print_tables(report)
        print(f"\nwritten to {path.relative_to(ROOT)}")
    finally:
        server.close()


def summary(raw: dict[str, list[Any]]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for label, runs in raw.items():
        if label == "memory":
            medians[label] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            continue
        medians[label] = {
            "sequential_checks_per_s": statistics.median(
                run["sequential"]["checks_per_s"] for run in runs
            ),
            "sequential_mean_us": statistics.median(run["sequential"]["mean_us"] for run in runs),
            "sequential_best_mean_us": min(run["sequential"]["mean_us"] for run in runs),
            "client_cpu_us": statistics.median(run["sequential"]["client_cpu_us"] for run in runs),
            "sequential_p50_us": statistics.median(run["sequential"]["p50_us"] for run in runs),
            "sequential_p99_us": statistics.median(run["sequential"]["p99_us"] for run in runs),
            "threads_checks_per_s": (
                statistics.median(run["threads_checks_per_s"] for run in runs)
                if runs[0]["threads_checks_per_s"] is not None
                else None
            ),
            "sequential_best_checks_per_s": max(run["sequential"]["checks_per_s"] for run in runs),
            "threads_client_cpu_us": (
                statistics.median(run["threads_client_cpu_us"] for run in runs)
                if runs[0].get("threads_client_cpu_us") is not None
                else None
            ),
            "threads_best_checks_per_s": (
                max(run["threads_checks_per_s"] for run in runs)
                if runs[0]["threads_checks_per_s"] is not None
                else None
            ),
        }
    for label, figures in medians.items():
        if label == "memory":
            continue
        algorithm = label.split("|", 1)[0]
        ratios = slice_ratios(raw[f"{algorithm}|moderato.sync"], raw[label])
        # moderato.sync's lead over this subject: the median of the slice-by-slice ratios
        # (the pairs share a turn, so a drift of the round trip cancels within each).
        figures["sequential_ratio"] = statistics.median(ratios)
        figures["sequential_ratio_quartiles"] = statistics.quantiles(ratios, n=4)
    return medians


def print_tables(report: dict[str, Any]) -> None:
    for algorithm in FAMILIES:
        ours = report[f"{algorithm}|moderato.sync"]
        print(
            f"\n{algorithm}: checks/s, median of the rounds (best round in brackets); "
            "1 thread, moderato.sync x: the median of the slice-by-slice ratios "
            "[quartiles]"
        )
        print(
            f"| subject | 1 thread | moderato.sync x | mean latency (us) | {THREADS} threads "
            f"| moderato.sync x | client CPU per check, 1 / {THREADS} threads (us) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, figures in report.items():
            if not label.startswith(f"{algorithm}|"):
                continue
            name = label.split("|", 1)[1]
            alone = figures["sequential_checks_per_s"]
            together = figures["threads_checks_per_s"]
            times_alone = figures["sequential_ratio"]
            low, _, high = figures["sequential_ratio_quartiles"]
            if together:
                threads_text = f"{together:,.0f} ({figures['threads_best_checks_per_s']:,.0f})"
                times_together = f"{ours['threads_checks_per_s'] / together:.2f}"
            else:
                threads_text = times_together = "-"
            together_cpu = figures.get("threads_client_cpu_us")
            cpu_text = f"{figures['client_cpu_us']:.1f}" + (
                f" / {together_cpu:.1f}" if together_cpu is not None else ""
            )
            print(
                f"| {name} | {alone:,.0f} ({figures['sequential_best_checks_per_s']:,.0f}) | "
                f"{times_alone:.2f} [{low:.2f}..{high:.2f}] | "
                f"{figures['sequential_mean_us']:.1f} | {threads_text} | "
                f"{times_together} | {cpu_text} |"
            )
        bare = report.get(f"{algorithm}|bare socket EVALSHA (no client)")
        if bare is not None:
            # From one thread, no client can take less than the bare round trip: a peer's
            # latency over it is the most any client could be ahead of that peer.
            floor_us = bare["sequential_mean_us"]
            bounds = ", ".join(
                f"{name.split(' (')[0]} "
                f"{report[f'{algorithm}|{name}']['sequential_mean_us'] / floor_us:.2f}x"
                for name in SUBJECTS
                if name != "moderato.sync"
            )
            print(
                f"1 thread, the most any client could be ahead (peer's mean latency / the bare "
                f"socket's {floor_us:.1f} us): {bounds}"
            )
    floor = report["fixed_window|redis-py EVALSHA (the floor)"]
    ours = report["fixed_window|moderato.sync"]
    print(
        f"\nsequential latency, mean (best round): moderato.sync {ours['sequential_mean_us']:.1f} "
        f"({ours['sequential_best_mean_us']:.1f}) us, bare redis-py EVALSHA "
        f"{floor['sequential_mean_us']:.1f} ({floor['sequential_best_mean_us']:.1f}) us: "
        f"{ours['sequential_mean_us'] / floor['sequential_mean_us']:.2f}x "
        f"({ours['sequential_best_mean_us'] / floor['sequential_best_mean_us']:.2f}x); client CPU "
        f"{ours['client_cpu_us']:.1f} us against {floor['client_cpu_us']:.1f} us"
    )
    memory = report["memory"]
    print(
        f"memory:// check, CPU (best): sync {memory['sync_ns']:.0f} ns, asyncio "
        f"{memory['asyncio_ns']:.0f} ns: {memory['sync_ns'] / memory['asyncio_ns']:.2f}x"
    )


if __name__ == "__main__":
    main()
