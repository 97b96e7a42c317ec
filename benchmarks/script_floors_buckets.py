"""Spec floors for the token bucket, the leaky bucket and GCRA, beside moderato and the peers.

A floor is the smallest script that does only what the behavioural spec forces on
every decision: Redis's clock (TIME), one read of the policy's state, one write of it
with its expiry, and the five-integer reply the headers need. It validates nothing,
computes no exact accrual and serves one policy only, so no real script can go below
it: what separates moderato's script from its floor is the price of validation,
exactness and the multi-policy contract; what separates the floor from the peer's
script is the price of the state layout and the reply.

Two floors per algorithm:

- ``hash``: the layout moderato stores today, a hash (HMGET, HSET, PEXPIREAT: a hash
  cannot take its expiry in the same command), the state's integers formatted by Redis.
- ``string``: one string holding the same integers, read with GET and parsed by one
  pattern, written with ``SET ... PXAT`` (value and expiry in one command), the integers
  formatted by one string.format. A layout moderato could move to (a new key suffix);
  this measures what it would be worth before anyone does.

Every subject runs in the same trials on one fresh redis-server, as in server_cpu.py
(whose measuring this reuses):

    python benchmarks/script_floors_buckets.py [--requests N] [--trials N] [--before REF]
        [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import server_cpu
from server_cpu import LIMIT, WINDOW_S, ScriptSubject

ALGORITHMS = ("token_bucket", "leaky_bucket", "gcra")

# The clock as every moderato script reads it (one_policy.lua), in ms.
_CLOCK = """local time = redis.call('TIME')
local time_us = time[2] + 0
local now_ms = time[1] * 1000 + (time_us - time_us % 1000) / 1000
"""

# The arguments are moderato's (cost_scaled, apply, capacity_scaled, window_s[, rate]),
# so each floor takes the same command as the script it stands beside. Each floor
# admits and writes the state of a bucket after one charge from full (the state the
# benchmark's rate leaves: every key refills between two of its calls).
_HASH_FLOORS = {
    "token_bucket": """
local key, cost, capacity, window_ms = KEYS[1], ARGV[1] + 0, ARGV[3] + 0, ARGV[4] * 1000
local state = redis.call('HMGET', key, 'tokens', 'base', 'credited')
redis.call('HSET', key, 'tokens', capacity - cost, 'base', now_ms, 'credited', '0')
redis.call('PEXPIREAT', key, now_ms + 2 * window_ms + 60000)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
    "leaky_bucket": """
local key, cost, capacity = KEYS[1], ARGV[1] + 0, ARGV[3] + 0
local state = redis.call('HMGET', key, 'level', 'base', 'drained')
redis.call('HSET', key, 'level', cost, 'base', now_ms, 'drained', '0')
redis.call('PEXPIREAT', key, now_ms + 1001)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
    "gcra": """
local key, cost, capacity = KEYS[1], ARGV[1] + 0, ARGV[3] + 0
local state = redis.call('HMGET', key, 'tat', 'frac')
redis.call('HSET', key, 'tat', now_ms * 1000 + 60, 'frac', '0')
redis.call('PEXPIREAT', key, now_ms + 1001)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
}

_STRING_FLOORS = {
    "token_bucket": """
local key, cost, capacity, window_ms = KEYS[1], ARGV[1] + 0, ARGV[3] + 0, ARGV[4] * 1000
local stored = redis.call('GET', key)
if stored then
  local tokens, base, credited = string.match(stored, '^(%d+) (%d+) (%d+)$')
end
redis.call('SET', key, string.format('%d %d 0', capacity - cost, now_ms),
  'PXAT', now_ms + 2 * window_ms + 60000)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
    "leaky_bucket": """
local key, cost, capacity = KEYS[1], ARGV[1] + 0, ARGV[3] + 0
local stored = redis.call('GET', key)
if stored then
  local level, base, drained = string.match(stored, '^(%d+) (%d+) (%d+)$')
end
redis.call('SET', key, string.format('%d %d 0', cost, now_ms), 'PXAT', now_ms + 1001)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
    "gcra": """
local key, cost, capacity = KEYS[1], ARGV[1] + 0, ARGV[3] + 0
local stored = redis.call('GET', key)
if stored then
  local tat, frac = string.match(stored, '^(%d+) (%d+)$')
end
redis.call('SET', key, string.format('%d 0', now_ms * 1000 + 60), 'PXAT', now_ms + 1001)
return { 1, 0, capacity - cost, 0, now_ms + 1 }
""",
}

FLOORS = {"hash": _HASH_FLOORS, "string": _STRING_FLOORS}


