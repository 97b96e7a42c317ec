"""The client's instructions per check in a loop turn of 100 checks (issue 30), counted
by callgrind: a real asyncio RateLimiter over one redis-server, each turn 100 tasks'
checks gathered at once, with the client's batching off (a call a check) and on (the
turn's checks joined into batched calls), over 1,000 identities or one hot identity.

The process under callgrind is the client alone (redis-server runs outside it). Each
row runs it twice, ``--turns`` and 3x that many turns after the same warm-up; the
instructions per check are the difference ÷ the checks between (so the start-up, the
imports and the warm-up cancel out).

    .venv/bin/python benchmarks/batch_client_instructions.py [--tree PATH] [--turns N]
        [--algorithms fixed_window sliding_window]

``--tree``: the source tree whose moderato is measured (default: this one), so one
script measures main and a branch. Writes
``benchmarks/results/batch-client-instructions-<UTC time>[-label].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TASKS = 100
IDENTITIES = 1000
RATE = "1000000000/hour"  # admits everything


async def child(tree: str, url: str, algorithm: str, batch: bool, hot: bool, turns: int) -> None:
    """The measured process: warm-up, then ``turns`` turns of TASKS checks."""
    sys.path.insert(0, tree)
    from moderato import RateLimiter

    limiter = RateLimiter(url, key_prefix="b" if batch else "a", command_timeout_s=10.0)
    limiter._backend.client.batch_decisions = batch  # type: ignore[attr-defined]
    names = ["hot"] * TASKS if hot else [f"id{i}" for i in range(IDENTITIES)]
    check = limiter.check_with_info

    async def turn(first: int) -> None:
        picked = [names[(first + i * 7) % len(names)] for i in range(TASKS)]
        await asyncio.gather(*(check(name, RATE, algorithm=algorithm) for name in picked))

    for index in range(30):
        await turn(index * TASKS)
    for index in range(turns):
        await turn(index * TASKS)
    await limiter.close()


def instructions(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        subprocess.run(command, check=True, capture_output=True)
        for line in Path(out).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise AssertionError("no totals in callgrind's output")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=str(ROOT))
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--algorithms", nargs="+", default=["fixed_window", "sliding_window"])
    parser.add_argument("--label", default="")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        tree, url, algorithm, batch, hot, turns = options.child
        asyncio.run(child(tree, url, algorithm, batch == "1", hot == "1", int(turns)))
        return

    sys.path.insert(0, str(ROOT / "tests"))
    from redis_servers import RedisServer

    server = RedisServer().start()
    rows: list[dict[str, Any]] = []
    try:
        for algorithm in options.algorithms:
            for hot in (False, True):
                row: dict[str, Any] = {
                    "algorithm": algorithm,
                    "identities": "one hot" if hot else f"{IDENTITIES:,}",
                }
                for batch in (False, True):
                    totals = []
                    for turns in (options.turns, 3 * options.turns):
                        argv = [
                            sys.executable,
                            __file__,
                            "--child",
                            options.tree,
                            server.url,
                            algorithm,
                            "1" if batch else "0",
                            "1" if hot else "0",
                            str(turns),
                        ]
                        totals.append(instructions(argv))
                    per_check = (totals[1] - totals[0]) / (2 * options.turns * TASKS)
                    row["on" if batch else "off"] = per_check
                    row[("on" if batch else "off") + "_totals"] = totals
                row["on_over_off"] = row["on"] / row["off"]
                rows.append(row)
                print(
                    f"{algorithm:<15} {row['identities']:>8}: instructions per check off "
                    f"{row['off']:,.0f}, on {row['on']:,.0f} ({row['on_over_off']:.2f}x)",
                    flush=True,
                )
    finally:
        server.stop()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    suffix = f"-{options.label}" if options.label else ""
    out = ROOT / "benchmarks" / "results" / f"batch-client-instructions-{stamp}{suffix}.json"
    out.write_text(
        json.dumps(
            {
                "tree": options.tree,
                "turns": options.turns,
                "tasks": TASKS,
                "python": sys.version,
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
