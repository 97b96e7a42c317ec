"""Redis instructions per decision of the decision scripts alone and batched, counted by
callgrind: a figure other processes cannot move (batch_scripts.py's CPU time can).

For each row a redis-server runs under ``valgrind --tool=callgrind
--toggle-collect=luaCallFunction`` (only the script calls are counted: the arguments put
into KEYS and ARGV, the script, its reply converted), is sent the row's calls (pipelined,
200 at a time) and shut down; a run with no calls is subtracted, and the rest divided by
the decisions. Rows as batch_scripts.py's: one key ("hot") or keys drawn from 1,000
identities, one check a call ("alone") or batches of 8 and 16, every check admitted.

With ``--full``, the hot rows only, on a key whose limit is the bottleneck: one request a
day (capacity 1000 scaled, a window of 86,400 s), the key filled by one admitted call
first, so every counted check is denied; the run subtracted is that fill alone.

    .venv/bin/python benchmarks/batch_instructions.py [--algorithms ...] [--decisions N] [--full]
        [--hot-only] [--sizes 1 8 16]

Run it in two trees (say main and a branch) to compare them. Writes
``benchmarks/results/batch-instructions-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_floor import write_results  # noqa: E402
from batch_scripts import fields  # noqa: E402
from redis_servers import free_port  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.redis.grouping import batch_layout  # noqa: E402
from moderato.scripts import batched_script, load_script  # noqa: E402

BATCH_SIZES = (1, 8, 16)
FULL_CAPACITY_SCALED, FULL_WINDOW_S = "1000", "86400"
"""--full: one request a day, so a key filled once denies every check after it."""


def counted(names: list[str], calls: list[list[Any]]) -> int:
    """The instructions of luaCallFunction over ``calls`` to a fresh redis-server."""
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "callgrind.out")
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--toggle-collect=luaCallFunction",
                f"--callgrind-out-file={out}",
                "redis-server",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        for _ in range(600):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        for name in names:
            client.script_load(load_script(name).source)
            client.script_load(batched_script(name).source)
        for at in range(0, len(calls), 200):
            pipe = client.pipeline(transaction=False)
            for argv in calls[at : at + 200]:
                pipe.execute_command(*argv)
            pipe.execute()
        with contextlib.suppress(redis.ConnectionError):
            client.shutdown(nosave=True)
        server.wait()
        text = Path(out).read_text()
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    assert match, "no totals in callgrind's output"
    return int(match.group(1))


def full_fields(algorithm: str) -> list[str]:
    """fields(algorithm) at --full's rate."""
    args = fields(algorithm)
    args[2:4] = [FULL_CAPACITY_SCALED, FULL_WINDOW_S]
    return args


def calls_for(
    algorithm: str, hot: bool, per_call: int, decisions: int, full: bool = False
) -> list[list[Any]]:
    rng = random.Random(1)
    args = full_fields(algorithm) if full else fields(algorithm)
    calls = []
    for _ in range(decisions // per_call):
        keys = ["hot" if hot else f"id:{rng.randrange(1000)}" for _ in range(per_call)]
        if per_call == 1:
            calls.append(["EVALSHA", load_script(algorithm).sha, "1", *keys, *args])
        else:
            # As the client sends it (grouping's encoder): a hot key's parts as markers.
            call_keys, call_args = batch_layout([([key], args) for key in keys])
            sha = batched_script(algorithm).sha
            calls.append(["EVALSHA", sha, len(call_keys), *call_keys, *call_args])
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=6400)
    parser.add_argument("--algorithms", nargs="*", default=list(ALGORITHMS))
    parser.add_argument(
        "--full", action="store_true", help="the hot key full: every counted check denied"
    )
    parser.add_argument("--hot-only", action="store_true", help="the hot rows alone")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=list(BATCH_SIZES), help="checks a call"
    )
    options = parser.parse_args()
    base = counted(options.algorithms, [])
    hot_only = options.full or options.hot_only
    places = (("hot", True),) if hot_only else (("hot", True), ("1,000 identities", False))
    rows: list[dict[str, Any]] = []
    for algorithm in options.algorithms:
        # --full: one admitted call fills the key first, and its own count is subtracted.
        fill = calls_for(algorithm, True, 1, 1, True) if options.full else []
        if options.full:
            base = counted([algorithm], fill)
        for where, hot in places:
            for per_call in options.sizes:
                calls = calls_for(algorithm, hot, per_call, options.decisions, options.full)
                total = counted([algorithm], fill + calls)
                per_decision = (total - base) / (len(calls) * per_call)
                label = f"{where}, " + ("alone" if per_call == 1 else f"batch of {per_call}")
                if options.full:
                    label += ", full"
                rows.append(
                    {
                        "algorithm": algorithm,
                        "row": label,
                        "decisions": len(calls) * per_call,
                        "instructions_per_decision": per_decision,
                    }
                )
                print(f"{algorithm:<15} {label:<28} {per_decision:>9,.0f} instructions", flush=True)
    path = write_results("batch_instructions", vars(options), rows)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
