"""Batched decisions in situ: Redis CPU per decision and checks/s, before and after, with peers.

One fresh redis-server (a free loopback port, nothing else on it). Each
subject runs in a child process of its own: 100 asyncio tasks on one event
loop check as fast as they can for ``--seconds``, over 1,000 identities or one
hot identity, at a rate that admits everything (each check is its library's
full allowed path). The child reads Redis's CPU time (``INFO cpu``: user +
system) just before and after its timed window; Redis CPU per decision is that
difference over the checks decided in the window, and one Redis core's
capacity is its inverse. Checks/s is the client's own rate.

Subjects, per algorithm: moderato as it is here with
``RedisBackend.batch_checks`` on ("after": the checks of one loop turn go to
Redis as one batch script call) and moderato from another checkout
(``--before DIR``: a tree with moderato built in it, or at least its
``_accel`` extension copied in), and the peers of the same family with
asyncio Redis clients: limits (``limits.aio``, redis-py) and throttled-py
(``throttled.asyncio``). Trials interleave every subject, so drift on a shared
machine spreads over all of them; medians (and the min..max spread) are
reported, and the ratios the targets are stated in are computed per trial.

    python benchmarks/batch_bench.py --before /tmp/before [--seconds 3] [--trials 3]
        [--only WORD,...] [--output results/batch-....json]

``--floors`` measures instead, on a fresh server, the Redis CPU per decision of
calls sent through moderato's client with no limiter: an empty script, each
decision script called once per decision, and batch calls of 32 decisions,
over 1,000 identities and one hot identity (what the in-situ figures cannot
go below).
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
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
TASKS = 100
IDENTITIES = 1000
RATE_LIMIT = 1_000_000
RATE = f"{RATE_LIMIT}/minute"
ALGORITHMS = (
    "fixed_window",
    "sliding_window",
    "token_bucket",
    "gcra",
    "sliding_log",
    "leaky_bucket",
)
# Each algorithm's peers of the same family: (library, the library's own name for it).
PEERS = {
    "fixed_window": [("limits", "FixedWindowRateLimiter"), ("throttled-py", "fixed_window")],
    "sliding_window": [
        ("limits", "SlidingWindowCounterRateLimiter"),
        ("throttled-py", "sliding_window"),
    ],
    "token_bucket": [("throttled-py", "token_bucket")],
    "gcra": [("throttled-py", "gcra")],
    "sliding_log": [("limits", "MovingWindowRateLimiter")],
    "leaky_bucket": [("throttled-py", "leaking_bucket")],
}
SCENARIOS = {"1000 identities": IDENTITIES, "one hot identity": 1}


@dataclass(frozen=True)
class Subject:
    name: str
    library: str  # "moderato after" | "moderato before" | "limits" | "throttled-py"
    algorithm: str  # moderato's algorithm this subject is measured for
    peer_kind: str = ""  # the peer's own name for its algorithm


def subjects(only: Optional[list[str]], with_before: bool) -> list[Subject]:
    found = []
    for algorithm in ALGORITHMS:
        found.append(Subject(f"moderato {algorithm}", "moderato after", algorithm))
        if with_before:
            found.append(Subject(f"moderato@before {algorithm}", "moderato before", algorithm))
        for library, kind in PEERS[algorithm]:
            found.append(Subject(f"{library} {kind}", library, algorithm, kind))
    if only:
        found = [s for s in found if any(word in s.name for word in only)]
    return found


# -- the child: one subject, one scenario ---------------------------------------------------


def _redis_cpu_s(port: int) -> float:
    """redis-server's CPU time so far (user + system, INFO cpu), over a socket of its own."""
    import hiredis

    reader = hiredis.Reader()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"*2\r\n$4\r\nINFO\r\n$3\r\ncpu\r\n")
        reply: Any = False
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
    fields = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


_loaded_from: list[str] = []


