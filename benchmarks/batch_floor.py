"""What deciding several checks in one script call could save Redis: the floor under
batched decisions (issue 30), measured on the fixed window.

The earlier batching (``856863b``, removed) wrapped each shipped script in a
generic per-part loop (a ``pcall``, a table of keys and arguments per part, a
wrapper around every ``redis`` call) and saved nothing. This measures the other
shape: the fixed window's straight-line admitted path written as one loop in one
script, with nothing per part but the math and the state commands:

- **shipped, one a call**: ``lua/fixed_window.lua`` as moderato sends it today;
- **one key, N decisions**: N checks on one hot identity decided in one
  evaluation: the counter read once, the N decisions taken in order on a Lua
  local, the counter written once (one ``INCRBY`` of what was admitted);
- **N keys, one decision each**: N identities in one call, each with its own
  ``INCRBY`` (the steady state of many identities: their counters exist);
- **empty script**: the price of a call itself (``return 1``).

The two loops are sketches of the batched path for this benchmark, not the
product's scripts: they take no policy list, check no argument ranges and take
no refusal path (the shipped script does all three). They do decide exactly:
the hot key's counter is compared with the count of decisions sent.

Each row is ``redis-benchmark -c 8 -P 16`` sending one fixed ``EVALSHA`` (a
count of calls that is a multiple of 128, so that the pipelines send exactly
that many), against a redis-server this script starts; Redis's CPU is read from
``INFO cpu`` (the main thread's user + system time) around each trial, and
divided by the decisions the trial made. Three trials, the median.

    .venv/bin/python benchmarks/batch_floor.py [--trials N]

Writes ``benchmarks/results/batch-floor-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato.scripts import load_script  # noqa: E402

# The admitted and denied replies are the shipped script's layout: allowed, deciding
# policy, remaining_scaled, retry_ms, reset_ms.
ONE_KEY_N_DECISIONS = """
local n, cost_scaled, capacity_scaled = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window_ms = tonumber(ARGV[4]) * 1000
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local window_end_ms = now_ms - math.fmod(now_ms, window_ms) + window_ms
local key = KEYS[1] .. string.format(':%d', window_end_ms / window_ms - 1)
local used_scaled = tonumber(redis.call('GET', key) or '0')
local found_scaled = used_scaled
local reply, at = {}, 0
for _ = 1, n do
  if used_scaled + cost_scaled <= capacity_scaled then
    used_scaled = used_scaled + cost_scaled
    reply[at + 1], reply[at + 2], reply[at + 3] = 1, 0, capacity_scaled - used_scaled
    reply[at + 4], reply[at + 5] = 0, window_end_ms
  else
    reply[at + 1], reply[at + 2], reply[at + 3] = 0, 0, capacity_scaled - used_scaled
    reply[at + 4], reply[at + 5] = window_end_ms - now_ms, window_end_ms
  end
  at = at + 5
end
if used_scaled ~= found_scaled then
  redis.call('INCRBY', key, used_scaled - found_scaled)
  if found_scaled == 0 then
    redis.call('PEXPIREAT', key, string.format('%d', window_end_ms))
  end
end
return reply
"""

N_KEYS_ONE_DECISION_EACH = """
local cost_scaled, capacity_scaled = tonumber(ARGV[1]), tonumber(ARGV[2])
local window_ms = tonumber(ARGV[3]) * 1000
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local window_end_ms = now_ms - math.fmod(now_ms, window_ms) + window_ms
local suffix = string.format(':%d', window_end_ms / window_ms - 1)
local reply, at = {}, 0
for i = 1, #KEYS do
  local key = KEYS[i] .. suffix
  local used_scaled = redis.call('INCRBY', key, ARGV[1])
  if used_scaled <= capacity_scaled then
    if used_scaled == cost_scaled then
      redis.call('PEXPIREAT', key, string.format('%d', window_end_ms))
    end
    reply[at + 1], reply[at + 2], reply[at + 3] = 1, 0, capacity_scaled - used_scaled
    reply[at + 4], reply[at + 5] = 0, window_end_ms
  else
    redis.call('DECRBY', key, ARGV[1])
    reply[at + 1], reply[at + 2], reply[at + 3] = 0, 0, 0
    reply[at + 4], reply[at + 5] = window_end_ms - now_ms, window_end_ms
  end
  at = at + 5
