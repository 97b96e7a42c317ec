"""How close moderato's Redis client gets to Redis itself, on an EVALSHA of a small script.

Starts its own redis-server (via tests/redis_servers.py), then measures, on the
same server and the same script:

- ``redis-benchmark -c 1 -P 1`` and ``-c 50 -P 16`` (C, hiredis-free, the ceiling);
- moderato.redis.RedisClient.evalsha sequentially, then from 10, 100 and 1000
  concurrent tasks on one event loop (one auto-pipelined connection).

Prints checks/s (one check = one EVALSHA) and each client figure as a ratio of
the matching redis-benchmark figure: sequential against ``-c 1 -P 1``,
concurrent against ``-c 50 -P 16``, each against the redis-benchmark run made
just before it in the same round (the machine may be shared); the medians over
``--rounds`` rounds are reported, with the spread.

    .venv/bin/python benchmarks/client_bench.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hashlib
import importlib.util
import io
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moderato.redis import RedisClient  # noqa: E402

KEY_SPACE = 10_000


@dataclass(frozen=True)
class Script:
    sha: str
    source: bytes
    description: str
    args: tuple[str, ...]  # ARGV, the same for every call


def make_script(source: bytes, description: str, args: tuple[str, ...]) -> Script:
    return Script(hashlib.sha1(source).hexdigest(), source, description, args)


# A bare counter: Redis does as little as possible, so the client is most exposed.
COUNTER = make_script(
    b"""\
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
""",
    "a 106-byte counter script (INCR + PEXPIRE)",
    ("60000",),
)


from moderato.scripts import load_script  # noqa: E402


def limiter_script(name: str) -> Script:
    """One of moderato's decision scripts, one policy: cost 1, a huge capacity, 60 s."""
    source = load_script(name).source  # with the shared prelude spliced in
    args = ("1000", "1", str(10**12), "60") + (("",) if name == "token_bucket" else ())
    return make_script(source, f"lua/{name}.lua, one policy", args)


