"""The floor a batched decision cannot go under: each algorithm family's state commands
alone, sixteen decisions a call (issue 30's Redis CPU targets).

Issue 30 asks Redis CPU per decision of at most 0.2x the best peer over 1,000
identities and 0.1x on one hot identity. A batched call shares the call's own price
(the call, ``TIME``, the reply) among its checks; what it cannot share is each
identity's state: its read and its write. This measures that part, per family, with
nothing else in the script: no policy list, no argument checks, no refusal path, the
least math that keeps the state meaningful, and the smallest reply (five integers a
decision in one flat array). The shapes are the shipped scripts' state commands:

- **counter** (fixed window): ``INCRBY`` (and ``PEXPIREAT`` on a new counter);
- **two counters** (sliding window): ``GET`` of the previous window's, ``INCRBY`` of
  the current one's;
- **hash** (token and leaky bucket, GCRA): ``HMGET`` of two fields (GCRA's count; the
  buckets read three), ``HSET`` of one (the shipped writes set only the fields whose text
  changed: over many identities, one; the sketch's ``at`` is written with a new key
  alone, so its decay is no model of either, only of the commands' price) and
  ``PEXPIREAT``;
- **log** (sliding log): ``ZREMRANGEBYSCORE`` of what left the window, ``ZCARD``,
  ``ZADD`` of the new entry, ``PEXPIRE``.
- **bucket as laid out** (token and leaky bucket, in the layout the spec fixes: the
  amount, the base and the units credited since it, three fields): ``HMGET`` of the
  three, ``HSET`` of the base alone when the other two keep their text (a bucket
  refilled in full, as over many identities), ``PEXPIREAT``;
- **log as laid out** (sliding log, in the layout issue 30 keeps: members of a running
  total and a cost, so checks of any cost are exact): ``ZRANGE`` of the newest entry
  with its score (the stamp), ``ZRANGE`` of the first in the window by score (the usage,
  from the two totals), ``ZADD`` of the new entry; once a second of the stamp, the trim
  and the expiry. No entry is checked. The count sketch above is cheaper than any log
  that admits checks of unequal costs.

Every number goes to Redis as ``'%d'`` text, as the shipped scripts send it: Redis 7.0
formats a Lua number argument with ``'%.17g'``, some 2,000 instructions each (until
2026-12-06 the sketches sent the counters' cost, the log's cutoff, stamp and window, and a
new hash key's ``at`` as numbers, so their floors were that much too high).

"1,000 identities": sixteen keys a call, each with ``__rand_int__`` in it and ``-r
1000`` (redis-benchmark draws each occurrence anew, as twelve digits), one decision each,
as a batch over many identities decides them. "hot": one key, sixteen decisions a call,
the state read once and written once (the log adds every entry in one ``ZADD``), as a
batch's run on one identity does. Each row is ``redis-benchmark -c 8 -P 16`` sending one fixed
``EVALSHA`` to a redis-server this script starts, Redis's main-thread CPU from ``INFO
cpu`` around each trial divided by its decisions, median of the trials.

With ``--peers results/peers-in-situ-<time>.json`` (``benchmarks/peers_in_situ.py``'s
raw record) each floor is also shown against issue 30's target for the families it
serves: the best peer's Redis CPU per decision in situ times 0.2 (1,000 identities) or
0.1 (hot). A floor above its target is a target no layout can meet.

The keys are shaped as the shipped ones by default (``--keys shipped``): the state key a
limiter writes for an identity, ``moderato:gc:{:global:id123}:3600:gcra`` say, with the
twelve digits in place of ``global:id123`` (each family's shortest: GCRA's for the hash),
so the floor pays what Redis pays to hash, compare and copy keys of that length (some 40
bytes, where ``--keys short``, this benchmark's keys before 2026-12-05, are 20).

    .venv/bin/python benchmarks/state_floor.py [--trials N] [--decisions N] [--peers FILE]
        [--keys shipped|short]

Writes ``benchmarks/results/state-floor-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import redis  # noqa: E402
from batch_floor import calls_for, trial, write_results  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

PER_CALL = 16
WINDOW_MS = "3600000"
COST_SCALED = "1000"
CAPACITY_SCALED = "9000000000000"

# Shared head of every sketch: the clock once, the flat reply, the policy's integers.
HEAD = """
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local window_ms, cost_scaled = tonumber(ARGV[1]), tonumber(ARGV[2])
local capacity_scaled = tonumber(ARGV[3])
-- Every number is sent as '%d' text, as the shipped scripts send it (Redis 7.0 formats a
-- Lua number argument with '%.17g', some 2,000 instructions each).
local format = string.format
local reply, at = {}, 0
local function answer(allowed, remaining_scaled, retry_ms, reset_ms)
  reply[at + 1], reply[at + 2], reply[at + 3] = allowed, 0, remaining_scaled
  reply[at + 4], reply[at + 5] = retry_ms, reset_ms
  at = at + 5
