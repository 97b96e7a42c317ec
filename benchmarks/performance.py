"""moderato head to head with limits, slowapi and fastapi-limiter, in one run.

Starts its own redis-server on a free loopback port (or uses --redis-url), then:

1. Redis floor and ceiling: redis-benchmark sending EVALSHA of the shipped
   token-bucket script with moderato's own arguments, ``-c 1 -P 1`` (the
   round-trip floor) and ``-c 50 -P 16`` (what Redis does when pipelined);
2. limiter only: sequential checks/s with p50/p99, and concurrent checks/s at
   10, 100 and 1000 tasks on one event loop, for moderato (every algorithm in
   moderato.algorithms.ALGORITHMS, plus the token bucket with two connections
   per loop for reference) and, at the same rate, the limits library's
   async Redis storage (each strategy, both of its client libraries) and
   fastapi-limiter's check path (pyrate-limiter's Limiter);
3. end to end: the same FastAPI app served by uvicorn (one process) with no
   limiter, moderato's decorator, moderato's middleware, slowapi and
   fastapi-limiter, loaded by wrk over loopback on an allowed and a limited path;
4. in process: ``memory://`` against limits' MemoryStorage;
5. cluster: the limiter-only test on a 3-primary Redis Cluster;
6. server CPU: Redis CPU per decision of each of moderato's scripts beside the
   leanest peer script for the same algorithm (benchmarks/server_cpu.py), on a
   fresh redis-server of its own.

Every measurement is repeated (trials interleave the contenders, so drift on a
shared machine spreads over all of them); medians and the min..max spread are
printed, and everything, with the environment, is written as JSON to
benchmarks/results/. ``benchmarks/plot.py`` draws the charts from that JSON.

    python benchmarks/performance.py [--quick]
        [--sections redis,limiter,e2e,memory,cluster,server_cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib.metadata
import importlib.util
import io
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from redis_servers import RedisServer, free_port  # noqa: E402

from benchmarks import server_cpu  # noqa: E402
from benchmarks.subjects import (  # noqa: E402
    RATE,
    Opened,
    Subject,
    bare_client_subjects,
    fastapi_limiter_subjects,
    in_process_subjects,
    limits_redis_subjects,
    moderato_subjects,
    moderato_tuned_subjects,
)
from moderato import __version__  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.policy import policy_for  # noqa: E402
from moderato.scripts import load_script  # noqa: E402

SECTIONS = ("redis", "limiter", "sequential", "e2e", "memory", "cluster", "server_cpu")
# redis-benchmark calls per script and trial in the server-CPU section (full, quick).
SERVER_CPU_REQUESTS = (100_000, 20_000)
CONCURRENCY = (10, 100, 1000)
IDENTITIES = 1000  # distinct keys the checks cycle through (redis-benchmark: -r 1000)
WRK_CONNECTIONS = 32
PACKAGES = (
    "moderato", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "hiredis",
    "limits", "coredis", "redis", "slowapi", "fastapi-limiter", "pyrate-limiter", "matplotlib",
)  # fmt: skip


@dataclass(frozen=True)
class Config:
    quick: bool
    trials: int  # limiter-only, in-process, cluster and redis-benchmark
    e2e_trials: int  # wrk runs per app and path
    window_s: float  # one limiter-only or cluster measurement (1000 tasks: 1.5 times that)
    ramp_s: float  # before each window (1000 tasks: 1.5 times that)
    memory_s: float  # one in-process measurement
    wrk_s: int  # one wrk run (whole seconds: wrk's resolution)
    floor_requests: int  # redis-benchmark -c 1 -P 1
    ceiling_requests: int  # redis-benchmark -c 50 -P 16
    warmup_s: float  # per subject, before its first trial
    # What --quick leaves out to stay near a fifth of the full run (whole-second
    # wrk runs and server start-ups do not shrink with the windows):
    limits_clients: tuple[str, ...]  # limits' Redis client libraries measured
    limited_path: bool  # end to end: also the limited path
    cluster_replicas: int  # replicas per primary of the benchmark cluster

    def window(self, tasks: int) -> tuple[float, float]:
        """(window_s, ramp_s) at this concurrency.

        1000 tasks need longer to settle; one task gets a window three times as
        long, since it counts the fewest checks (a few hundred in 60 ms) and
        one stall of this VM would move its rate by several percent.
        """
        scale = 1.5 if tasks >= 1000 else 3.0 if tasks == 1 else 1.0
        return self.window_s * scale, self.ramp_s * scale


FULL = Config(False, 3, 3, 0.06, 0.02, 0.04, 1, 3000, 25_000, 0.04, ("coredis", "redispy"), True, 1)
# limits' default client only; a cluster without replicas.
# The end-to-end limited path stays: a denial's cost is half of what the apps are compared on.
QUICK = Config(True, 1, 1, 0.015, 0.006, 0.02, 1, 800, 8_000, 0.02, ("coredis",), True, 0)


# -- progress -----------------------------------------------------------------


class Progress:
    """One status line on stderr (rewritten in place on a terminal), with an ETA."""

    def __init__(self, planned_s: float, enabled: bool = True) -> None:
        self.planned_s = max(planned_s, 1e-9)
        self.done_s = 0.0
        self.started = time.monotonic()
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.section = ""

    def step(self, section: str, label: str, planned_s: float) -> None:
        self.done_s += planned_s
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        fraction = min(self.done_s / self.planned_s, 1.0)
        left = elapsed / fraction - elapsed if fraction > 0 else 0.0
        line = f"[{fraction:4.0%} {elapsed:5.1f}s, ~{left:4.0f}s left] {section}: {label}"
        if self.tty:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)
        elif section != self.section:
            print(line, file=sys.stderr, flush=True)
        self.section = section

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        prefix = "\r\033[K" if self.tty else ""
        print(f"{prefix}  {text}", file=sys.stderr, flush=True)


# -- event loop ---------------------------------------------------------------

LOOP = "asyncio"  # or "uvloop" (--loop): the loop of the in-process sections


def run_loop(coroutine: Any) -> Any:
    """asyncio.run on the chosen event loop."""
    if LOOP == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(coroutine)
        finally:
            # As asyncio.run does: cancel what is left (a peer's background tasks).
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            asyncio.set_event_loop(None)
            loop.close()
    return asyncio.run(coroutine)


# -- statistics ---------------------------------------------------------------


def summary(samples: list[float]) -> dict[str, Any]:
    """Median and spread of one figure across trials; the raw samples too."""
    if not samples:
        return {"median": None, "min": None, "max": None, "samples": []}
    median = statistics.median(samples)
    return {
        "median": median,
        "min": min(samples),
        "max": max(samples),
        "spread_pct": (max(samples) - min(samples)) / median * 100 if median else None,
        "samples": samples,
    }


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


# -- environment --------------------------------------------------------------


def load_average() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def git_commit() -> str:
    """HEAD's commit, read from .git directly (no git process)."""
    git = ROOT / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown"


def tool_version(*command: str) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    return (result.stdout or result.stderr).strip().splitlines()[0] if result else "unknown"