def load_redis_servers() -> ModuleType:
    path = ROOT / "tests" / "redis_servers.py"
    spec = importlib.util.spec_from_file_location("moderato_bench_redis_servers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Measurement:
    checks_per_s: float
    redis_cpu_us: float  # redis-server CPU time per check
    client_cpu_us: float | None = None  # this process's CPU time per check (client runs)


def redis_cpu_s(server: Any) -> float:
    """redis-server's CPU time so far (user + system), from INFO CPU."""
    info = server.command("INFO", "cpu").decode()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


def redis_benchmark(
    server: Any, script: Script, clients: int, pipeline: int, requests: int
) -> Measurement:
    """What redis-benchmark reports for the EVALSHA, and what it cost Redis."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise SystemExit("redis-benchmark not found on PATH (it ships with redis-server)")
    command = [
        binary, "-h", "127.0.0.1", "-p", str(server.port),
        "-c", str(clients), "-P", str(pipeline), "-n", str(requests),
        "-r", str(KEY_SPACE), "--csv",
        "EVALSHA", script.sha, "1", "bench:key:__rand_int__", *script.args,
    ]  # fmt: skip
    cpu_before_s = redis_cpu_s(server)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    redis_cpu_us = (redis_cpu_s(server) - cpu_before_s) / requests * 1e6
    for row in csv.reader(io.StringIO(output)):
        if len(row) >= 2:
            try:
                return Measurement(float(row[1]), redis_cpu_us)
            except ValueError:
                continue  # the header row
    raise RuntimeError(f"could not read redis-benchmark's output:\n{output}")


async def client_run(
    server: Any, script: Script, tasks: int, checks: int, connections_per_loop: int
) -> Measurement:
    """Checks per second with ``tasks`` concurrent tasks sharing ``checks`` EVALSHAs."""
    client = RedisClient.from_url(server.url, connections_per_loop=connections_per_loop)
    await client.connect()
    keys = [(b"bench:key:%012d" % i,) for i in range(KEY_SPACE)]
    args = script.args
    per_task = checks // tasks

    async def worker(offset: int) -> None:
        evalsha = client.evalsha
        for i in range(offset, offset + per_task):
            await evalsha(script, keys[i % KEY_SPACE], args)

    await client.evalsha(script, keys[0], args)  # warm: script cached, connection open
    redis_before_s = redis_cpu_s(server)
    cpu_started_s = time.process_time()
    started_s = time.perf_counter()
    if tasks == 1:
        await worker(0)
    else:
        await asyncio.gather(*(worker(n * per_task) for n in range(tasks)))
    elapsed_s = time.perf_counter() - started_s
    client_cpu_s = time.process_time() - cpu_started_s
    done = per_task * tasks
    redis_cpu_us = (redis_cpu_s(server) - redis_before_s) / done * 1e6
    await client.close()
    return Measurement(done / elapsed_s, redis_cpu_us, client_cpu_s / done * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are reported")
    parser.add_argument(
        "--script",
        choices=("counter", "fixed_window", "sliding_window", "token_bucket"),
        default="counter",
        help="the script: a bare counter (default) or one of the lua/ scripts",
    )
    parser.add_argument("--connections-per-loop", type=int, default=1, metavar="N")
    options = parser.parse_args()
    scale = 0.25 if options.quick else 1.0
    sequential_n = int(20_000 * scale)
    concurrent_n = int(300_000 * scale)
    rounds = max(1, options.rounds)
    script = COUNTER if options.script == "counter" else limiter_script(options.script)

    servers = load_redis_servers()
    server = servers.RedisServer().start()
    rows: dict[str, list[Measurement]] = {}
    ratios: dict[str, list[float]] = {}
    try:
        loaded = server.command("SCRIPT", "LOAD", script.source.decode())
        assert script.sha.encode() in loaded, loaded

        for _ in range(rounds):
            # Each client figure is compared with the redis-benchmark figure taken
            # right before it: on a shared machine the ceiling itself moves.
            reference = redis_benchmark(server, script, 1, 1, sequential_n)
            rows.setdefault("redis-benchmark -c 1 -P 1", []).append(reference)
            result = asyncio.run(
                client_run(server, script, 1, sequential_n, options.connections_per_loop)
            )
            rows.setdefault("client, sequential", []).append(result)
            ratios.setdefault("client, sequential", []).append(
                result.checks_per_s / reference.checks_per_s
            )
            reference = redis_benchmark(server, script, 50, 16, concurrent_n * 2)
            rows.setdefault("redis-benchmark -c 50 -P 16", []).append(reference)
            for tasks in (10, 100, 1000):
                name = f"client, {tasks} tasks"
                result = asyncio.run(
                    client_run(server, script, tasks, concurrent_n, options.connections_per_loop)
                )
                rows.setdefault(name, []).append(result)
                ratios.setdefault(name, []).append(result.checks_per_s / reference.checks_per_s)
    finally:
        server.close()

    print(
        f"EVALSHA of {script.description}, {rounds} round(s), "
        f"Python {sys.version.split()[0]}; medians, [min..max] across rounds"
    )
    print(
        f"{'run':28} {'checks/s':>9} {'[min..max]':>19}  {'ratio [min..max]':<31}"
        f"{'client CPU':>11} {'Redis CPU':>10}"
    )
    for name, measurements in rows.items():
        rates = [m.checks_per_s for m in measurements]
        spread = f"[{min(rates):,.0f}..{max(rates):,.0f}]"
        line = f"{name:28} {statistics.median(rates):9,.0f} {spread:>19}  "
        if name in ratios:
            reference_name = "-c 1 -P 1" if name == "client, sequential" else "-c 50 -P 16"
            values = ratios[name]
            ratio = (
                f"{statistics.median(values):6.1%} of {reference_name} "
                f"[{min(values):.0%}..{max(values):.0%}]"
            )
        else:
            ratio = ""
        line += f"{ratio:<31}"
        client_cpu = [m.client_cpu_us for m in measurements if m.client_cpu_us is not None]
        line += f"{statistics.median(client_cpu):8.2f} us" if client_cpu else f"{'':11}"
        line += f"{statistics.median(m.redis_cpu_us for m in measurements):7.2f} us"
        print(line)
    print(
        "client CPU: this process's CPU time per check; Redis CPU: redis-server's CPU time "
        "per check (INFO cpu). The client keeps up with Redis where its CPU per check is "
        "below Redis's."
    )


if __name__ == "__main__":
    main()
