"""How long one batched call holds Redis (issue 30's bound), admitted and denied: for each
algorithm, a call of its ``batch_parts`` one-policy checks on one key and on as many keys,
a call of one check and as many repeats of it as a call takes (one hot identity's),
and one check of 16 policies alone (its batched form, one part), every check admitted;
then calls of its ``batch_parts`` and of ``MAX_BATCH_PARTS`` checks, every check denied,
on one full key and on as many full keys as checks (each its own identity: no check's
work is shared).
A key is full when the batch, sent again and again, admits none of its checks; the denial
rows' limit is 1,000 (the sliding log also 100,000: its denial searches the log) a day (so
a full bucket refills a check in 86 s or more: the measured calls are denials). Redis's
own time per call is ``INFO commandstats``' usec_per_call, on a redis-server of the
benchmark's own, over ``calls`` calls.

    .venv/bin/python benchmarks/batch_bound.py [--algorithms ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.policy import Rate  # noqa: E402
from moderato.redis.grouping import batch_layout, split_reply  # noqa: E402
from moderato.scripts import (  # noqa: E402
    BATCH_PART_UNITS,
    MAX_BATCH_PARTS,
    MAX_BATCH_POLICIES,
    batched_script,
)

DENIED_LIMITS = {"sliding_log": (1000, 100_000)}
"""The limits of the denial rows (a full key holds that many admissions): 1,000 unless named."""


def run(
    name: str,
    policies: int,
    parts: int,
    calls: int = 300,
    limit: int = 100_000,
    window_s: int = 60,
    *,
    keys_per_part: bool = False,
    fill: bool = False,
) -> float:
    """Redis µs per call of ``parts`` checks of ``policies`` policies: on one key (set of
    keys), or ``keys_per_part``: each part its own. ``fill``: the keys first filled (the
    batch sent until it admits no check), and every measured check must be denied."""
    server = RedisServer().start()
    try:
        r = redis.Redis(port=server.port)
        sha = r.script_load(batched_script(name).source)
        entry = ALGORITHMS[name]
        args: list[object] = [1000, 1]
        for i in range(policies):
            args += entry.policy_args(Rate(limit, window_s * (i + 1)))
        checks = [
            ([f"{{k{part if keys_per_part else 0}}}:p{i}" for i in range(policies)], args)
            for part in range(parts)
        ]
        # As the client sends it (grouping's encoder): the checks after the first as markers.
        batch_keys, batch_argv = batch_layout(checks)

        def call() -> list[Any]:
            """Each check's reply (a refusal, or a reply that does not add up, fails)."""
            reply = r.evalsha(sha, len(batch_keys), *batch_keys, *batch_argv)
            decisions = split_reply(reply, parts)
            assert decisions is not None, reply
            return decisions

        if fill:  # 100 calls pipelined at a time until the last admits none (a check a call)
            for _ in range(limit // 100 + 2):
                pipe = r.pipeline(transaction=False)
                for _ in range(100):
                    pipe.evalsha(sha, len(batch_keys), *batch_keys, *batch_argv)
                last = split_reply(pipe.execute()[-1], parts)
                assert last is not None
                if not any(decided[0] for decided in last):
                    break
            else:
                raise AssertionError(f"{name}: the keys never filled")
        r.config_resetstat()
        for _ in range(calls):
            reply = call()
            assert not fill or not any(decided[0] for decided in reply), reply
        assert reply[0][0] == (0 if fill else 1), reply
        return float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    finally:
        server.close()


def measure(name: str) -> dict[str, float]:
    """One algorithm's rows (Redis µs per call), each printed as it is known."""
    parts = ALGORITHMS[name].batch_parts
    rows: dict[str, float] = {}

    def row(label: str, us: float) -> None:
        rows[label] = us
        print(f"{name:<15} {label:<58} {us:7.1f} us", flush=True)

    row(f"admitted, {parts} checks on one key", run(name, 1, parts))
    # One hot identity's checks as the client sends them: one, then repeats of it ("="),
    # as many as MAX_BATCH_UNITS takes at the algorithm's batch_repeat_units.
    repeats = (parts * BATCH_PART_UNITS - BATCH_PART_UNITS) // ALGORITHMS[name].batch_repeat_units
    if repeats + 1 > parts:
        row(f"admitted, one check and {repeats} repeats on one key", run(name, 1, 1 + repeats))
    row(f"admitted, {parts} checks on {parts} keys", run(name, 1, parts, keys_per_part=True))
    row(
        f"admitted, one check of {MAX_BATCH_POLICIES} policies",
        run(name, MAX_BATCH_POLICIES, 1, 100),
    )
    for limit in DENIED_LIMITS.get(name, (1000,)):
        for count in sorted({parts, MAX_BATCH_PARTS}):
            for each in (False, True):
                where = f"{count} full keys" if each else "one full key"
                us = run(name, 1, count, 100, limit, 86400, keys_per_part=each, fill=True)
                row(f"denied, {count} checks, {where} of limit {limit:,}", us)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--json", type=Path, help="write the figures there too")
    options = parser.parse_args()
    figures = {name: measure(name) for name in options.algorithms}
    if options.json:
        options.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