def environment(redis_info: dict[str, str]) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "redis": redis_info.get("redis_version", "unknown"),
        "redis_benchmark": tool_version("redis-benchmark", "--version"),
        "wrk": tool_version("wrk", "-v"),
        "moderato": __version__,
        "moderato_accelerator": _accel_loaded(),
        "packages": versions,
        "git_commit": git_commit(),
        "uvicorn_loop": "uvloop" if versions.get("uvloop") else "asyncio",
        "uvicorn_http": "httptools" if versions.get("httptools") else "h11",
        "limiter_only_loop": LOOP,
    }


def _accel_loaded() -> str:
    from moderato import _accel

    return str(getattr(_accel, "__file__", "built in"))


def redis_info(port: int, host: str = "127.0.0.1", section: str = "default") -> dict[str, str]:
    output = subprocess.run(
        ["redis-cli", "-h", host, "-p", str(port), "INFO", section],
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split(":", 1) for line in output.splitlines() if ":" in line)


def redis_cpu_s(port: int) -> float:
    info = redis_info(port)
    return float(info.get("used_cpu_user", 0)) + float(info.get("used_cpu_sys", 0))


def script_calls(port: int) -> int:
    """EVALSHA and EVAL calls the server has run (INFO commandstats)."""
    info = redis_info(port, section="commandstats")
    return sum(
        int(info[name].split("calls=")[1].split(",")[0])
        for name in ("cmdstat_evalsha", "cmdstat_eval")
        if name in info
    )


def process_cpu_s(pid: int) -> float:
    """utime + stime of a child process, from /proc (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- 1. Redis floor and ceiling -------------------------------------------------


def benchmark_command(algorithm: str) -> list[str]:
    """EVALSHA of moderato's script for one identity of :data:`IDENTITIES`, moderato's args."""
    algo = ALGORITHMS[algorithm]
    script = load_script(algo.name)
    rate = policy_for(RATE).rates[0]
    args = [str(arg) for arg in (1000, 1, *algo.policy_args(rate))]
    key = f"bench-rb:{algo.key_tag}:{{:global:__rand_int__}}:{rate.window_s}"
    return ["EVALSHA", script.sha, "1", key, *args]


def plain_benchmark_command(port: int) -> list[str]:
    """EVALSHA of the plain token bucket (TIME + HMGET + HSET + PEXPIRE): the ceiling of a
    script with no validation, exact refill or multi-policy support."""
    plain = server_cpu.reference_subject()
    sha = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "SCRIPT", "LOAD", plain.source],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return ["EVALSHA", sha, str(len(plain.keys)), *plain.keys, *plain.args]


def redis_benchmark(
    port: int,
    clients: int,
    pipeline: int,
    requests: int,
    algorithm: str,
    script_command: Optional[list[str]] = None,
) -> dict[str, float]:
    command = [
        "redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
        "-c", str(clients), "-P", str(pipeline), "-n", str(requests),
        "-r", str(IDENTITIES), "--csv", *(script_command or benchmark_command(algorithm)),
    ]  # fmt: skip
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    rows = [row for row in csv.reader(io.StringIO(output)) if len(row) >= 2]
    header, values = rows[0], rows[-1]
    try:
        parsed = {name: float(v) for name, v in zip(header[1:], values[1:])}
    except ValueError as error:
        raise RuntimeError(f"could not read redis-benchmark's output: {output!r}") from error
    return {
        "ops_per_s": parsed["rps"],
        "p50_ms": parsed.get("p50_latency_ms", float("nan")),
        "p99_ms": parsed.get("p99_latency_ms", float("nan")),
    }


def load_scripts(port: int) -> None:
    for algorithm in ALGORITHMS.values():
        source = load_script(algorithm.name).source.decode()
        subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "SCRIPT", "LOAD", source],
            check=True,
            capture_output=True,
        )


def redis_section(port: int, config: Config, progress: Progress) -> dict[str, Any]:
    load_scripts(port)
    runs: dict[str, list[dict[str, float]]] = {"c1_p1": [], "c50_p16": [], "c50_p16_plain": []}
    plain_command = plain_benchmark_command(port)
    for trial in range(config.trials):
        progress.step(
            "redis", f"redis-benchmark -c 1 -P 1, trial {trial + 1}", config.floor_requests / 20_000
        )
        runs["c1_p1"].append(redis_benchmark(port, 1, 1, config.floor_requests, "token_bucket"))
        progress.step(
            "redis",
            f"redis-benchmark -c 50 -P 16, trial {trial + 1}",
            config.ceiling_requests / 45_000,
        )
        runs["c50_p16"].append(
            redis_benchmark(port, 50, 16, config.ceiling_requests, "token_bucket")
        )
        progress.step(
            "redis",
            f"redis-benchmark -c 50 -P 16, plain token bucket, trial {trial + 1}",
            config.ceiling_requests / 100_000,
        )
        runs["c50_p16_plain"].append(
            redis_benchmark(port, 50, 16, config.ceiling_requests, "", plain_command)
        )
    result: dict[str, Any] = {
        "script": "lua/token_bucket.lua",
        "command": " ".join(benchmark_command("token_bucket")),
        "plain_script": "benchmarks/server_cpu.py PLAIN_TOKEN_BUCKET",
        "plain_command": " ".join(plain_command),
        "identities": IDENTITIES,
    }
    for name, samples in runs.items():
        result[name] = {
            field: summary([sample[field] for sample in samples])
            for field in ("ops_per_s", "p50_ms", "p99_ms")
        }
        progress.note(f"redis-benchmark {name}: {result[name]['ops_per_s']['median']:,.0f} ops/s")
    return result


# -- 2. limiter only ---------------------------------------------------------------


async def measure(
    opened: Opened, tasks: int, window_s: float, ramp_s: float, keys: list[str]
) -> dict[str, Any]:
    """Steady-state checks/s of ``tasks`` closed-loop tasks, and per-check latency.

    The tasks run back to back; only checks that complete inside the window
    (after ``ramp_s`` of ramp-up: pools filled, every task in flight) count,
    so neither start-up nor the drain of the last checks skews the rate.
    """
    clock = time.perf_counter
    check = opened.check
    admitted = opened.admitted
    latencies: list[float] = []
    record = latencies.append
    denied = errors = outside_errors = 0
    first_error: Optional[str] = None
    count = len(keys)
    running = True
    counting = False

    async def worker(start: int) -> None:
        nonlocal denied, errors, outside_errors, first_error
        index = start
        while running:
            key = keys[index % count]
            index += tasks
            begin = clock()
            try:
                result = await check(key)
            except Exception as error:  # a client that fails is reported, not fatal
                if counting:
                    errors += 1
                else:
                    outside_errors += 1
                if first_error is None:
                    first_error = f"{type(error).__name__}: {error}"[:300]
                await asyncio.sleep(0.001)
                continue
            if counting:
                record(clock() - begin)
                if not admitted(result):
                    denied += 1

    workers = [asyncio.ensure_future(worker(n)) for n in range(tasks)]
    await asyncio.sleep(ramp_s)
    counting = True
    window_start = clock()
    cpu_start = time.process_time()
    await asyncio.sleep(window_s)
    counting = False
    elapsed = clock() - window_start
    cpu_s = time.process_time() - cpu_start
    running = False
    await asyncio.gather(*workers)
    latencies.sort()
    return {
        "checks_per_s": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.50) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "checks": len(latencies),
        "window_s": elapsed,
        # This process's CPU over the window: near 100% means the client is the bottleneck.
        "client_cpu_pct": cpu_s / elapsed * 100,
        "client_cpu_us_per_check": cpu_s / len(latencies) * 1e6 if latencies else None,
        "denied": denied,
        "errors": errors,
        "errors_outside_window": outside_errors,
        "first_error": first_error,
    }


async def measure_in_process(opened: Opened, duration_s: float, keys: list[str]) -> dict[str, Any]:
    """Sequential checks of an in-process subject: it never yields, so a plain deadline."""
    if not opened.is_async:
        return measure_sync(opened, duration_s, keys)
    clock = time.perf_counter
    check = opened.check
    latencies: list[float] = []
    denied = 0
    count = len(keys)
    index = 0
    started = clock()
    deadline = started + duration_s
    while clock() < deadline:
        begin = clock()
        result = await check(keys[index % count])
        latencies.append(clock() - begin)
        index += 1
        if not opened.admitted(result):
            denied += 1
    elapsed = clock() - started
    latencies.sort()
    return {
        "checks_per_s": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.50) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "checks": len(latencies),
        "window_s": elapsed,
        "denied": denied,
        "errors": 0,
        "first_error": None,
    }


def measure_sync(opened: Opened, duration_s: float, keys: list[str]) -> dict[str, Any]:
    """The sequential measurement for a synchronous (in-process) subject."""
    clock = time.perf_counter
    check = opened.check
    latencies: list[float] = []
    denied = 0
    count = len(keys)
    index = 0
    started = clock()
    deadline = started + duration_s
    while clock() < deadline:
        begin = clock()
        result = check(keys[index % count])
        latencies.append(clock() - begin)
        index += 1
        if not opened.admitted(result):
            denied += 1
    elapsed = clock() - started
    latencies.sort()
    return {
        "checks_per_s": len(latencies) / elapsed,
        "p50_us": percentile(latencies, 0.50) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
        "checks": len(latencies),
        "window_s": elapsed,
        "denied": denied,
        "errors": 0,
        "first_error": None,
    }


def collect(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-trial measurements of one (subject, mode) folded into summaries."""
    errors = [s["first_error"] for s in samples if s["first_error"]]
    return {
        "checks_per_s": summary([s["checks_per_s"] for s in samples]),
        "p50_us": summary([s["p50_us"] for s in samples]),
        "p99_us": summary([s["p99_us"] for s in samples]),
        **{
            field: summary([s[field] for s in samples if s.get(field) is not None])
            for field in ("client_cpu_pct", "client_cpu_us_per_check")
            if any(s.get(field) is not None for s in samples)
        },
        "checks": sum(s["checks"] for s in samples),
        "denied": sum(s["denied"] for s in samples),
        "errors": sum(s["errors"] for s in samples),
        "errors_outside_window": sum(s.get("errors_outside_window", 0) for s in samples),
        "first_error": errors[0] if errors else None,
    }