def floor_subject(algorithm: str, layout: str) -> ScriptSubject:
    """The floor beside moderato's one-policy script: the same keys' shape and arguments."""
    moderato = server_cpu.moderato_subject(algorithm, f"{LIMIT}/minute")
    return replace(
        moderato,
        name=f"floor {algorithm} ({layout} state)",
        library=f"floor-{layout}",
        origin="benchmarks/script_floors_buckets.py",
        source=_CLOCK + FLOORS[layout][algorithm].lstrip("\n"),
        keys=tuple(key.replace("cpu:", f"cpu-floor-{layout}:", 1) for key in moderato.keys),
    )


def subjects(before_ref: Optional[str]) -> tuple[list[ScriptSubject], list[str]]:
    chosen: list[ScriptSubject] = []
    for algorithm in ALGORITHMS:
        moderato = server_cpu.moderato_subject(algorithm, f"{LIMIT}/minute")
        chosen.append(moderato)
        if before_ref:
            chosen.append(server_cpu.before_subject(moderato, before_ref))
        chosen += [floor_subject(algorithm, layout) for layout in FLOORS]
    peers, missing = server_cpu.peer_subjects()
    chosen += [peer for peer in peers if peer.algorithm in ALGORITHMS]
    return chosen, missing


def run(port: int, requests: int, trials: int, before_ref: Optional[str]) -> dict[str, Any]:
    chosen, missing = subjects(before_ref)
    shas = {subject.name: server_cpu._load(port, subject) for subject in chosen}
    samples: dict[str, list[float]] = {subject.name: [] for subject in chosen}
    errors: dict[str, int] = {subject.name: 0 for subject in chosen}
    # Interleaved: each trial visits every subject, so drift spreads over all of them.
    for _ in range(trials):
        for subject in chosen:
            measured = server_cpu.measure_once(port, subject, shas[subject.name], requests)
            samples[subject.name].append(measured["us_per_decision"])
            errors[subject.name] += measured["error_replies"]
    results = [
        {
            "name": subject.name,
            "library": subject.library,
            "algorithm": subject.algorithm,
            "origin": subject.origin,
            "us_per_decision": {
                "median": statistics.median(samples[subject.name]),
                "min": min(samples[subject.name]),
                "samples": samples[subject.name],
            },
            "error_replies": errors[subject.name],
            "sample_reply": server_cpu.sample_reply(port, subject, shas[subject.name]),
            "source": subject.source if subject.library.startswith("floor") else None,
        }
        for subject in chosen
    ]
    return {
        "what": (
            f"redis-benchmark -c {server_cpu.CLIENTS} -P {server_cpu.PIPELINE} -n {requests} "
            f"-r {server_cpu.IDENTITIES} EVALSHA per script, {LIMIT}/minute (window "
            f"{WINDOW_S} s), server CPU from INFO cpu; median of {trials} interleaved trials"
        ),
        "requests": requests,
        "trials": trials,
        "before_ref": before_ref,
        "missing_peers": missing,
        "subjects": results,
        "ratios": ratios(results),
    }


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per algorithm: each subject's median over the peer's and over the hash floor's."""
    median = {r["name"]: r["us_per_decision"]["median"] for r in results}
    out = []
    for algorithm in ALGORITHMS:
        peers = [
            r["name"]
            for r in results
            if r["algorithm"] == algorithm
            and r["library"] not in ("moderato", "moderato-before")
            and not r["library"].startswith("floor")
        ]
        hash_floor = median.get(f"floor {algorithm} (hash state)")
        for result in results:
            if result["algorithm"] != algorithm:
                continue
            row: dict[str, Any] = {
                "algorithm": algorithm,
                "subject": result["name"],
                "us": median[result["name"]],
            }
            if peers:
                row["over_peer"] = median[result["name"]] / median[peers[0]]
                row["peer"] = peers[0]
            if hash_floor:
                row["over_hash_floor"] = median[result["name"]] / hash_floor
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="calls per script and trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--before", metavar="REF", help="also moderato's scripts as at this git ref"
    )
    parser.add_argument("--output", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    with server_cpu.own_server() as port:
        result = run(port, args.requests, args.trials, args.before)
    print(f"{'subject':<52} {'µs/decision':>12} {'/peer':>7} {'/hash floor':>12}")
    for row in result["ratios"]:
        over_peer = f"{row['over_peer']:.2f}" if "over_peer" in row else "-"
        over_floor = f"{row['over_hash_floor']:.2f}" if "over_hash_floor" in row else "-"
        print(f"{row['subject']:<52} {row['us']:>12.2f} {over_peer:>7} {over_floor:>12}")
    for subject in result["subjects"]:
        if subject["error_replies"]:
            print(f"ERRORS {subject['name']}: {subject['error_replies']}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