async def _open(subject: Subject, port: int) -> tuple[Callable[[str], Awaitable[Any]], Any]:
    url = f"redis://127.0.0.1:{port}"
    if subject.library.startswith("moderato"):
        from moderato import RateLimiter

        if subject.library == "moderato after":
            from moderato.backends.redis import RedisBackend

            RedisBackend.batch_checks = True  # experimental, off by default

        limiter = RateLimiter(url, key_prefix=subject.library.replace(" ", "-"))
        await limiter.connect()
        check_with_info = limiter.check_with_info
        algorithm = subject.algorithm

        def moderato_check(key: str) -> Awaitable[Any]:
            return check_with_info(key, RATE, algorithm=algorithm)

        import moderato

        _loaded_from.append(str(Path(moderato.__file__).parent))
        return moderato_check, limiter.close
    if subject.library == "limits":
        from limits import RateLimitItemPerMinute
        from limits.aio import strategies
        from limits.aio.storage import RedisStorage

        storage = RedisStorage(f"async+redis://127.0.0.1:{port}", implementation="redispy")
        strategy = getattr(strategies, subject.peer_kind)(storage)
        item = RateLimitItemPerMinute(RATE_LIMIT)

        prefix = f"limits-{subject.peer_kind}:"  # no two subjects share a key

        def limits_check(key: str) -> Awaitable[Any]:
            return strategy.hit(item, prefix + key)

        return limits_check, None
    from throttled.asyncio import RedisStore, Throttled, per_min

    throttle = Throttled(
        using=subject.peer_kind, quota=per_min(RATE_LIMIT), store=RedisStore(server=url)
    )

    prefix = f"throttled-{subject.peer_kind}:"

    def throttled_check(key: str) -> Awaitable[Any]:
        return throttle.limit(prefix + key)

    return throttled_check, None


async def _run_child(
    subject: Subject, port: int, identities: int, seconds: float
) -> dict[str, Any]:
    check, close = await _open(subject, port)
    names = [f"user:{n}" for n in range(identities)]
    # Warm-up: connections open, scripts loaded, every key written once.
    for start in range(0, max(identities, TASKS), TASKS):
        await asyncio.gather(*(check(names[(start + i) % identities]) for i in range(TASKS)))
    stop = False
    counts = [0] * TASKS

    async def task(number: int) -> None:
        at = number
        done = 0
        while not stop:
            await check(names[at % identities])
            at += TASKS
            done += 1
        counts[number] = done

    cpu_before = _redis_cpu_s(port)
    started = time.perf_counter()
    tasks = [asyncio.ensure_future(task(n)) for n in range(TASKS)]
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*tasks)
    elapsed_s = time.perf_counter() - started
    cpu_after = _redis_cpu_s(port)
    if close is not None:
        await close()
    checks = sum(counts)
    redis_cpu_s = cpu_after - cpu_before
    return {
        "checks": checks,
        "elapsed_s": elapsed_s,
        "checks_per_s": checks / elapsed_s,
        "redis_cpu_s": redis_cpu_s,
        "redis_us_per_decision": redis_cpu_s / checks * 1e6,
        "redis_core_decisions_per_s": checks / redis_cpu_s if redis_cpu_s > 0 else None,
        "moderato_from": _loaded_from[0] if _loaded_from else None,
    }


# -- floors: the same calls without a client in the way -----------------------------------------

FLOOR_CALLS = 16_000
EMPTY_SCRIPT = b"return 1"