async def run_subjects(
    section: str,
    subjects: list[Subject],
    modes: tuple[int, ...],
    config: Config,
    progress: Progress,
    in_process: bool = False,
    identities: int = IDENTITIES,
    before_trial: Optional[Callable[[int], None]] = None,
) -> list[dict[str, Any]]:
    """Every subject at every mode (1 = sequential, N = N tasks), trials interleaved.

    Network subjects are measured in steady-state windows (:func:`measure`);
    in-process ones, which never yield to the loop, against a deadline.
    """
    keys = [f"id{n}" for n in range(identities)]
    opened: dict[str, Opened] = {}
    failed: dict[str, str] = {}
    warmup_errors: dict[str, str] = {}
    wall_s: dict[str, float] = {}
    for subject in subjects:
        progress.step(section, f"open + warm up {subject.name}", config.warmup_s * 2)
        started = time.monotonic()
        try:
            handle = await subject.open()
            if in_process:
                await measure_in_process(handle, config.warmup_s, keys)
            else:
                # Warm at the widest concurrency: pools fill, scripts load, outside the trials.
                # Its ramp is not counted, so the window only reports failures of a warm client.
                for warm_tasks in (max(modes), 1):
                    warm = await measure(handle, warm_tasks, config.warmup_s, config.warmup_s, keys)
                    failures = warm["errors"] + warm["errors_outside_window"]
                    if failures:
                        warmup_errors[subject.name] = (
                            f"{failures} failed checks warming up at {warm_tasks} tasks, "
                            f"first: {warm['first_error']}"
                        )
                        progress.note(f"{subject.name}: {warmup_errors[subject.name]}")
            opened[subject.name] = handle
        except Exception as error:
            failed[subject.name] = f"{type(error).__name__}: {error}"[:300]
            progress.note(f"{subject.name}: could not be set up: {failed[subject.name]}")
        wall_s[subject.name] = time.monotonic() - started
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for trial in range(config.trials):
        if before_trial is not None:
            before_trial(trial)
        for subject in subjects:
            handle_or_none = opened.get(subject.name)
            if handle_or_none is None:
                continue
            handle = handle_or_none
            for tasks in (1,) if in_process else modes:
                label = "sequential" if tasks == 1 else f"{tasks} tasks"
                window_s, ramp_s = config.window(tasks)
                progress.step(
                    section,
                    f"{subject.name}, {label}, trial {trial + 1}/{config.trials}",
                    config.memory_s if in_process else window_s + ramp_s,
                )
                started = time.monotonic()
                if in_process:
                    result = await measure_in_process(handle, config.memory_s, keys)
                else:
                    result = await measure(handle, tasks, window_s, ramp_s, keys)
                wall_s[subject.name] += time.monotonic() - started
                samples.setdefault((subject.name, tasks), []).append(result)
    for handle in opened.values():
        with contextlib.suppress(Exception):
            await handle.close()
    results = []
    for subject in subjects:
        entry: dict[str, Any] = {
            "name": subject.name,
            "library": subject.library,
            "algorithm": subject.algorithm,
            "note": subject.note,
            "wall_s": wall_s.get(subject.name),
            **subject.extra,
        }
        if subject.name in failed:
            entry["setup_error"] = failed[subject.name]
        if subject.name in warmup_errors:
            entry["warmup_error"] = warmup_errors[subject.name]
        if (subject.name, 1) in samples:
            entry["sequential"] = collect(samples[(subject.name, 1)])
        entry["concurrent"] = {
            str(tasks): collect(samples[(subject.name, tasks)])
            for tasks in modes
            if tasks != 1 and (subject.name, tasks) in samples
        }
        results.append(entry)
        if "sequential" in entry:
            line = f"{subject.name:44} seq {entry['sequential']['checks_per_s']['median']:>9,.0f}"
            for tasks, stats in entry["concurrent"].items():
                line += f"  {tasks:>4}t {stats['checks_per_s']['median']:>9,.0f}"
            progress.note(f"{line} checks/s ({wall_s[subject.name]:.1f} s)")
    return results


