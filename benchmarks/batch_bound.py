"""How long one batched call holds Redis (issue 30's bound): for each algorithm, a call of
its ``batch_parts`` one-policy checks on one key, and one check of 16 policies alone (its
batched form, one part), on a redis-server of the benchmark's own; Redis's own time per
call from ``INFO commandstats`` (usec_per_call) over 300 and 100 calls.

    .venv/bin/python benchmarks/batch_bound.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.redis.grouping import batch_layout  # noqa: E402
from moderato.scripts import MAX_BATCH_POLICIES, batched_script  # noqa: E402


def run(name: str, policies: int, parts: int, calls: int = 300, limit: int = 100_000) -> float:
    """Redis µs per call of ``parts`` checks of ``policies`` policies (every one admitted)."""
    server = RedisServer().start()
    try:
        r = redis.Redis(port=server.port)
        sha = r.script_load(batched_script(name).source)
        keys = [f"{{k}}:p{i}" for i in range(policies)]
        args: list[object] = [1000, 1]
        for i in range(policies):
            args += [limit * 1000, 60 * (i + 1)]
        # As the client sends it (grouping's encoder): the checks after the first as markers.
        batch_keys, batch_argv = batch_layout([(keys, args)] * parts)
        r.config_resetstat()
        for _ in range(calls):
            r.evalsha(sha, len(batch_keys), *batch_keys, *batch_argv)
        return float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    finally:
        server.close()


def main() -> None:
    for name, entry in ALGORITHMS.items():
        one = run(name, 1, entry.batch_parts)
        many = run(name, MAX_BATCH_POLICIES, 1, calls=100)
        print(
            f"{name:<15} {entry.batch_parts:>2} one-policy checks a call: {one:6.1f} us; "
            f"one check of {MAX_BATCH_POLICIES} policies alone: {many:6.1f} us"
        )


if __name__ == "__main__":
    main()