async def _floors(port: int) -> dict[str, dict[str, float]]:
    """Redis CPU per decision of pipelined calls sent straight through moderato's client
    (no limiter): an empty script, one script call per decision, and batch calls of
    BATCH_MAX_PARTS decisions, over 1,000 identities and one hot identity."""
    import hashlib

    from moderato import RateLimiter
    from moderato.redis import RedisClient
    from moderato.redis.connection import BATCH_MAX_PARTS
    from moderato.scripts import BATCH_INDEX, Script, batch_script, load_script

    client = RedisClient(f"redis://127.0.0.1:{port}", command_timeout_s=60.0)
    limiter = RateLimiter(f"redis://127.0.0.1:{port}", key_prefix="floor")
    empty = Script("empty", EMPTY_SCRIPT, hashlib.sha1(EMPTY_SCRIPT).hexdigest())
    batch = batch_script()
    found: dict[str, dict[str, float]] = {}
    for script in (empty, batch, *(load_script(name) for name in ALGORITHMS)):
        await client.execute("SCRIPT", "LOAD", script.source)
    for algorithm in ALGORITHMS:
        plan = limiter.plan_for(RATE, algorithm)
        keys = [
            limiter.backend.decision_keys(plan, f"user:{n}", None, "global")
            for n in range(IDENTITIES)
        ]
        args = plan.unit_args
        script = load_script(algorithm)
        rows: dict[str, float] = {}
        for label in ("empty script", "one call each", "one call each, hot", "batch", "batch, hot"):
            hot = label.endswith("hot")

            def keys_of(n: int, hot: bool = hot, keys: list[list[bytes]] = keys) -> list[bytes]:
                return keys[0 if hot else n % IDENTITIES]

            before = _redis_cpu_s(port)
            if label == "empty script":
                calls = [client.evalsha(empty, keys_of(n), ()) for n in range(FLOOR_CALLS)]
            elif label.startswith("one call"):
                calls = [client.evalsha(script, keys_of(n), args) for n in range(FLOOR_CALLS)]
            else:
                calls = []
                for first in range(0, FLOOR_CALLS, BATCH_MAX_PARTS):
                    batch_keys: list[bytes] = []
                    batch_args: list[Any] = []
                    for n in range(first, first + BATCH_MAX_PARTS):
                        part_keys = keys_of(n)
                        batch_keys.extend(part_keys)
                        batch_args.extend((BATCH_INDEX[algorithm], len(part_keys), len(args)))
                        batch_args.extend(args)
                    calls.append(client.evalsha(batch, batch_keys, batch_args))
            await asyncio.gather(*calls)
            rows[label] = (_redis_cpu_s(port) - before) / FLOOR_CALLS * 1e6
        found[algorithm] = rows
    await limiter.close()
    await client.close()
    return found


# -- the parent --------------------------------------------------------------------------------


