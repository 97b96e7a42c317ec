"""The app's own CPU per request, without uvicorn or wrk: the end-to-end apps driven in process.

Each app of benchmarks/apps/ is called straight through ASGI, ``--concurrency``
requests in flight (as wrk keeps its connections busy), against a private
redis-server. Two figures, both repeatable on a shared machine where the
end-to-end throughput is not:

- ``cpu`` (default): this process's CPU time per request (time.process_time,
  the least disturbed of ``--trials``);
- ``callgrind``: instructions per request, counted by valgrind's callgrind,
  every app in one process: its counters are dumped just before and just
  after each app's measured requests, so start-up and warm-up are not
  counted. Slow (a minute or two for all the apps), and exact.

What it leaves out is the same for every app: uvicorn's HTTP parsing and
response writing, and the load generator. So it tells what the limiter adds
to an app, not the end-to-end ratio itself.

    python benchmarks/app_cpu.py                      # every app, CPU time
    python benchmarks/app_cpu.py --mode callgrind baseline moderato_decorator
    python benchmarks/app_cpu.py --path limited moderato_decorator
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from benchmarks import apps  # noqa: E402

BODY_MESSAGE = {"type": "http.request", "body": b"", "more_body": False}


def http_scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk"), (b"accept", b"*/*")],
        "state": {},
    }


async def receive() -> dict[str, Any]:
    return BODY_MESSAGE


class Driver:
    """Runs one app's lifespan and sends it requests; counts the statuses it answers."""

    def __init__(self, module: str, path: str) -> None:
        self.app = importlib.import_module(f"benchmarks.apps.{module}").app
        self.path = f"/{path}"
        self.statuses: dict[int, int] = {}
        self._lifespan_in: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan_out: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._lifespan = asyncio.ensure_future(
            self.app(scope, self._lifespan_in.get, self._lifespan_out.put)
        )
        await self._lifespan_in.put({"type": "lifespan.startup"})
        message = await self._lifespan_out.get()
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"lifespan startup failed: {message}")

    async def stop(self) -> None:
        await self._lifespan_in.put({"type": "lifespan.shutdown"})
        await self._lifespan_out.get()
        if self._lifespan is not None:
            await self._lifespan

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status = message["status"]
            self.statuses[status] = self.statuses.get(status, 0) + 1

    async def run(self, requests: int, concurrency: int) -> None:
        app, path, send = self.app, self.path, self.send

        async def worker(count: int) -> None:
            for _ in range(count):
                await app(http_scope(path), receive, send)

        share, extra = divmod(requests, concurrency)
        await asyncio.gather(*(worker(share + (n < extra)) for n in range(concurrency)))


async def cpu_per_request(
    module: str, path: str, requests: int, concurrency: int, trials: int
) -> dict[str, Any]:
    driver = Driver(module, path)
    await driver.start()
    await driver.run(min(requests, 2000), concurrency)  # warm-up (and the limited path's 200)
    samples = []
    for _ in range(trials):
        started = time.process_time()
        await driver.run(requests, concurrency)
        samples.append((time.process_time() - started) / requests * 1e6)
    await driver.stop()
    return {"cpu_us_per_request": min(samples), "samples": samples, "statuses": driver.statuses}


async def measured_run(module: str, path: str, requests: int, concurrency: int) -> dict[int, int]:
    """Under callgrind: warm up, then ``requests`` between two dumps (see ``instructions``)."""
    driver = Driver(module, path)
    await driver.start()
    await driver.run(max(requests // 4, concurrency), concurrency)
    driver.statuses.clear()
    # Every app starts its measured requests from the same collector state: an
    # old generation's collection falling inside one app's window and not
    # another's would move its figure by thousands of instructions per request.
    gc.collect()
    os.getppid()  # callgrind dumps here (--dump-before): what came before is not counted
    await driver.run(requests, concurrency)
    os.getppid()  # ... and here: this dump holds the measured requests alone
    await driver.stop()
    return driver.statuses


def instructions(modules: list[str], path: str, requests: int, concurrency: int) -> dict[str, Any]:
    """Instructions per request of each app, all in one process under callgrind.

    The driver calls ``os.getppid()`` just before and just after each app's
    measured requests, and callgrind dumps its counters on entering that
    function: every second dump holds one app's requests and nothing else.
    """
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--dump-before=os_getppid*", sys.executable, __file__, "--mode", "plain",
            "--path", path, "--requests", str(requests), "--concurrency", str(concurrency),
            *modules,
        ]  # fmt: skip
        # Under callgrind the app runs about 50 times slower than Redis answers.
        env = dict(os.environ, MODERATO_BENCH_TIMEOUT_S="60")
        finished = subprocess.run(command, capture_output=True, text=True, env=env)
        if finished.returncode != 0:
            raise RuntimeError(f"callgrind run failed:\n{finished.stderr[-3000:]}")
        statuses = json.loads(finished.stdout.strip().splitlines()[-1])
        dumps = sorted(out.parent.glob("callgrind.out.*"), key=lambda f: int(f.suffix[1:]))
        totals = []
        for dump in dumps:
            found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(errors="replace"), re.M)
            if found is None:
                raise RuntimeError(f"callgrind wrote no totals in {dump.name}")
            totals.append(int(found.group(1)))
    if len(totals) != 2 * len(modules):
        raise RuntimeError(f"expected {2 * len(modules)} callgrind dumps, got {len(totals)}")
    return {
        module: {
            "instructions_per_request": totals[2 * n + 1] / requests,
            "statuses": statuses[module],
        }
        for n, module in enumerate(modules)
    }


