"""Batched decisions on a cluster node, script level (issue 30, the cluster step): Redis
main-thread CPU per decision of the fixed-window script alone, of its batched form over
one slot, and of its cluster form over 8 slots of one node, with and without the form's
check of the other slots (one EXISTS per slot group: what that check costs).

One primary of a 3-primary cluster (no replicas); each shape sent ``--rounds`` times in
pipelines of 50 calls by redis-py, every check admitted; Redis's ``INFO cpu`` main-thread
time around it ÷ decisions; the median of ``--trials``.

    flock /tmp/bench.lock .venv/bin/python benchmarks/cluster_batch_scripts.py [--trials N]

Writes ``benchmarks/results/cluster-batch-scripts-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_floor import redis_cpu_s, write_results  # noqa: E402
from cluster import RedisCluster, slot_of  # noqa: E402

from moderato import _accel  # noqa: E402
from moderato.redis.grouping import (  # noqa: E402
    batch_layout,
    cluster_batch_layout,
    cluster_batched_script,
)
from moderato.scripts import batched_script, load_script  # noqa: E402

PARTS = 8
ARGV = ["1000", "1", "1000000000000", "86400"]  # admits everything
PROBE = b"local probe = redis.pcall('EXISTS', unpack(ARGV, at, last))"


def node_keys(cluster: RedisCluster, port: int) -> tuple[list[bytes], list[bytes]]:
    """PARTS base keys in PARTS slots of ``port``, and PARTS keys of one of its slots."""
    spread: list[bytes] = []
    index = 0
    while len(spread) < PARTS:
        key = _accel.build_keys("f", "fw", "", "global", f"u{index}", (60,))[0]
        index += 1
        slot = slot_of(key)
        if cluster.owner(slot) == port and all(slot_of(k) != slot for k in spread):
            spread.append(key)
    tag = spread[0][spread[0].index(b"{") : spread[0].index(b"}") + 1]
    one_slot = [b"f:fw:" + tag + b":" + str(part).encode() for part in range(PARTS)]
    return spread, one_slot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4000, help="calls of each shape a trial")
    options = parser.parse_args()
    cluster = RedisCluster(primaries=3, replicas=0).start()
    try:
        port = cluster.shards()[0].primary
        admin = redis.Redis(port=port)
        spread, one_slot = node_keys(cluster, port)
        alone = load_script("fixed_window")
        batched = batched_script("fixed_window")
        form = cluster_batched_script("fixed_window")
        unchecked = form.source.replace(PROBE, b"local probe = 0")
        assert unchecked != form.source
        unchecked_sha = hashlib.sha1(unchecked).hexdigest()
        for source in (alone.source, batched.source, form.source, unchecked):
            admin.script_load(source)
        # As a node's client sends them (grouping's encoders).
        one_slot_keys, one_slot_args = batch_layout([([key], ARGV) for key in one_slot])
        spread_keys, spread_args, _ = cluster_batch_layout(
            [([key], ARGV) for key in spread], [slot_of(key) for key in spread]
        )

        def alone_calls(keys: list[bytes]) -> Callable[[Any], None]:
            return lambda pipe: [pipe.evalsha(alone.sha, 1, key, *ARGV) for key in keys]

        shapes: dict[str, tuple[Callable[[Any], None], int]] = {
            f"alone, {PARTS} slots": (alone_calls(spread), PARTS),
            "alone, one slot": (alone_calls(one_slot), PARTS),
            f"batched form, {PARTS} checks in one slot": (
                lambda pipe: pipe.evalsha(
                    batched.sha, len(one_slot_keys), *one_slot_keys, *one_slot_args
                ),
                PARTS,
            ),
            f"cluster form, {PARTS} checks in {PARTS} slots": (
                lambda pipe: pipe.evalsha(form.sha, 1, *spread_keys, *spread_args),
                PARTS,
            ),
            f"cluster form without its check, {PARTS} slots": (
                lambda pipe: pipe.evalsha(unchecked_sha, 1, *spread_keys, *spread_args),
                PARTS,
            ),
        }
        samples: dict[str, list[float]] = {name: [] for name in shapes}
        for _ in range(options.trials):
            for name, (send, decisions) in shapes.items():
                pipe = admin.pipeline(transaction=False)
                before = redis_cpu_s(admin)
                for _ in range(options.rounds // 50):
                    for _ in range(50):
                        send(pipe)
                    replies = pipe.execute()
                after = redis_cpu_s(admin)
                assert all(not isinstance(reply, Exception) for reply in replies), replies[:2]
                calls = options.rounds // 50 * 50
                samples[name].append((after - before) / (calls * decisions) * 1e6)
        rows = []
        base = statistics.median(samples[f"alone, {PARTS} slots"])
        for name, values in samples.items():
            median = statistics.median(values)
            rows.append({"shape": name, "redis_us_per_decision": median, "samples": values})
            print(f"{name:<45} {median:5.2f} us/decision ({median / base:.2f}x alone)")
    finally:
        cluster.close()
    path = write_results("cluster_batch_scripts", vars(options), rows, parts=PARTS)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