end
return reply
"""

COST_SCALED = "1000"
# The largest capacity the shipped script takes: every decision here is admitted.
CAPACITY_SCALED = "9000000000000"
WINDOW_S = "3600"
SIZES = (1, 8, 32, 100)
HOT_SIZES = (1, 8, 32, 100, 400)


def calls_for(decisions_per_call: int, decisions: int) -> int:
    """About ``decisions`` decisions' worth of calls, a multiple of 128: with ``-P 16 -c
    8`` redis-benchmark sends whole pipelines, so another count overshoots by up to 15."""
    return max(2048, decisions // decisions_per_call // 128 * 128)


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def trial(client: redis.Redis, port: int, argv: list[str], calls: int) -> float:
    """Redis CPU seconds for ``calls`` pipelined calls of ``argv``."""
    before = redis_cpu_s(client)
    done = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-n", str(calls), "-c", "8", "-P", "16", "-q", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or "ERR" in done.stdout:
        raise RuntimeError(f"redis-benchmark failed: {done.stdout}{done.stderr}")
    return redis_cpu_s(client) - before


def write_results(
    benchmark: str, options: dict[str, Any], rows: list[dict[str, Any]], **more: Any
) -> Path:
    """benchmarks/results/<benchmark, dashed>-<UTC time>.json: the rows and how they were run."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = ROOT / "benchmarks" / "results" / f"{benchmark.replace('_', '-')}-{stamp}.json"
    record = {"benchmark": benchmark, "when": stamp, "options": options}
    record.update(load_average=list(os.getloadavg()), **more, rows=rows)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=400_000, help="per trial, about")
    options = parser.parse_args()
    if shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-benchmark was not found: it comes with redis-server")

    server = RedisServer().start()
    try:
        client = redis.Redis(port=server.port)
        shipped = load_script("fixed_window")
        client.script_load(shipped.source)
        hot_sha = client.script_load(ONE_KEY_N_DECISIONS)
        spread_sha = client.script_load(N_KEYS_ONE_DECISION_EACH)
        empty_sha = client.script_load("return 1")
        rows: list[tuple[str, int, list[str]]] = [
            ("empty script", 1, ["EVALSHA", empty_sha, "0"]),
            (
                "shipped fixed_window, one a call",
                1,
                [
                    "EVALSHA",
                    shipped.sha,
                    "1",
                    "shipped:fw",
                    COST_SCALED,
                    "1",
                    CAPACITY_SCALED,
                    WINDOW_S,
                ],
            ),
        ]
        rows += [
            (
                f"one key, {n} decisions a call",
                n,
                [
                    "EVALSHA",
                    hot_sha,
                    "1",
                    "hot:fw",
                    str(n),
                    COST_SCALED,
                    CAPACITY_SCALED,
                    WINDOW_S,
                ],
            )
            for n in HOT_SIZES
        ]
        rows += [
            (
                f"{n} keys, one decision each a call",
                n,
                ["EVALSHA", spread_sha, str(n)]
                + [f"spread:{n}:{k}" for k in range(n)]
                + [COST_SCALED, CAPACITY_SCALED, WINDOW_S],
            )
            for n in SIZES
        ]
        hot_decisions = 0
        results: list[dict[str, Any]] = []
        for label, per_call, argv in rows:
            calls = calls_for(per_call, options.decisions)
            us_per_decision = sorted(
                trial(client, server.port, argv, calls) / (calls * per_call) * 1e6
                for _ in range(options.trials)
            )
            if label.startswith("one key"):
                hot_decisions += calls * per_call * options.trials
            median_us = statistics.median(us_per_decision)
            results.append(
                {
                    "row": label,
                    "decisions_per_call": per_call,
                    "calls": calls,
                    "redis_us_per_decision": us_per_decision,
                    "median_us": median_us,
                    "decisions_per_core_s": 1e6 / median_us,
                }
            )
            print(
                f"{label:<36} {median_us:7.3f} us/decision  {1e6 / median_us:>12,.0f} "
                f"decisions/s/core  trials {[round(t, 3) for t in us_per_decision]}",
                flush=True,
            )
        # Every hot-key decision was admitted: the counters hold exactly what was sent.
        counted = client.eval(
            "local n = 0 for _, k in ipairs(redis.call('KEYS', 'hot:fw:*')) do "
            "n = n + tonumber(redis.call('GET', k)) end return n",
            0,
        )
        exact = int(counted) == hot_decisions * int(COST_SCALED)
        print(
            f"hot key counters: {int(counted):,} scaled, sent {hot_decisions:,} decisions: "
            + ("exact" if exact else "MISMATCH")
        )
        path = write_results("batch_floor", vars(options), results, hot_key_exact=exact)
        print(f"written to {path.relative_to(ROOT)}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