def limiter_section(url: str, port: int, config: Config, progress: Progress) -> dict[str, Any]:
    subjects = (
        moderato_subjects(url)
        + moderato_tuned_subjects(url)
        + bare_client_subjects(port)
        + limits_redis_subjects(port, config.limits_clients)
        + fastapi_limiter_subjects(url)
    )
    floors: list[dict[str, float]] = []

    def floor_before(trial: int) -> None:
        # The round-trip floor again, seconds before this trial's sequential
        # checks: the sequential target compares each trial with its own floor,
        # not with one measured a minute earlier on a machine that drifts.
        progress.step(
            "limiter-only",
            f"redis-benchmark -c 1 -P 1 before trial {trial + 1}",
            config.floor_requests / 20_000,
        )
        floors.append(redis_benchmark(port, 1, 1, config.floor_requests, "token_bucket"))

    results = run_loop(
        run_subjects(
            "limiter-only",
            subjects,
            (1, *CONCURRENCY),
            config,
            progress,
            before_trial=floor_before,
        )
    )
    return {
        "rate": RATE,
        "identities": IDENTITIES,
        "window_s": config.window_s,
        "ramp_s": config.ramp_s,
        "paired_floor": {
            "what": "redis-benchmark -c 1 -P 1 (token bucket) at the start of each trial",
            "ops_per_s": summary([floor["ops_per_s"] for floor in floors]),
        },
        "subjects": results,
    }


# The sequential section's slices: each trial alternates the two subjects this many
# times (in ABBA order), each slice this long after a short ramp. A slice pair spans
# ~50 ms, so a stall of this shared VM lands in one pair's ratio, not in a subject's
# whole trial (180 ms windows taken one after the other swung 0.44-1.43 per trial).
SEQUENTIAL_SLICES = 10
SEQUENTIAL_SLICE_S = 0.02
SEQUENTIAL_SLICE_RAMP_S = 0.004


