"""What mounting the operator's dashboard costs a limited app, and what it sends Redis.

The same FastAPI app (benchmarks/apps/moderato_decorator.py: ``@limiter.limit``
on ``/allowed``, every request admitted, and on ``/limited``, every request
denied after the first) without and with ``moderato.dashboard.Dashboard``
mounted (benchmarks/apps/moderato_decorator_dashboard.py), against a private
redis-server. Four figures:

1. end to end: requests/s under ``wrk -t 1 -c 32``, one uvicorn process per
   variant, the two alternated run by run (which goes first alternates too),
   so the machine's drift falls on both; the ratio with/without of each pair
   of adjacent runs, and its median;
2. CPU per request: the app driven straight through ASGI in a child process
   of its own per variant and path (32 requests in flight, as wrk keeps its
   connections busy; benchmarks/app_cpu.py's driver), the least of its trials:
   steadier than requests/s on a shared machine, and what the dashboard adds
   to each request (its publisher's work included);
3. instructions per request: the same driver under valgrind's callgrind,
   one process per variant and path: exact, whatever else the machine runs.
   The publisher is left stopped here (under callgrind a request takes ~50
   times longer, and its once-a-second publication would be charged to 50
   times fewer requests than at full speed): this is the check path's own
   cost, and the publication's is figure 4;
4. Redis and the publisher: the commands each server process sent besides
   its checks, per second of its life (the publication script runs
   ZREMRANGEBYSCORE once per call and nothing else does, so INFO
   commandstats counts publications), and the CPU one publication costs,
   timed in process for a recorder holding 20 limits and 64 identities.

    python benchmarks/dashboard_overhead.py [--pairs 10] [--seconds 3]

Writes benchmarks/results/dashboard-overhead-<UTC time>-<commit>.json (every
run's figures, the machine's load average before and after) and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from benchmarks.app_cpu import Driver, instructions, run  # noqa: E402
from benchmarks.performance import (  # noqa: E402
    git_commit,
    http_status,
    load_average,
    process_cpu_s,
    redis_info,
    run_wrk,
    start_app,
    summary,
    wait_ready,
)

VARIANTS = {"without": "moderato_decorator", "with dashboard": "moderato_decorator_dashboard"}
PATHS = ("allowed", "limited")
RESULTS = ROOT / "benchmarks" / "results"


def command_calls(port: int) -> dict[str, int]:
    """Calls per command since the server started (INFO commandstats)."""
    info = redis_info(port, section="commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value.split("calls=")[1].split(",")[0])
        for name, value in info.items()
        if name.startswith("cmdstat_")
    }


def head_commit() -> str:
    """HEAD's commit (a git worktree's .git is a file, which git_commit() does not read)."""
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return found.stdout.strip() or git_commit()


def uptime_line() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# -- 1. end to end ------------------------------------------------------------------


def end_to_end(
    redis_url: str, redis_port: int, pairs: int, seconds: int, log_dir: Path
) -> dict[str, Any]:
    servers = {
        name: start_app(name, module, redis_url, log_dir) for name, module in VARIANTS.items()
    }
    started_s = {name: time.monotonic() for name in servers}
    try:
        for server in servers.values():
            wait_ready(server)
            for path in PATHS:  # warm-up: connect, load the scripts, spend /limited's one
                for _ in range(50):
                    http_status(f"{server.base}/{path}")
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {path: [] for path in PATHS} for name in servers
        }
        calls_before = command_calls(redis_port)
        for pair in range(pairs):
            order = list(servers) if pair % 2 == 0 else list(reversed(servers))
            for path in PATHS:
                for name in order:
                    server = servers[name]
                    cpu_before = process_cpu_s(server.process.pid)
                    evalsha_before = command_calls(redis_port).get("evalsha", 0)
                    report = run_wrk(f"{server.base}/{path}", seconds)
                    elapsed_s = report["duration_us"] / 1e6
                    report["requests_per_s"] = report["requests"] / elapsed_s
                    report["app_cpu_pct"] = (
                        (process_cpu_s(server.process.pid) - cpu_before) / elapsed_s * 100
                    )
                    report["evalsha"] = command_calls(redis_port).get("evalsha", 0) - evalsha_before
                    # The server's own CPU per request: steadier than requests/s when
                    # other work competes for the cores.
                    report["cpu_us_per_request"] = (
                        (process_cpu_s(server.process.pid) - cpu_before)
                        / max(report["requests"], 1)
                        * 1e6
                    )
                    report["load_average"] = load_average()
                    runs[name][path].append(report)
                print(
                    f"  pair {pair + 1}/{pairs} /{path}: "
                    + ", ".join(
                        f"{name} {runs[name][path][-1]['requests_per_s']:.0f} req/s"
                        for name in servers
                    ),
                    flush=True,
                )
        calls_after = command_calls(redis_port)
        lives_s = {name: time.monotonic() - started_s[name] for name in servers}
        # Each variant's publications: only the "with" server publishes, one
        # ZREMRANGEBYSCORE per publication; counted over both servers' whole lives.
        publications = calls_after.get("zremrangebyscore", 0)
    finally:
        for server in servers.values():
            server.process.terminate()
            server.process.wait(timeout=10)
    ratios = {
        path: [
            with_run["requests_per_s"] / without_run["requests_per_s"]
            for with_run, without_run in zip(runs["with dashboard"][path], runs["without"][path])
        ]
        for path in PATHS
    }
    return {
        "load_generator": f"wrk -t 1 -c 32 -d {seconds}s --timeout 2s",
        "server": "uvicorn, one process per variant, --no-access-log",
        "pairs": pairs,
        "requests_per_s": {
            name: {path: summary([r["requests_per_s"] for r in runs[name][path]]) for path in PATHS}
            for name in servers
        },
        "ratio_with_over_without": {path: summary(ratios[path]) for path in PATHS},
        "server_cpu_us_per_request": {
            name: {
                path: summary([r["cpu_us_per_request"] for r in runs[name][path]]) for path in PATHS
            }
            for name in servers
        },
        "redis": {
            "publications": publications,
            "with_server_life_s": lives_s["with dashboard"],
            "publications_per_s": publications / lives_s["with dashboard"],
            "commands_during_runs": {
                name: calls_after.get(name, 0) - calls_before.get(name, 0)
                for name in sorted(calls_after)
                if calls_after.get(name, 0) != calls_before.get(name, 0)
            },
        },
        "runs": runs,
    }


# -- 2. CPU per request ---------------------------------------------------------------


async def cpu_child(module: str, path: str, requests: int, trials: int) -> dict[str, Any]:
    driver = Driver(module, path)
    await driver.start()
    await driver.run(2000, 32)  # warm-up (and the limited path's one admission)
    samples = []
    for _ in range(trials):
        started = time.process_time()
        await driver.run(requests, 32)
        samples.append((time.process_time() - started) / requests * 1e6)
    await driver.stop()
    return {"cpu_us_per_request": min(samples), "samples": samples, "statuses": driver.statuses}


def cpu_per_request(redis_url: str, requests: int, trials: int, rounds: int) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {
        name: {path: [] for path in PATHS} for name in VARIANTS
    }
    statuses: dict[str, dict[str, Any]] = {name: {} for name in VARIANTS}
    env = dict(os.environ, MODERATO_BENCH_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    for round_number in range(rounds):
        names = list(VARIANTS) if round_number % 2 == 0 else list(reversed(VARIANTS))
        for path in PATHS:
            for name in names:
                child = subprocess.run(
                    [sys.executable, __file__, "--cpu-child", VARIANTS[name], path,
                     "--requests", str(requests), "--trials", str(trials)],
                    capture_output=True, text=True, env=env, check=True,
                )  # fmt: skip
                result = json.loads(child.stdout.strip().splitlines()[-1])
                figures[name][path].append(result["cpu_us_per_request"])
                statuses[name][path] = result["statuses"]
            print(
                f"  round {round_number + 1}/{rounds} /{path}: "
                + ", ".join(f"{name} {figures[name][path][-1]:.1f} us" for name in VARIANTS),
                flush=True,
            )
    return {
        "requests_per_trial": requests,
        "trials_per_child": trials,
        "concurrency": 32,
        "cpu_us_per_request": {
            name: {path: summary(figures[name][path]) for path in PATHS} for name in VARIANTS
        },
        "added_us_per_request": {
            path: statistics.median(figures["with dashboard"][path])
            - statistics.median(figures["without"][path])
            for path in PATHS
        },
        "statuses": statuses,
    }


# -- 3. instructions per request ---------------------------------------------------------


def instructions_per_request(redis_url: str, requests: int) -> dict[str, Any]:
    os.environ["MODERATO_BENCH_REDIS_URL"] = redis_url
    os.environ["MODERATO_BENCH_DASHBOARD_PUBLISHER"] = "off"  # see the module docstring
    figures: dict[str, dict[str, Any]] = {name: {} for name in VARIANTS}
    for path in PATHS:
        for name, module in VARIANTS.items():  # one callgrind process each
            figure = instructions([module], path, requests, 32)[module]
            figures[name][path] = figure
            print(
                f"  {name:15} /{path:8} {figure['instructions_per_request']:10,.0f}"
                " instructions/request",
                flush=True,
            )
    del os.environ["MODERATO_BENCH_DASHBOARD_PUBLISHER"]
    return {
        "requests": requests,
        "concurrency": 32,
        "publisher": "stopped (the check path alone)",
        "instructions_per_request": figures,
        "ratio_with_over_without": {
            path: figures["with dashboard"][path]["instructions_per_request"]
            / figures["without"][path]["instructions_per_request"]
            for path in PATHS
        },
    }


# -- 4. one publication ------------------------------------------------------------------


async def publication_cost(redis_url: str, publications: int) -> dict[str, Any]:
    """CPU per publication of a recorder holding 20 limits and 64 identities."""
    from moderato import RateLimiter
    from moderato.dashboard.app import attach
    from moderato.dashboard.fleet import PUBLISH_SCRIPT

    limiter = RateLimiter(redis_url, key_prefix="bench-dashboard-publication")
    recorder, publisher = attach(limiter)
    assert publisher is not None
    publisher.ensure_running = lambda: None  # type: ignore[method-assign]  # timed by hand
    for n in range(2000):
        await limiter.check_with_info(f"client-{n % 64}", "50/minute", scope=f"route-{n % 20}")
    sent_bytes = []
    original_evalsha = publisher.client.evalsha

    def measured_evalsha(script: Any, keys: list[Any], args: list[Any]) -> Any:
        sent_bytes.append(sum(len(str(part)) for part in (*keys, *args)))
        return original_evalsha(script, keys, args)

    publisher.client.evalsha = measured_evalsha
    await publisher.publish_once()
    started = time.process_time()
    for _ in range(publications):
        recorder.decided(
            limiter._plans.get("50/minute", None),
            "client-0",
            "route-0",
            await limiter.check_with_info("client-0", "50/minute", scope="route-0"),
            time.perf_counter(),
        )
        await publisher.publish_once()
    cpu_s = time.process_time() - started
    await limiter.close()
    return {
        "publications": publications,
        "cpu_us_per_publication": cpu_s / publications * 1e6,
        "argument_bytes_per_publication": statistics.median(sent_bytes),
        "script_sha": PUBLISH_SCRIPT.sha,
        "note": "each publication here follows one check (timed with it): an upper bound",
    }


# -- the run ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="wrk runs per variant and path")
    parser.add_argument("--seconds", type=int, default=3, help="one wrk run")
    parser.add_argument("--cpu-rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--callgrind-requests", type=int, default=2000, help="0: skip callgrind")
    parser.add_argument("--cpu-child", nargs=2, metavar=("MODULE", "PATH"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.cpu_child:
        module, path = arguments.cpu_child
        result = run(cpu_child(module, path, arguments.requests, arguments.trials))
        print(json.dumps(result))
        return

    from redis_servers import RedisServer

    report: dict[str, Any] = {
        "commit": head_commit(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "uptime_before": uptime_line(),
    }
    print(f"load: {report['uptime_before']}", flush=True)
    server = RedisServer().start()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"moderato-dashboard-bench-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        print("end to end (wrk):", flush=True)
        report["end_to_end"] = end_to_end(
            server.url, server.port, arguments.pairs, arguments.seconds, log_dir
        )
        print("CPU per request (ASGI, in process):", flush=True)
        report["cpu"] = cpu_per_request(
            server.url, arguments.requests, arguments.trials, arguments.cpu_rounds
        )
        if arguments.callgrind_requests and shutil.which("valgrind"):
            print("instructions per request (callgrind):", flush=True)
            report["instructions"] = instructions_per_request(
                server.url, arguments.callgrind_requests
            )
        print("one publication:", flush=True)
        report["publication"] = asyncio.run(publication_cost(server.url, 200))
    finally:
        server.close()
    report["uptime_after"] = uptime_line()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"dashboard-overhead-{stamp}-{report['commit'][:7]}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print_summary(report)
    print(f"load: {report['uptime_after']}\nwritten: {out.relative_to(ROOT)}")


def print_summary(report: dict[str, Any]) -> None:
    e2e, cpu = report["end_to_end"], report["cpu"]
    print("\nrequests/s, median [min..max] of each variant's runs:")
    for name, paths in e2e["requests_per_s"].items():
        for path, stats in paths.items():
            spread = f"[{stats['min']:.0f}..{stats['max']:.0f}]"
            print(f"  {name:15} /{path:8} {stats['median']:8.0f} {spread}")
    for path, stats in e2e["ratio_with_over_without"].items():
        print(
            f"  with/without, /{path}: median of pairs {stats['median']:.3f} "
            f"[{stats['min']:.3f}..{stats['max']:.3f}]"
        )
    print("CPU per request (us), median of the children's least trial:")
    for name, paths in cpu["cpu_us_per_request"].items():
        for path, stats in paths.items():
            spread = f"[{stats['min']:.1f}..{stats['max']:.1f}]"
            print(f"  {name:15} /{path:8} {stats['median']:7.1f} {spread}")
    for path, added in cpu["added_us_per_request"].items():
        base = cpu["cpu_us_per_request"]["without"][path]["median"]
        print(f"  added by the dashboard, /{path}: {added:+.1f} us ({added / base * 100:+.1f}%)")
    print("server CPU per request during the wrk runs (us), median:")
    for name, paths in e2e["server_cpu_us_per_request"].items():
        for path, stats in paths.items():
            spread = f"[{stats['min']:.1f}..{stats['max']:.1f}]"
            print(f"  {name:15} /{path:8} {stats['median']:7.1f} {spread}")
    if "instructions" in report:
        for path, ratio in report["instructions"]["ratio_with_over_without"].items():
            print(f"  instructions with/without, /{path}: {ratio:.4f}")
    publication = report["publication"]
    print(
        f"one publication: {publication['cpu_us_per_publication']:.0f} us CPU, "
        f"{publication['argument_bytes_per_publication']:.0f} bytes of arguments"
    )
    redis = e2e["redis"]
    print(
        f"Redis: {redis['publications']} publications in {redis['with_server_life_s']:.0f} s "
        f"of the dashboard process's life ({redis['publications_per_s']:.2f}/s)"
    )


if __name__ == "__main__":
    main()
