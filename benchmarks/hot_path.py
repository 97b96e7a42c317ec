"""The cost of one check through the public API, step by step.

One awaited ``limiter.check_with_info(key, rate)`` on ``memory://`` and on a
private redis-server (unix socket, sequential: one round trip per check),
with the layers under it timed on their own, from the floor up:

    noop_await        awaiting a coroutine that does nothing (the floor of any async API)
    store_decide      the C store's decision alone (keys and arguments prebuilt)
    store_result      the decision and the CheckResult built from its reply (C)
    build_keys        the key bytes of one check (C)
    decision_keys     the same through the backend (the argument checks around it)
    check_now         memory://'s decision, keys prebuilt (arguments + decision + result)
    decision          the limiter's _decision (keys, breaker, decision, result)
    check_with_info   the public call, awaited
    redis_evalsha     the client's EVALSHA of the same script, awaited (Redis floor)
    redis_check       check_with_info over Redis, awaited

Two measurements:

* wall and CPU time per call (the least disturbed of several trials; the
  machine may be shared, so the load average is printed beside them);
* with ``--callgrind STEP COUNT``: the process runs every step's warm-up and
  then STEP COUNT times, so that under ``valgrind --tool=callgrind`` the
  instructions of one call are (total - total of a run with COUNT 0) / COUNT,
  a figure the neighbours cannot disturb. ``--callgrind-all`` runs that for
  every step and prints the table (slow: one valgrind run per step).

    python benchmarks/hot_path.py                       # times
    python benchmarks/hot_path.py --callgrind-all       # instructions per call
    python benchmarks/hot_path.py --json out.json ...   # also write the raw figures
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moderato import RateLimiter, _accel  # noqa: E402
from moderato.policy import SCALE  # noqa: E402
from moderato.scripts import load_script  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from callgrind_steps import (  # noqa: E402
    add_callgrind_options,
    instructions_per_call,
)
from subjects import bare_client  # noqa: E402

RATE = "1000000/minute"
KEY = "user-1"
WARMUP = 3000
CALLGRIND_WARMUP = 500  # the interpreter specialises after a few dozen calls

Step = Callable[[], Awaitable[Any]]


async def _nothing() -> None:
    return None


async def build_steps(redis_socket: str | None) -> dict[str, Step]:
    """Each step as a coroutine function doing one call of that layer."""
    memory = RateLimiter("memory://")
    backend: Any = memory.backend
    plan = memory.plan_for(RATE)
    keys = backend.decision_keys(plan, KEY, None, "global")
    args = (SCALE, 1, *plan.script_args)
    store, name, shape = backend.store, plan.algorithm.name, plan.result_shape
    keyspace = backend.keyspace
    key_tag, windows_s = plan.algorithm.key_tag, plan.policy.windows_s

    async def noop_await() -> None:
        await _nothing()

    async def store_decide() -> None:
        store.decide(name, keys, args, None)

    async def store_result() -> None:
        _accel.check_result(store.decide(name, keys, args, None), shape)

    async def build_keys() -> None:
        _accel.build_keys(
            keyspace.prefix, key_tag, "", "global", KEY, windows_s, keyspace.identity_secret
        )

    async def decision_keys() -> None:
        backend.decision_keys(plan, KEY, None, "global")

    async def check_now() -> None:
        backend.check_now(plan, keys, SCALE, True)

    async def decision() -> None:
        # memory://'s decision is the result itself, nothing to await (it was a
        # coroutine before issue 31).
        memory._decision("decide", plan, KEY, None, "global", SCALE)

    async def check_with_info() -> None:
        await memory.check_with_info(KEY, RATE)

    steps: dict[str, Step] = {
        "noop_await": noop_await,
        "store_decide": store_decide,
        "store_result": store_result,
        "build_keys": build_keys,
        "decision_keys": decision_keys,
        "check_now": check_now,
        "decision": decision,
        "check_with_info": check_with_info,
    }
    if redis_socket is not None:
        remote = RateLimiter(f"unix://{redis_socket}", command_timeout_s=10)
        await remote.connect()
        client: Any = remote.backend.client  # type: ignore[attr-defined]
        script = load_script(name)
        remote_keys = remote.backend.decision_keys(plan, KEY, None, "global")

        async def redis_evalsha() -> None:
            await client.evalsha(script, remote_keys, args)

        async def redis_check() -> None:
            await remote.check_with_info(KEY, RATE)

        steps["redis_bare"] = await bare_evalsha(redis_socket, script, plan, args)
        steps["redis_evalsha"] = redis_evalsha
        steps["redis_check"] = redis_check
    return steps


async def bare_evalsha(redis_socket: str, script: Any, plan: Any, args: tuple[int, ...]) -> Step:
    """The bare asyncio client of performance.py's sequential target (subjects.py's):
    keys built by _accel, the EVALSHA written at once, hiredis, one future per
    command, no result object: the least a Python asyncio check can cost."""
    loop = asyncio.get_running_loop()
    _, send = await bare_client(
        lambda protocol: loop.create_unix_connection(protocol, redis_socket), script.source
    )
    key_tag, windows_s = plan.algorithm.key_tag, plan.policy.windows_s

    async def redis_bare() -> None:
        keys = _accel.build_keys("bench-bare", key_tag, "", "global", KEY, windows_s)
        await send(_accel.encode_evalsha(script.sha, keys, args))

    return redis_bare


async def per_call_s(step: Step, count: int, trials: int) -> tuple[float, float]:
    """The least disturbed trial's wall and CPU seconds per call."""
    walls, cpus = [], []
    for _ in range(trials):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(count):
            await step()
        walls.append((time.perf_counter() - wall0) / count)
        cpus.append((time.process_time() - cpu0) / count)
    return min(walls), min(cpus)


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def start_redis(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    sock = os.path.join(directory, "redis.sock")
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", sock, "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    return server, sock


async def timed(redis_socket: str | None, count: int, trials: int) -> dict[str, Any]:
    steps = await build_steps(redis_socket)
    figures: dict[str, Any] = {"load_before": load()}
    for name, step in steps.items():
        for _ in range(WARMUP):
            await step()
        calls = count if not name.startswith("redis") else max(count // 10, 1000)
        wall_s, cpu_s = await per_call_s(step, calls, trials)
        figures[name] = {"wall_us": wall_s * 1e6, "cpu_us": cpu_s * 1e6, "calls": calls}
        print(f"{name:16} wall {wall_s * 1e6:7.3f} us   cpu {cpu_s * 1e6:7.3f} us")
    figures["load_after"] = load()
    print(f"load average: {figures['load_before']} -> {figures['load_after']}")
    return figures


async def one_step(redis_socket: str | None, chosen: str, count: int) -> None:
    """Every step's warm-up, then ``chosen`` ``count`` times (for callgrind)."""
    steps = await build_steps(redis_socket)
    for step in steps.values():
        for _ in range(CALLGRIND_WARMUP):
            await step()
    if chosen != "none":
        step = steps[chosen]
        for _ in range(count):
            await step()


def callgrind_all(redis: bool, count: int, only: list[str] | None) -> dict[str, Any]:
    script = [sys.executable, str(Path(__file__).resolve())]
    extra = ["--no-redis"] if not redis else []
    names = only or [
        "noop_await",
        "store_decide",
        "store_result",
        "build_keys",
        "decision_keys",
        "check_now",
        "decision",
        "check_with_info",
        *(["redis_bare", "redis_evalsha", "redis_check"] if redis else []),
    ]
    return instructions_per_call(
        [*script, *extra],
        names,
        count,
        lambda name, per_call: f"{name:16} {per_call:9.0f} instructions per call",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-redis", action="store_true", help="memory:// steps only")
    parser.add_argument("--count", type=int, default=100_000, help="calls per timed trial")
    parser.add_argument("--trials", type=int, default=7)
    add_callgrind_options(parser, default_count=5_000)
    parser.add_argument("--steps", help="comma-separated steps for --callgrind-all")
    parser.add_argument("--json", help="write the figures here")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as directory:
        server = None
        sock = None
        if not options.no_redis and not options.callgrind_all:
            server, sock = start_redis(directory)
        try:
            if options.callgrind:
                asyncio.run(one_step(sock, options.callgrind[0], int(options.callgrind[1])))
                return
            if options.callgrind_all:
                only = options.steps.split(",") if options.steps else None
                figures = callgrind_all(not options.no_redis, options.callgrind_count, only)
            else:
                figures = asyncio.run(timed(sock, options.count, options.trials))
        finally:
            if server is not None:
                server.terminate()
                server.wait()
    figures["python"] = sys.version.split()[0]
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