def _median_or_none(values: list[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


async def sequential_slices(
    subjects: list[Subject], config: Config, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The two subjects of the sequential target (moderato's first, the reference
    second) alternated in short slices: ``config.trials`` trials of
    ``SEQUENTIAL_SLICES`` slice pairs, each pair in ABBA order (A then B, then B then
    A), every slice's checks/s kept; the ratio of each pair is the target's sample.
    Per trial, each subject's rate over its slices (checks / seconds counted) stands
    as that trial's sample, as run_subjects reports them."""
    keys = [f"id{n}" for n in range(IDENTITIES)]
    opened: list[Opened] = []
    for subject in subjects:
        progress.step("sequential", f"open + warm up {subject.name}", config.warmup_s * 2)
        handle = await subject.open()
        await measure(handle, 1, config.warmup_s, config.warmup_s, keys)
        opened.append(handle)
    first, second = opened
    slices: list[tuple[dict[str, Any], dict[str, Any]]] = []
    per_trial: list[list[dict[str, Any]]] = [[], []]
    for trial in range(config.trials):
        progress.step(
            "sequential",
            f"{SEQUENTIAL_SLICES} slice pairs, trial {trial + 1}/{config.trials}",
            SEQUENTIAL_SLICES * 2 * (SEQUENTIAL_SLICE_S + SEQUENTIAL_SLICE_RAMP_S),
        )
        taken: list[list[dict[str, Any]]] = [[], []]
        for index in range(SEQUENTIAL_SLICES):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            pair: list[dict[str, Any]] = [{}, {}]
            for which in order:
                pair[which] = await measure(
                    (first, second)[which],
                    1,
                    SEQUENTIAL_SLICE_S,
                    SEQUENTIAL_SLICE_RAMP_S,
                    keys,
                )
                taken[which].append(pair[which])
            slices.append((pair[0], pair[1]))
        for which in (0, 1):
            parts = taken[which]
            checks = sum(part["checks"] for part in parts)
            seconds = sum(part["window_s"] for part in parts)
            latencies = sorted(part["p50_us"] for part in parts)
            per_trial[which].append(
                {
                    "checks_per_s": checks / seconds,
                    "p50_us": statistics.median(latencies),
                    "p99_us": max(part["p99_us"] for part in parts),
                    "checks": checks,
                    "window_s": seconds,
                    "denied": sum(part["denied"] for part in parts),
                    "errors": sum(part["errors"] for part in parts),
                    "errors_outside_window": sum(part["errors_outside_window"] for part in parts),
                    "first_error": next(
                        (part["first_error"] for part in parts if part["first_error"]), None
                    ),
                    "client_cpu_us_per_check": _median_or_none(
                        [part.get("client_cpu_us_per_check") for part in parts]
                    ),
                }
            )
    for handle in opened:
        with contextlib.suppress(Exception):
            await handle.close()
    results = []
    for subject, samples in zip(subjects, per_trial):
        entry: dict[str, Any] = {
            "name": subject.name,
            "library": subject.library,
            "algorithm": subject.algorithm,
            "note": subject.note,
            **subject.extra,
            "sequential": collect(samples),
            "concurrent": {},
        }
        results.append(entry)
        progress.note(
            f"{subject.name:44} seq {entry['sequential']['checks_per_s']['median']:>9,.0f} checks/s"
        )
    ratios = [a["checks_per_s"] / b["checks_per_s"] for a, b in slices if b["checks_per_s"]]
    sliced = {
        "what": (
            f"{subjects[0].name} / {subjects[1].name}, one task each, alternated in "
            f"{SEQUENTIAL_SLICE_S * 1000:g} ms slices (after {SEQUENTIAL_SLICE_RAMP_S * 1000:g} ms "
            f"of ramp), {SEQUENTIAL_SLICES} pairs per trial in ABBA order"
        ),
        "slice_s": SEQUENTIAL_SLICE_S,
        "ramp_s": SEQUENTIAL_SLICE_RAMP_S,
        "pairs": len(ratios),
        "ratio": summary(ratios),
        "checks": [[a["checks"], b["checks"]] for a, b in slices],
    }
    return results, sliced


def sequential_section(url: str, port: int, config: Config, progress: Progress) -> dict[str, Any]:
    """Issue 31's Redis target alone: moderato's token bucket against the bare asyncio
    client sending the same EVALSHA, one task each, alternated in short slices (see
    sequential_slices; the limiter section measures the same pair among every peer
    and concurrency)."""
    subjects = [
        subject for subject in moderato_subjects(url) if subject.name == "moderato token_bucket"
    ] + bare_client_subjects(port)
    results, sliced = run_loop(sequential_slices(subjects, config, progress))
    return {"rate": RATE, "identities": IDENTITIES, "subjects": results, "slices": sliced}


# -- 3. end to end --------------------------------------------------------------------


@dataclass
class AppServer:
    name: str
    module: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_app(name: str, module: str, redis_url: str, log_dir: Path) -> AppServer:
    port = free_port()
    log = log_dir / f"{module}.log"
    env = dict(os.environ, MODERATO_BENCH_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    command = [
        sys.executable, "-m", "uvicorn", f"benchmarks.apps.{module}:app",
        "--host", "127.0.0.1", "--port", str(port), "--loop", loop, "--http", http,
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
        )
    return AppServer(name, module, port, process, log)


def http_status(url: str, timeout_s: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def wait_ready(server: AppServer, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited on start:\n{server.log.read_text()[-2000:]}")
        try:
            if http_status(server.base + "/health", 0.5) == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{server.name} did not answer within {timeout_s} s")


def run_wrk(url: str, seconds: int) -> dict[str, Any]:
    command = [
        "wrk", "-t", "1", "-c", str(WRK_CONNECTIONS), "-d", f"{seconds}s", "--timeout", "2s",
        "-s", str(ROOT / "benchmarks" / "wrk_report.lua"), url,
    ]  # fmt: skip
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    for line in output.splitlines():
        if line.startswith("WRK_JSON "):
            report: dict[str, Any] = json.loads(line[len("WRK_JSON ") :])
            return report
    raise RuntimeError(f"wrk printed no report: {output!r}")


def e2e_section(
    redis_url: str, redis_port: int, config: Config, progress: Progress
) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        return {"skipped": "wrk is not installed (bash tools/ensure-wrk.sh)"}
    try:
        from benchmarks import apps
    except ImportError as error:
        return {"skipped": f"benchmarks/apps/ is not available: {error}"}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"moderato-bench-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    servers: list[AppServer] = []
    results: dict[str, dict[str, Any]] = {}
    try:
        progress.step("end-to-end", "starting the uvicorn apps", 3.0)
        for name, module in apps.APPS.items():
            servers.append(start_app(name, module, redis_url, log_dir))
        for server in list(servers):
            try:
                wait_ready(server)
            except RuntimeError as error:  # e.g. a peer that is not installed
                results[server.name] = {"start_error": str(error)[-1000:]}
                progress.note(f"{server.name}: could not be started, left out: {error}")
                server.process.kill()
                server.process.wait()
                servers.remove(server)
        paths = {server.name: ["allowed"] for server in servers}
        for server in servers:
            if config.limited_path and server.name not in apps.FLOORS:
                # The bare app's /limited is its unlimited endpoint: the flood's reference.
                paths[server.name].append("limited")
            statuses = {}
            for path in paths[server.name]:
                # Warm-up: the first requests connect to Redis and load scripts; on the
                # limited path the first request is the one the hour admits.
                seen = [http_status(f"{server.base}/{path}") for _ in range(20)]
                statuses[path] = seen
            results[server.name] = {
                "module": f"benchmarks/apps/{server.module}.py",
                "warmup_statuses": {path: sorted(set(s)) for path, s in statuses.items()},
            }
            expected_limited = [200] * 20 if server.module == "baseline" else [200] + [429] * 19
            if "limited" in statuses and statuses["limited"] != expected_limited:
                progress.note(
                    f"{server.name}: unexpected limited-path statuses {statuses['limited']}"
                )
            if set(statuses["allowed"]) != {200}:
                progress.note(
                    f"{server.name}: unexpected allowed-path statuses {statuses['allowed']}"
                )
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for trial in range(config.e2e_trials):
            for server in servers:
                for path in paths[server.name]:
                    progress.step(
                        "end-to-end",
                        f"{server.name} /{path}, trial {trial + 1}/{config.e2e_trials}",
                        config.wrk_s + 0.1,
                    )
                    app_cpu_before = process_cpu_s(server.process.pid)
                    redis_before = redis_cpu_s(redis_port)
                    calls_before = script_calls(redis_port)
                    report = run_wrk(f"{server.base}/{path}", config.wrk_s)
                    # Script calls (EVALSHA and EVAL: one per decision Redis made) per request.
                    report["redis_calls_per_request"] = (
                        script_calls(redis_port) - calls_before
                    ) / max(report["requests"], 1)
                    seconds = report["duration_us"] / 1e6
                    report["app_cpu_pct"] = (
                        (process_cpu_s(server.process.pid) - app_cpu_before) / seconds * 100
                    )
                    report["redis_cpu_pct"] = (
                        (redis_cpu_s(redis_port) - redis_before) / seconds * 100
                    )
                    report["requests_per_s"] = report["requests"] / seconds
                    runs.setdefault((server.name, path), []).append(report)
        for (name, path), reports in runs.items():
            limited = path == "limited" and name != "no limiter"
            expected = "all 429 (limited)" if limited else "all 2xx"
            non_2xx = sum(r["errors"]["status"] for r in reports)
            requests = sum(r["requests"] for r in reports)
            socket_errors = sum(
                r["errors"][kind]
                for r in reports
                for kind in ("connect", "read", "write", "timeout")
            )
            ok = (non_2xx == requests) if limited else (non_2xx == 0)
            results[name][path] = {
                "requests_per_s": summary([r["requests_per_s"] for r in reports]),
                "p50_ms": summary([r["latency_us"]["p50"] / 1000 for r in reports]),
                "p90_ms": summary([r["latency_us"]["p90"] / 1000 for r in reports]),
                "p99_ms": summary([r["latency_us"]["p99"] / 1000 for r in reports]),
                "app_cpu_pct": summary([r["app_cpu_pct"] for r in reports]),
                # The app process's CPU per request: what each request costs it, whatever
                # share of a core it got on this shared machine.
                "app_cpu_us_per_request": summary(
                    [r["app_cpu_pct"] / 100 / r["requests_per_s"] * 1e6 for r in reports]
                ),
                "redis_cpu_pct": summary([r["redis_cpu_pct"] for r in reports]),
                "redis_calls_per_request": summary([r["redis_calls_per_request"] for r in reports]),
                "requests": requests,
                "non_2xx": non_2xx,
                "socket_errors": socket_errors,
                "expected": expected,
                "as_expected": ok and socket_errors == 0,
                "raw": reports,
            }
            if not results[name][path]["as_expected"]:
                progress.note(
                    f"{name} /{path}: {non_2xx} non-2xx of {requests}, {socket_errors} socket "
                    f"errors (expected {expected})"
                )
            stats = results[name][path]
            progress.note(
                f"{name:20} /{path:8} {stats['requests_per_s']['median']:>8,.0f} req/s"
                f"  p50 {stats['p50_ms']['median']:.2f} ms  p99 {stats['p99_ms']['median']:.2f} ms"
                f"  app CPU {stats['app_cpu_us_per_request']['median']:.0f} us/request"
                f"  Redis calls/request {stats['redis_calls_per_request']['median']:.4f}"
            )
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.process.terminate()
        for server in servers:
            try:
                server.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()
        shutil.rmtree(log_dir, ignore_errors=True)
    return {
        "load_generator": f"wrk -t 1 -c {WRK_CONNECTIONS} -d {config.wrk_s}s --timeout 2s",
        "server": "uvicorn, one process, --no-access-log",
        "allowed_rate": apps.ALLOWED_RATE,
        "limited_rate": apps.LIMITED_RATE,
        "moderato_algorithm": apps.algorithm(),
        "apps": results,
    }


# -- 4. in process -----------------------------------------------------------------------


def memory_section(config: Config, progress: Progress) -> dict[str, Any]:
    """memory:// against limits' MemoryStorage, in memory_bench.py's two scenarios.

    Every moderato algorithm and every limits strategy (its async and sync
    API) run each scenario; benchmarks/memory_bench.py pairs the algorithms
    with limits' strategies and times the layers under the public API, which
    this section records too.
    """
    try:
        import memory_bench  # benchmarks/memory_bench.py: the scenarios, pairs and layers
    except ImportError as error:
        return {"skipped": f"benchmarks/memory_bench.py could not be imported: {error}"}
    logging.getLogger("moderato").setLevel(logging.ERROR)  # memory:// announces itself once
    scenarios = []
    for name, rate, identities in memory_bench.SCENARIOS:
        results = run_loop(
            run_subjects(
                f"in-process ({name})",
                in_process_subjects(rate),
                (1,),
                config,
                progress,
                in_process=True,
                identities=identities,
            )
        )
        scenarios.append(
            {"name": name, "rate": rate, "identities": identities, "subjects": results}
        )
    try:
        layers = run_loop(memory_layers(config, progress))
    except Exception as error:  # memory_bench's helpers changed: keep the scenarios
        layers = {"error": f"{type(error).__name__}: {error}"}
    return {
        "scenarios": scenarios,
        "pairs": [
            {"moderato": algorithm, "limits": strategy, "what": what}
            for algorithm, strategy, what in memory_bench.PAIRS
        ],
        "layers": layers,
        "duration_s": config.memory_s,
    }


async def memory_layers(config: Config, progress: Progress) -> dict[str, Any]:
    """ns per check at each layer under ``check_with_info`` (memory_bench.layer_checks)."""
    import memory_bench

    layers: dict[str, Any] = {}
    for algorithm in ALGORITHMS:
        store_check, backend_check, limiter_check = memory_bench.layer_checks(algorithm)
        samples: dict[str, list[float]] = {"store": [], "backend": [], "limiter": []}
        for trial in range(config.trials):
            progress.step(
                "in-process (layers)", f"{algorithm}, trial {trial + 1}", 1.5 * config.memory_s
            )
            for layer, check in (
                ("store", store_check),
                ("backend", backend_check),
                ("limiter", limiter_check),
            ):
                samples[layer].append(await ns_per_call(check, config.memory_s / 2))
        layers[algorithm] = {layer: summary(values) for layer, values in samples.items()}
    return {
        "unit": "ns per check, one key, '1000000/second' (every check admitted)",
        "store": "MemoryStore.decide (C, prebuilt keys and arguments)",
        "backend": "MemoryBackend.decide (awaited)",
        "limiter": "RateLimiter.check_with_info (awaited, the public API)",
        "algorithms": layers,
    }


async def ns_per_call(check: Any, duration_s: float) -> float:
    clock = time.perf_counter
    calls = 0
    started = clock()
    deadline = started + duration_s
    is_async = asyncio.iscoroutinefunction(check)
    while clock() < deadline:
        for i in range(100):
            if is_async:
                await check(i)
            else:
                check(i)
        calls += 100
    return (clock() - started) / calls * 1e9


# -- 5. cluster ------------------------------------------------------------------------------


def cluster_section(config: Config, progress: Progress) -> dict[str, Any]:
    try:
        from cluster import RedisCluster  # tests/cluster.py

        from moderato.redis import is_cluster_url  # noqa: F401  (the Operations issue landed)
    except ImportError as error:
        return {"skipped": f"Redis Cluster support is not available: {error}"}
    progress.step("cluster", "starting a 3-primary cluster", 3.0)
    # Full run: one replica per primary, as in production and in benchmarks/cluster_bench.py.
    cluster = RedisCluster(primaries=3, replicas=config.cluster_replicas).start()
    try:
        subjects = moderato_subjects(cluster.url, label="moderato cluster")
        results = run_loop(run_subjects("cluster", subjects, (1, *CONCURRENCY), config, progress))
    finally:
        cluster.close()
    return {
        "topology": (
            f"3 primaries + {config.cluster_replicas} replica each, one redis-server process "
            "per node, all on this machine; client: one Python process"
        ),
        "rate": RATE,
        "identities": IDENTITIES,
        "window_s": config.window_s,
        "ramp_s": config.ramp_s,
        "subjects": results,
    }


def server_cpu_section(config: Config, progress: Progress) -> dict[str, Any]:
    """Redis CPU per decision, on a fresh redis-server started for this section alone."""
    requests = SERVER_CPU_REQUESTS[1 if config.quick else 0]
    planned_s = requests / 60_000

    def step(label: str) -> None:
        progress.step("server CPU", label, planned_s)

    with server_cpu.own_server() as port:
        result = server_cpu.run(port, requests, config.trials, step)
    for ratio in result["ratios"]:
        progress.note(
            f"server CPU {ratio['algorithm']}: {ratio['moderato_us']:.2f} vs "
            f"{ratio['peer_us']:.2f} µs/decision ({ratio['peer']}): {ratio['ratio']:.2f}x"
        )
    return result


def compare_cluster(sections: dict[str, Any]) -> None:
    """Cluster / single-node ratios for each algorithm and mode measured in both."""
    cluster = sections.get("cluster") or {}
    single = {s["name"]: s for s in (sections.get("limiter") or {}).get("subjects", [])}
    ratios: dict[str, dict[str, float]] = {}
    for subject in cluster.get("subjects", []):
        name = subject["name"].replace("moderato cluster", "moderato")
        reference = single.get(name)
        if reference is None or "sequential" not in subject or "sequential" not in reference:
            continue
        modes = {"sequential": (subject["sequential"], reference["sequential"])}
        for tasks, stats in subject["concurrent"].items():
            if tasks in reference["concurrent"]:
                modes[tasks] = (stats, reference["concurrent"][tasks])
        ratios[name] = {
            mode: mine["checks_per_s"]["median"] / theirs["checks_per_s"]["median"]
            for mode, (mine, theirs) in modes.items()
        }
    if ratios:
        cluster["vs_single_node"] = ratios


# -- targets ---------------------------------------------------------------------------------


def _median(stats: Optional[dict[str, Any]]) -> Optional[float]:
    return None if stats is None else stats.get("median")


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each a ratio of figures measured in this run."""
    out: list[dict[str, Any]] = []
    sections = report["sections"]
    redis = sections.get("redis") or {}
    limiter = sections.get("limiter") or {}
    floor = _median(redis.get("c1_p1", {}).get("ops_per_s"))
    ceiling = _median(redis.get("c50_p16", {}).get("ops_per_s"))
    plain_ceiling = _median(redis.get("c50_p16_plain", {}).get("ops_per_s"))
    subjects = {s["name"]: s for s in limiter.get("subjects", [])}

    def add(name: str, value: Optional[float], threshold: Optional[float], detail: str) -> None:
        """A target; with no threshold, a reference figure printed beside them."""
        met = None if value is None or threshold is None else value >= threshold
        out.append(
            {"target": name, "value": value, "threshold": threshold, "met": met, "detail": detail}
        )

    moderato_names = [n for n, s in subjects.items() if s["library"] == "moderato"]
    peer_names = [
        n
        for n, s in subjects.items()
        if not s["library"].startswith("moderato") and s["library"] != "reference"
    ]
    reference = "moderato token_bucket"  # the script redis-benchmark runs
    for tasks in ("100", "1000"):
        peers = {
            n: _median(subjects[n]["concurrent"].get(tasks, {}).get("checks_per_s"))
            for n in peer_names
        }
        peers = {n: v for n, v in peers.items() if v}
        best_peer = max(peers, key=lambda n: peers[n]) if peers else None
        for name in moderato_names:
            value = _median(subjects[name]["concurrent"].get(tasks, {}).get("checks_per_s"))
            if value and best_peer:
                add(
                    f"limiter-only {tasks} tasks: {name} / best peer",
                    value / peers[best_peer],
                    5.0,
                    f"{value:,.0f} vs {best_peer} {peers[best_peer]:,.0f} checks/s",
                )
        for name in (reference, "moderato token_bucket, 1 connection"):
            value = _median(
                subjects.get(name, {}).get("concurrent", {}).get(tasks, {}).get("checks_per_s")
            )
            if value and ceiling:
                add(
                    f"limiter-only {tasks} tasks: {name} / redis-benchmark -c 50 -P 16"
                    + ("" if name == reference else " (one connection, for reference)"),
                    value / ceiling,
                    0.70,
                    f"{value:,.0f} vs {ceiling:,.0f} ops/s",
                )
            if value and plain_ceiling and name == reference:
                # The ceiling of a minimal script, not one moderato's own script lowered.
                add(
                    f"limiter-only {tasks} tasks: {name} / redis-benchmark -c 50 -P 16 "
                    "of a plain token-bucket script",
                    value / plain_ceiling,
                    0.70,
                    f"{value:,.0f} vs {plain_ceiling:,.0f} ops/s",
                )
    # Sequential: each trial against the floor measured just before it (runs
    # without that pairing fall back to the redis section's floor).
    paired = (limiter.get("paired_floor") or {}).get("ops_per_s", {}).get("samples")
    bare_name = "bare asyncio client, token_bucket script"
    for name, threshold in ((reference, 0.80), (bare_name, None)):
        stats = subjects.get(name, {}).get("sequential", {}).get("checks_per_s")
        if not stats:
            continue
        samples = stats.get("samples") or []
        if paired and len(samples) == len(paired):
            ratio = statistics.median(ours / base for ours, base in zip(samples, paired))
            detail = (
                f"{stats['median']:,.0f} vs {statistics.median(paired):,.0f} ops/s; "
                "median of per-trial ratios, floor measured before each trial"
            )
        elif floor:
            ratio = stats["median"] / floor
            detail = f"{stats['median']:,.0f} vs {floor:,.0f} ops/s"
        else:
            continue
        # The bare client is not a target: it shows what any Python asyncio client reaches.
        add(
            f"limiter-only sequential: {name} / redis-benchmark -c 1 -P 1", ratio, threshold, detail
        )
    seq = _median(subjects.get(reference, {}).get("sequential", {}).get("checks_per_s"))
    bare = _median(subjects.get(bare_name, {}).get("sequential", {}).get("checks_per_s"))
    if bare and seq:
        add(
            f"limiter-only sequential: {reference} / {bare_name}",
            seq / bare,
            None,
            f"{seq:,.0f} vs {bare:,.0f} checks/s",
        )

    # Issue 31: the limiter over a bare client sending the same EVALSHA, slice pair by
    # slice pair (older runs: trial by trial).
    sliced = (sections.get("sequential") or {}).get("slices")
    if sliced and sliced["ratio"]["samples"]:
        ratios = sliced["ratio"]
        add(
            f"limiter-only sequential, paired slices: {reference} / {bare_name}",
            ratios["median"],
            0.95,
            f"median of {sliced['pairs']} per-slice-pair ratios "
            f"({ratios['min']:.3f}-{ratios['max']:.3f}); {sliced['what']}",
        )
    paired_subjects = {s["name"]: s for s in (sections.get("sequential") or {}).get("subjects", [])}
    ours_samples = (
        paired_subjects.get(reference, {}).get("sequential", {}).get("checks_per_s", {})
    ).get("samples")
    bare_samples = (
        paired_subjects.get(bare_name, {}).get("sequential", {}).get("checks_per_s", {})
    ).get("samples")
    if ours_samples and bare_samples:
        per_trial = [ours / bare for ours, bare in zip(ours_samples, bare_samples)]
        add(
            f"limiter-only sequential, paired trials: {reference} / {bare_name}",
            statistics.median(per_trial),
            None if sliced else 0.95,  # with slices, a reference beside their target
            "median of per-trial ratios: " + ", ".join(f"{r:.3f}" for r in per_trial),
        )

    # Server CPU: the peer's µs per decision over moderato's, so higher is better like
    # every other target; >= 1 / 1.2 is "moderato at most 1.2x the peer".
    for ratio in (sections.get("server_cpu") or {}).get("ratios", []):
        add(
            f"server CPU per decision: {ratio['peer']} / moderato {ratio['algorithm']}",
            ratio["peer_us"] / ratio["moderato_us"],
            round(1 / 1.2, 3),
            f"{ratio['moderato_us']:.2f} vs {ratio['peer_us']:.2f} µs/decision "
            f"({ratio['ratio']:.2f}x)",
        )

    e2e = (sections.get("e2e") or {}).get("apps", {})

    def rps(app: str, path: str) -> Optional[float]:
        return _median(e2e.get(app, {}).get(path, {}).get("requests_per_s"))

    peers_e2e = ("slowapi", "fastapi-limiter")

    def versus(app: str, path: str, reference: str, threshold: Optional[float]) -> None:
        """``app`` over ``reference`` in req/s; a reference figure when no threshold."""
        value, base = rps(app, path), rps(reference, path)
        if value and base:
            add(
                f"end-to-end {path}: {app} / {reference}",
                value / base,
                threshold,
                f"{value:,.0f} vs {base:,.0f} req/s",
            )

    # The floor (bare app + one trivial script call per request): how close to the
    # bare app an exact limiter that asks Redis per request can get on this machine.
    for floor_app in ("floor, moderato client", "floor, redis-py"):
        versus(floor_app, "allowed", "no limiter", None)
    for app in ("moderato decorator", "moderato dependency", "moderato middleware"):
        # Allowed: within 10% of the bare app; limited (one identity flooding):
        # at least its throughput, a local denial being cheaper than the endpoint.
        versus(app, "allowed", "no limiter", 0.90)
        versus(app, "limited", "no limiter", 1.0)
        versus(app, "allowed", "floor, moderato client", None)
        calls = _median(e2e.get(app, {}).get("limited", {}).get("redis_calls_per_request"))
        if calls is not None:
            add(
                f"end-to-end limited: {app}, Redis script calls per denied request",
                calls,
                None,
                "target <= 0.01 (INFO commandstats before and after each wrk run)",
            )
        for path in ("allowed", "limited"):
            mine = rps(app, path)
            peer_values = {p: v for p in peers_e2e for v in [rps(p, path)] if v}
            if mine and peer_values:
                best_peer = max(peer_values, key=lambda p: peer_values[p])
                add(
                    f"end-to-end {path}: {app} / best peer",
                    mine / peer_values[best_peer],
                    1.0,
                    f"{mine:,.0f} vs {best_peer} {peer_values[best_peer]:,.0f} req/s",
                )

    memory = sections.get("memory") or {}
    for scenario in memory.get("scenarios", []):
        by_key = {}
        for subject in scenario["subjects"]:
            rate_median = _median(subject.get("sequential", {}).get("checks_per_s"))
            key = subject.get("moderato_algorithm") or (subject.get("api"), subject.get("strategy"))
            by_key[key] = rate_median
        # Every in-process peer against the moderato algorithm of the same rate law
        # (issue 31: at least twice the throughput of each, awaited check_with_info).
        for subject in scenario["subjects"]:
            pair = subject.get("moderato_pair")
            mine = by_key.get(pair)
            theirs = _median(subject.get("sequential", {}).get("checks_per_s"))
            if pair and mine and theirs:
                add(
                    f"in-process ({scenario['name']}): memory:// {pair} / {subject['name']}",
                    mine / theirs,
                    2.0,
                    f"{mine:,.0f} vs {theirs:,.0f} checks/s",
                )
    return out


# -- main ------------------------------------------------------------------------------------


def planned_seconds(config: Config, sections: tuple[str, ...]) -> float:
    """The run's expected length, for the progress line's ETA (calibrated on this machine)."""
    moderato = len(ALGORITHMS)
    per_trial = sum(sum(config.window(tasks)) + 0.02 for tasks in (1, *CONCURRENCY))
    per_subject = config.warmup_s * 3 + config.trials * per_trial
    total = 0.0
    if "redis" in sections:
        total += config.trials * (
            config.floor_requests / 20_000 + config.ceiling_requests * (1 / 45_000 + 1 / 100_000)
        )
    if "limiter" in sections:
        # The peers take longer: 1000 in-flight checks drain slowly, and each limits
        # client's pool opens slowly (once: its strategies share one storage).
        peers = 3 * len(config.limits_clients) + 2
        total += (moderato + 2) * (per_subject + 0.2) + peers * (per_subject + 0.4)
        total += len(config.limits_clients) * 1.0
        total += config.trials * config.floor_requests / 20_000  # the paired floors
    if "e2e" in sections:
        # Six apps on both paths, the two floors on the allowed one.
        runs = (12 if config.limited_path else 6) + 2
        total += 2.5 + config.e2e_trials * runs * (config.wrk_s + 0.15)
    if "memory" in sections:
        total += 2 * (moderato + 6) * (config.warmup_s + config.trials * config.memory_s)
        total += moderato * config.trials * 1.5 * config.memory_s
    if "cluster" in sections:
        total += 3.0 + moderato * (per_subject + 0.2)
    if "server_cpu" in sections:
        requests = SERVER_CPU_REQUESTS[1 if config.quick else 0]
        total += config.trials * (2 * moderato + 7) * requests / 60_000
    return total


@contextlib.contextmanager
def redis_target(url: Optional[str]) -> Iterator[tuple[str, int]]:
    if url:
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        yield url, port
        return
    server = RedisServer().start()
    try:
        yield server.url, server.port
    finally:
        server.close()


def print_summary(report: dict[str, Any]) -> None:
    print(
        f"\nmoderato benchmarks ({'quick' if report['quick'] else 'full'} run, "
        f"{report['config']['trials']} trials; medians [min..max])"
    )
    for target in report["targets"]:
        value = "n/a" if target["value"] is None else f"{target['value']:.2f}"
        if target["threshold"] is None:
            print(f"  ref    {target['target']}: {value} ({target['detail']})")
            continue
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[target["met"]]
        print(
            f"  {mark} {target['target']}: {value} (target >= {target['threshold']}; "
            f"{target['detail']})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a fifth of the full run")
    parser.add_argument("--trials", type=int, help="override the number of trials")
    parser.add_argument(
        "--e2e-trials", type=int, help="override the number of wrk runs per app and path"
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument("--redis-url", help="use this redis:// server instead of starting one")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--no-progress", action="store_true", help="no status line on stderr")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of the limiter-only, in-process and cluster sections (default asyncio;"
        " the end-to-end apps always run uvicorn's best available loop)",
    )
    parser.add_argument(
        "--batch-decisions",
        action="store_true",
        help="the end-to-end moderato apps with batched decisions on (?batch_decisions=true;"
        " the library's default is off)",
    )
    args = parser.parse_args()
    if args.batch_decisions:
        os.environ["MODERATO_BENCH_BATCH_DECISIONS"] = "1"  # read by benchmarks/apps
    global LOOP
    LOOP = args.loop
    config = QUICK if args.quick else FULL
    if args.trials:
        config = Config(**{**asdict(config), "trials": args.trials})
    if args.e2e_trials:
        config = Config(**{**asdict(config), "e2e_trials": args.e2e_trials})
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")

    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = load_average()
    progress = Progress(planned_seconds(config, sections), enabled=not args.no_progress)
    wall_started = time.monotonic()
    report: dict[str, Any] = {
        "kind": "performance-run",
        "schema": 1,
        "started_at": started_at,
        "quick": config.quick,
        "config": {
            **asdict(config),
            "rate": RATE,
            "identities": IDENTITIES,
            "concurrency": list(CONCURRENCY),
            "wrk_connections": WRK_CONNECTIONS,
            "sections": list(sections),
            "loop": LOOP,
            "batch_decisions": bool(args.batch_decisions),
        },
        "sections": {},
    }
    with redis_target(args.redis_url) as (url, port):
        env = environment(redis_info(port))
        progress.note(
            f"redis {env['redis']} on port {port}; python {env['python']}; "
            f"load average {load_start}"
        )
        runners = {
            "redis": lambda: redis_section(port, config, progress),
            "limiter": lambda: limiter_section(url, port, config, progress),
            "sequential": lambda: sequential_section(url, port, config, progress),
            "e2e": lambda: e2e_section(url, port, config, progress),
            "memory": lambda: memory_section(config, progress),
            "cluster": lambda: cluster_section(config, progress),
            "server_cpu": lambda: server_cpu_section(config, progress),
        }
        for name in SECTIONS:
            if name in sections:
                report["sections"][name] = runners[name]()
    compare_cluster(report["sections"])
    env["load_average_start"] = load_start
    env["load_average_end"] = load_average()
    report["environment"] = env
    report["duration_s"] = time.monotonic() - wall_started
    report["targets"] = targets(report)
    progress.note(f"done in {report['duration_s']:.0f} s")

    args.output.mkdir(parents=True, exist_ok=True)
    stamp = started_at.replace("-", "").replace(":", "")
    suffix = ("-quick" if config.quick else "") + ("-uvloop" if LOOP == "uvloop" else "")
    suffix += "-batched" if args.batch_decisions else ""
    path = args.output / f"run-{stamp}{suffix}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(report)
    print(f"raw results: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