end
"""

# The log as laid out (see above), shared by its two sketches: the instants once a call;
# one key's read (the newest entry: the stamp and the running total; the first in the
# window: the usage), into the locals key, total_scaled, usage_scaled and stamp_ms; and
# the trim and expiry, due once a second of the stamp.
LAID_OUT_HEAD = """
local cutoff_text = format('%d', now_ms - window_ms)
local open_cutoff_text, now_second_ms = '(' .. cutoff_text, now_ms - now_ms % 1000
"""
LAID_OUT_READ = """
local newest = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
local due = not newest[1]
if newest[1] then
  local newest_ms = newest[2] + 0
  stamp_ms = newest_ms > now_ms and newest_ms or now_ms
  due = newest_ms < now_second_ms
  total_scaled = string.sub(newest[1], 1, 16) + 0
  local first = redis.call('ZRANGE', key, open_cutoff_text, '+inf', 'BYSCORE', 'LIMIT', '0', '1')
  if first[1] then
    usage_scaled = total_scaled - string.sub(first[1], 1, 16) + string.sub(first[1], 18)
  end
end
"""
LAID_OUT_TRIM = """
if due then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff_text)
  redis.call('PEXPIREAT', key, format('%d', now_second_ms + 2000 + window_ms))
end
"""

# One decision per key, every key of the call (KEYS), each its own identity.
SPREAD = {
    "counter": """
local window_end_ms = now_ms - math.fmod(now_ms, window_ms) + window_ms
local cost_text, window_end_text = format('%d', cost_scaled), format('%d', window_end_ms)
for i = 1, #KEYS do
  local used_scaled = redis.call('INCRBY', KEYS[i], cost_text)
  if used_scaled == cost_scaled then
    redis.call('PEXPIREAT', KEYS[i], window_end_text)
  end
  answer(1, capacity_scaled - used_scaled, 0, window_end_ms)
end
""",
    "two counters": """
local window_start_ms = now_ms - math.fmod(now_ms, window_ms)
local current = ':' .. format('%d', window_start_ms / window_ms)
local previous = ':' .. format('%d', window_start_ms / window_ms - 1)
local cost_text = format('%d', cost_scaled)
local expiry_text = format('%d', window_start_ms + 2 * window_ms)
for i = 1, #KEYS do
  local before_scaled = tonumber(redis.call('GET', KEYS[i] .. previous) or '0')
  local used_scaled = redis.call('INCRBY', KEYS[i] .. current, cost_text)
  if used_scaled == cost_scaled then
    redis.call('PEXPIREAT', KEYS[i] .. current, expiry_text)
  end
  answer(1, capacity_scaled - used_scaled - before_scaled, 0, window_start_ms + window_ms)
end
""",
    "hash": """