def measure(
    subject: Subject, port: int, identities: int, seconds: float, before: Optional[Path]
) -> dict[str, Any]:
    environment = dict(os.environ)
    # The child imports moderato from the tree being measured, and nothing from the other.
    tree = before if subject.library == "moderato before" else ROOT
    assert tree is not None
    environment["PYTHONPATH"] = str(tree)
    command = [
        sys.executable,
        __file__,
        "--child",
        json.dumps([subject.name, subject.library, subject.algorithm, subject.peer_kind]),
        "--port",
        str(port),
        "--identities",
        str(identities),
        "--seconds",
        str(seconds),
    ]
    done = subprocess.run(
        command, check=True, capture_output=True, text=True, env=environment, cwd="/"
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def _median(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of moderato to compare with")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed window per run")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", help="comma-separated words: only subjects naming one")
    parser.add_argument("--output", type=Path, help="write the result as JSON here")
    parser.add_argument(
        "--floors",
        action="store_true",
        help="only the script floors: Redis CPU per decision of calls sent without a limiter",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--identities", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.child:
        name, library, algorithm, peer_kind = json.loads(options.child)
        result = asyncio.run(
            _run_child(
                Subject(name, library, algorithm, peer_kind),
                options.port,
                options.identities,
                options.seconds,
            )
        )
        print(json.dumps(result))
        return

    sys.path.insert(0, str(ROOT / "tests"))
    from redis_servers import RedisServer

    if options.floors:
        server = RedisServer().start()
        try:
            floors = {
                f"trial {trial + 1}": asyncio.run(_floors(server.port))
                for trial in range(options.trials)
            }
        finally:
            server.close()
        for trial, by_algorithm in floors.items():
            for algorithm, rows in by_algorithm.items():
                cells = "  ".join(f"{label} {us:6.2f}" for label, us in rows.items())
                print(f"{trial} {algorithm:15} us Redis CPU per decision: {cells}")
        if options.output:
            options.output.write_text(
                json.dumps({"benchmark": "batch_bench --floors", "floors": floors}, indent=1)
            )
        return

    chosen = subjects(options.only.split(",") if options.only else None, options.before is not None)
    server = RedisServer().start()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for trial in range(options.trials):
            for scenario, identities in SCENARIOS.items():
                for subject in chosen:
                    result = measure(
                        subject, server.port, identities, options.seconds, options.before
                    )
                    runs.setdefault(scenario, {}).setdefault(subject.name, []).append(result)
                    print(
                        f"trial {trial + 1} {scenario:17} {subject.name:42} "
                        f"{result['checks_per_s']:9.0f} checks/s  "
                        f"{result['redis_us_per_decision']:6.2f} us Redis CPU per decision",
                        flush=True,
                    )
    finally:
        server.close()

    summary = summarise(runs, chosen)
    print_summary(summary)
    if options.output:
        options.output.write_text(
            json.dumps(
                {
                    "benchmark": "batch_bench",
                    "argv": sys.argv[1:],
                    "tasks": TASKS,
                    "rate": RATE,
                    "seconds": options.seconds,
                    "trials": options.trials,
                    "environment": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "load_average": os.getloadavg(),
                    },
                    "runs": runs,
                    "summary": summary,
                },
                indent=1,
            )
        )


def summarise(
    runs: dict[str, dict[str, list[dict[str, Any]]]], chosen: list[Subject]
) -> dict[str, Any]:
    """Medians per subject, and per algorithm the ratios the targets are stated in."""
    summary: dict[str, Any] = {}
    for scenario, by_subject in runs.items():
        rows: dict[str, Any] = {}
        for subject in chosen:
            trials = by_subject.get(subject.name, [])
            if not trials:
                continue
            rows[subject.name] = {
                "library": subject.library,
                "algorithm": subject.algorithm,
                "checks_per_s": _median([t["checks_per_s"] for t in trials]),
                "redis_us_per_decision": _median([t["redis_us_per_decision"] for t in trials]),
            }
        ratios: dict[str, Any] = {}
        for algorithm in ALGORITHMS:
            after = by_subject.get(f"moderato {algorithm}")
            if not after:
                continue
            entry: dict[str, Any] = {}
            before = by_subject.get(f"moderato@before {algorithm}")
            if before:
                entry["checks_per_s_after_over_before"] = _median(
                    [a["checks_per_s"] / b["checks_per_s"] for a, b in zip(after, before)]
                )
                entry["redis_cpu_after_over_before"] = _median(
                    [
                        a["redis_us_per_decision"] / b["redis_us_per_decision"]
                        for a, b in zip(after, before)
                    ]
                )
            peers = [s.name for s in chosen if s.algorithm == algorithm and s.peer_kind]
            if peers:
                # The best peer of each trial: the least Redis CPU per decision.
                per_trial = []
                for number, run in enumerate(after):
                    best = min(by_subject[p][number]["redis_us_per_decision"] for p in peers)
                    per_trial.append(run["redis_us_per_decision"] / best)
                entry["redis_cpu_over_best_peer"] = _median(per_trial)
            entry["redis_core_decisions_per_s"] = _median(
                [t["redis_core_decisions_per_s"] for t in after]
            )
            ratios[algorithm] = entry
        summary[scenario] = {"subjects": rows, "ratios": ratios}
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    for scenario, part in summary.items():
        print(f"\n== {scenario}: medians (min..max) ==")
        for name, row in part["subjects"].items():
            rate, cpu = row["checks_per_s"], row["redis_us_per_decision"]
            print(
                f"{name:42} {rate['median']:9.0f} checks/s ({rate['min']:.0f}..{rate['max']:.0f})"
                f"  {cpu['median']:6.2f} us/decision ({cpu['min']:.2f}..{cpu['max']:.2f})"
            )
        for algorithm, entry in part["ratios"].items():
            words = [algorithm + ":"]
            for key, words_for in (
                ("checks_per_s_after_over_before", "checks/s after/before"),
                ("redis_cpu_after_over_before", "Redis CPU after/before"),
                ("redis_cpu_over_best_peer", "Redis CPU / best peer"),
            ):
                if key in entry:
                    words.append(f"{words_for} {entry[key]['median']:.2f}x")
            words.append(
                f"one Redis core {entry['redis_core_decisions_per_s']['median']:,.0f} decisions/s"
            )
            print("  " + "  ".join(words))


if __name__ == "__main__":
    main()