def floor_target(figures: dict[str, Any], field: Optional[str]) -> Optional[dict[str, Any]]:
    """Issue 31: the decorated route's app CPU per allowed request at most the bare
    app's plus one plain Redis round trip's (the moderato-client floor app) plus 10%."""
    field = field or "instructions_per_request"
    floor, decorated = figures.get("floor_moderato_client"), figures.get("moderato_decorator")
    if not floor or not decorated:
        return None
    ratio = decorated[field] / floor[field]
    verdict = "met" if ratio <= 1.10 else "MISSED"
    return {
        "ratio": ratio,
        "threshold": 1.10,
        "met": ratio <= 1.10,
        "line": f"{verdict}: moderato_decorator / floor_moderato_client = {ratio:.3f}"
        f" (target <= 1.10; {decorated[field]:,.1f} vs {floor[field]:,.1f} {field})",
    }


def run(coroutine: Any) -> Any:
    """On uvloop when installed, as uvicorn runs the end-to-end apps."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="apps under benchmarks/apps (default: all)")
    parser.add_argument("--mode", choices=("cpu", "callgrind", "plain"), default="cpu")
    parser.add_argument("--path", default="allowed", choices=("allowed", "limited"))
    parser.add_argument("--requests", type=int)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--redis-url", help="use this server instead of starting one")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.mode == "plain":  # under callgrind: every app in turn, statuses on stdout
        statuses = {
            module: run(measured_run(module, args.path, args.requests, args.concurrency))
            for module in args.modules
        }
        print(json.dumps(statuses))
        return
    modules = args.modules or list(apps.APPS.values())
    if args.path == "limited":
        modules = [m for m in modules if m not in {apps.APPS[name] for name in apps.FLOORS}]
    server = None
    if args.redis_url is None:
        from redis_servers import RedisServer

        server = RedisServer().start()
        os.environ["MODERATO_BENCH_REDIS_URL"] = server.url
    else:
        os.environ["MODERATO_BENCH_REDIS_URL"] = args.redis_url
    figures: dict[str, Any] = {}
    try:
        if args.mode == "callgrind":
            figures = instructions(modules, args.path, args.requests or 1000, args.concurrency)
            for module, figure in figures.items():
                print(
                    f"{module:28} /{args.path:8} {figure['instructions_per_request']:10,.0f}"
                    f" instructions/request  statuses {figure['statuses']}"
                )
        for module in modules if args.mode == "cpu" else ():
            requests = args.requests or 20_000
            figure = run(
                cpu_per_request(module, args.path, requests, args.concurrency, args.trials)
            )
            print(
                f"{module:28} /{args.path:8} {figure['cpu_us_per_request']:7.1f} us CPU/request"
                f"  statuses {figure['statuses']}",
                flush=True,
            )
            figures[module] = figure
    finally:
        if server is not None:
            server.close()
    target = floor_target(figures, "cpu_us_per_request" if args.mode == "cpu" else None)
    if target is not None:
        print(target["line"])
        figures["target"] = target
    if args.json is not None:
        record = {
            "kind": "app-cpu",
            "mode": args.mode,
            "path": args.path,
            "concurrency": args.concurrency,
            "load_average": os.getloadavg(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "apps": figures,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