local expiry_text, now_text = format('%d', now_ms + window_ms), format('%d', now_ms)
for i = 1, #KEYS do
  local state = redis.call('HMGET', KEYS[i], 'level', 'at')
  local level_scaled = tonumber(state[1]) or 0
  local at_ms = tonumber(state[2]) or now_ms
  level_scaled = math.max(0, level_scaled - (now_ms - at_ms)) + cost_scaled
  if state[2] then
    redis.call('HSET', KEYS[i], 'level', format('%d', level_scaled))
  else
    redis.call('HSET', KEYS[i], 'level', format('%d', level_scaled), 'at', now_text)
  end
  redis.call('PEXPIREAT', KEYS[i], expiry_text)
  answer(1, capacity_scaled - level_scaled, 0, now_ms + window_ms)
end
""",
    "bucket as laid out": """
local now_text = format('%d', now_ms)
local expiry_text = format('%d', now_ms + 2 * window_ms + 60000)
local full_text = format('%d', capacity_scaled - cost_scaled)
for i = 1, #KEYS do
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'base', 'credited')
  local held_scaled = tonumber(state[1]) or capacity_scaled
  -- (the fields read as numbers, as a decision reads them; the sketch's math needs none)
  local base_ms, credited_scaled = tonumber(state[2]) or now_ms, tonumber(state[3]) or 0
  if state[1] == full_text and state[3] == '0' then
    redis.call('HSET', KEYS[i], 'base', now_text)
  else
    redis.call('HSET', KEYS[i], 'tokens', full_text, 'base', now_text, 'credited', '0')
  end
  redis.call('PEXPIREAT', KEYS[i], expiry_text)
  answer(1, capacity_scaled - cost_scaled, 0, now_ms + window_ms)
end
""",
    "log": """
local cutoff_text, now_text = format('%d', now_ms - window_ms), format('%d', now_ms)
local window_text = format('%d', window_ms)
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', cutoff_text)
  local held = redis.call('ZCARD', KEYS[i])
  redis.call('ZADD', KEYS[i], now_text, format('%s:%d', now_text, held))
  redis.call('PEXPIRE', KEYS[i], window_text)
  answer(1, capacity_scaled - (held + 1) * cost_scaled, 0, now_ms + window_ms)
end
""",
    "log as laid out": LAID_OUT_HEAD
    + """
for i = 1, #KEYS do
  local key, total_scaled, usage_scaled, stamp_ms = KEYS[i], 0, 0, now_ms
"""
    + LAID_OUT_READ
    + """
  total_scaled = total_scaled + cost_scaled
  redis.call('ZADD', key, format('%d', stamp_ms), format('%016d:%d', total_scaled, cost_scaled))
"""
    + LAID_OUT_TRIM
    + """
  answer(1, capacity_scaled - usage_scaled - cost_scaled, 0, stamp_ms + window_ms)
end
""",
}

# ARGV[4] decisions on KEYS[1]: the state read once, decided on Lua locals, written once.
HOT = {
    "counter": """
local window_end_ms = now_ms - math.fmod(now_ms, window_ms) + window_ms
local found_scaled = tonumber(redis.call('GET', KEYS[1]) or '0')
local used_scaled = found_scaled
for _ = 1, tonumber(ARGV[4]) do
  used_scaled = used_scaled + cost_scaled
  answer(1, capacity_scaled - used_scaled, 0, window_end_ms)
end
redis.call('INCRBY', KEYS[1], format('%d', used_scaled - found_scaled))
if found_scaled == 0 then
  redis.call('PEXPIREAT', KEYS[1], format('%d', window_end_ms))
end
""",
    "two counters": """
local window_start_ms = now_ms - math.fmod(now_ms, window_ms)
local current = KEYS[1] .. ':' .. format('%d', window_start_ms / window_ms)
local previous = KEYS[1] .. ':' .. format('%d', window_start_ms / window_ms - 1)
local before_scaled = tonumber(redis.call('GET', previous) or '0')
local found_scaled = tonumber(redis.call('GET', current) or '0')
local used_scaled = found_scaled
for _ = 1, tonumber(ARGV[4]) do
  used_scaled = used_scaled + cost_scaled
  answer(1, capacity_scaled - used_scaled - before_scaled, 0, window_start_ms + window_ms)
end
redis.call('INCRBY', current, format('%d', used_scaled - found_scaled))
if found_scaled == 0 then
  redis.call('PEXPIREAT', current, format('%d', window_start_ms + 2 * window_ms))
end
""",
    "hash": """
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
local level_scaled = tonumber(state[1]) or 0
local at_ms = tonumber(state[2]) or now_ms
level_scaled = math.max(0, level_scaled - (now_ms - at_ms))
for _ = 1, tonumber(ARGV[4]) do
  level_scaled = level_scaled + cost_scaled
  answer(1, capacity_scaled - level_scaled, 0, now_ms + window_ms)
end
if state[2] then
  redis.call('HSET', KEYS[1], 'level', format('%d', level_scaled))
else
  redis.call('HSET', KEYS[1], 'level', format('%d', level_scaled), 'at', format('%d', now_ms))
end
redis.call('PEXPIREAT', KEYS[1], format('%d', now_ms + window_ms))
""",
    "bucket as laid out": """
local state = redis.call('HMGET', KEYS[1], 'tokens', 'base', 'credited')
-- (the fields read as numbers, as a run's read takes them; the sketch's math, a bucket
-- refilled in full, uses none of them)
local held_scaled = tonumber(state[1]) or capacity_scaled
local base_ms, credited_scaled = tonumber(state[2]) or now_ms, tonumber(state[3]) or 0
held_scaled = capacity_scaled
for _ = 1, tonumber(ARGV[4]) do
  held_scaled = held_scaled - cost_scaled
  answer(1, held_scaled, 0, now_ms + window_ms)
end
redis.call('HSET', KEYS[1], 'tokens', format('%d', held_scaled), 'base', format('%d', now_ms))
redis.call('PEXPIREAT', KEYS[1], format('%d', now_ms + 2 * window_ms + 60000))
""",
    "log": """
local now_text = format('%d', now_ms)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', format('%d', now_ms - window_ms))
local held = redis.call('ZCARD', KEYS[1])
local entries = {}
for n = 1, tonumber(ARGV[4]) do
  entries[2 * n - 1], entries[2 * n] = now_text, format('%s:%d', now_text, held + n)
  answer(1, capacity_scaled - (held + n) * cost_scaled, 0, now_ms + window_ms)
end
redis.call('ZADD', KEYS[1], unpack(entries))
redis.call('PEXPIRE', KEYS[1], format('%d', window_ms))
""",
    "log as laid out": LAID_OUT_HEAD
    + """
local key, total_scaled, usage_scaled, stamp_ms = KEYS[1], 0, 0, now_ms
"""
    + LAID_OUT_READ
    + """
local stamp_text, entries = format('%d', stamp_ms), {}
for n = 1, tonumber(ARGV[4]) do
  total_scaled, usage_scaled = total_scaled + cost_scaled, usage_scaled + cost_scaled
  entries[2 * n - 1], entries[2 * n] = stamp_text, format('%016d:%d', total_scaled, cost_scaled)
  answer(1, capacity_scaled - usage_scaled, 0, stamp_ms + window_ms)
end
redis.call('ZADD', key, unpack(entries))
"""
    + LAID_OUT_TRIM,
}

# Which moderato algorithms each shape serves, and the peers' family names for them.
FAMILIES = {
    "counter": ("fixed_window",),
    "two counters": ("sliding_window",),
    "hash": ("token_bucket", "leaky_bucket", "gcra"),
    "log": ("sliding_log",),
    "log as laid out": ("sliding_log",),
    "bucket as laid out": ("token_bucket", "leaky_bucket"),
}
TARGET_FACTOR = {"1,000 identities": 0.2, "hot": 0.1}

# Each shape's state key as a limiter names it (moderato.keys; the window of 3600 s and,
# for the counters, the window's index, as the sketches' own keys take them), with
# "{identity}" where the identity and its tenant go.
SHIPPED_KEYS = {
    "counter": "moderato:fw:{{:{identity}}}:3600:499029",
    "two counters": "moderato:sw:{{:{identity}}}:3600",
    "hash": "moderato:gc:{{:{identity}}}:3600:gcra",
    "log": "moderato:sl:{{:{identity}}}:3600:log",
    # (the same length as the log's, not its keys: the count sketch's entries are not
    # entries of this layout)
    "log as laid out": "moderato:sl:{{:{identity}}}:3600:LOG",
    "bucket as laid out": "moderato:tb:{{:{identity}}}:3600:bucket:v2",
}


def state_key(shape: str, identity: str, keys: str) -> str:
    """The key a row sends for ``identity`` (``__rand_int__``, or the hot one's)."""
    if keys == "shipped":
        return SHIPPED_KEYS[shape].format(identity=identity)
    return f"{shape.replace(' ', '-')}:{'id:' if identity == '__rand_int__' else ''}{identity}"


def best_peer_us(peers_record: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(algorithm, where) -> the best peer's Redis µs per decision in a peers_in_situ run."""
    best: dict[tuple[str, str], float] = {}
    for row in peers_record["rows"]:
        where = "1,000 identities" if row["identities"] == "1,000" else "hot"
        # The record names its best peer; the references beside it (a bare client, the
        # loop alone) are not limiters and never count.
        best[(row["algorithm"], where)] = row["redis_us_per_decision"][row["best_peer"]]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=400_000, help="per row, about")
    parser.add_argument("--peers", type=Path, help="a peers_in_situ.py raw record")
    parser.add_argument(
        "--keys", choices=("shipped", "short"), default="shipped", help="the keys' shape"
    )
    options = parser.parse_args()
    if shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-benchmark was not found: it comes with redis-server")
    best = best_peer_us(json.loads(options.peers.read_text())) if options.peers else {}

    server = RedisServer().start()
    try:
        client = redis.Redis(port=server.port)
        policy = [WINDOW_MS, COST_SCALED, CAPACITY_SCALED]
        empty = str(client.script_load("return 1"))
        rows: list[tuple[str, str, int, list[str]]] = [
            ("empty script", "", 1, ["EVALSHA", empty, "0"]),
        ]
        for shape in SPREAD:
            spread = str(client.script_load(HEAD + SPREAD[shape] + "return reply"))
            hot = str(client.script_load(HEAD + HOT[shape] + "return reply"))
            keys = [state_key(shape, "__rand_int__", options.keys)] * PER_CALL
            rows.append(
                (
                    shape,
                    "1,000 identities",
                    PER_CALL,
                    ["EVALSHA", spread, str(PER_CALL), *keys, *policy],
                )
            )
            hot_key = state_key(shape, "hot", options.keys)
            rows.append(
                (shape, "hot", PER_CALL, ["EVALSHA", hot, "1", hot_key, *policy, str(PER_CALL)])
            )
        results: list[dict[str, Any]] = []
        for shape, where, per_call, argv in rows:
            calls = calls_for(per_call, options.decisions)
            trials = sorted(
                trial(client, server.port, argv, calls) / (calls * per_call) * 1e6
                for _ in range(options.trials)
            )
            median_us = statistics.median(trials)
            targets = {
                algorithm: best[(algorithm, where)] * TARGET_FACTOR[where]
                for algorithm in FAMILIES.get(shape, ())
                if (algorithm, where) in best
            }
            results.append(
                {
                    "shape": shape,
                    "where": where,
                    "decisions_per_call": per_call,
                    "calls": calls,
                    "redis_us_per_decision": trials,
                    "median_us": median_us,
                    "targets_us": targets,
                }
            )
            verdicts = ", ".join(
                f"{algorithm} target {target_us:.2f}"
                + (" (under the floor)" if median_us > target_us else " (above the floor)")
                for algorithm, target_us in targets.items()
            )
            print(
                f"{shape:<15} {where:<17} {median_us:6.2f} us/decision  "
                f"trials {[round(t, 2) for t in trials]}  {verdicts}",
                flush=True,
            )
        path = write_results(
            "state_floor", {**vars(options), "peers": str(options.peers or "")}, results
        )
        print(f"written to {path.relative_to(ROOT)}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
