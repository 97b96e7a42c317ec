"""Redis server CPU per decision: moderato's scripts beside the leanest peer script.

At scale a Redis-backed limiter costs Redis CPU: one core runs a fixed number of
script calls per second. This section runs, on one fresh redis-server (a free
loopback port, nothing else on it), redis-benchmark ``-c 50 -P 16`` sending
EVALSHA of each script over :data:`IDENTITIES` keys at a rate that admits
everything, and divides the server's CPU time (``INFO cpu``: used_cpu_user +
used_cpu_sys, before and after) by the calls made. Each trial visits every
script in turn, so drift on a shared machine spreads over all of them; the
figure is the median of the trials.

The peers' scripts are read from the installed packages at run time (limits,
throttled-py), never copied into this repository; a peer that is not
installed is left out and named in the result. A plain token bucket written
here (TIME + HMGET + HSET + PEXPIRE, no validation) gives the ceiling a
minimal script reaches, the reference for the client-side figures.

    python benchmarks/server_cpu.py [--requests N] [--trials N] [--only NAME,...] [--before REF]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from redis_servers import RedisServer  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.policy import policy_for  # noqa: E402
from moderato.scripts import load_script, without_comments  # noqa: E402

IDENTITIES = 1000  # redis-benchmark -r: the keys the calls spread over
CLIENTS = 50
PIPELINE = 16
LIMIT = 1_000_000  # per minute: every call is admitted
WINDOW_S = 60
# The 3-policy case: three rates of one identity, all admitting everything.
THREE_POLICIES = f"{LIMIT}/minute;{60 * LIMIT}/hour;{1440 * LIMIT}/day"

# A minimal exact-enough token bucket: what a script with no validation, no
# exact integer refill and no multi-policy support costs. Only a reference.
PLAIN_TOKEN_BUCKET = """
local capacity = tonumber(ARGV[1])
local per_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = capacity, now
if state[1] then
  tokens, ts = tonumber(state[1]), tonumber(state[2])
  tokens = math.min(capacity, tokens + (now - ts) * per_ms)
end
local allowed = 0
if tokens >= cost then
  allowed = 1
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / per_ms) * 2)
end
return { allowed, math.floor(tokens) }
"""


# Spec floors: per algorithm, the smallest script that does only what the seed spec forces
# on the measured path (an admission): Redis's clock (TIME), the state the algorithm
# needs read and written in the fewest commands, the key named by the window where the
# spec names it, an expiry (set when the state is created, or once per second for the
# log), and moderato's reply layout (what the decoder and the headers take). No argument
# checks, no refusals, no several policies, no unusual-state handling: what moderato
# adds to these is its own cost; what a floor adds to the peer's script is the spec's.
# (A floor's denial answers, but without the exact wait: it is not the measured path.)
# Called with moderato's arguments (cost_scaled, apply, capacity_scaled, window_s); each
# body follows _FLOOR_CLOCK.
_FLOOR_CLOCK = """
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local cost_scaled, capacity_scaled = tonumber(ARGV[1]), tonumber(ARGV[3])
local window_ms = ARGV[4] * 1000
"""

SPEC_FLOORS = {
    # A counter per window: charge it, take the charge back if it does not fit.
    "fixed_window": """
local window_end_ms = now_ms - now_ms % window_ms + window_ms
local key = KEYS[1] .. string.format(':%d', window_end_ms / window_ms - 1)
local used_scaled = redis.call('INCRBY', key, ARGV[1])
if used_scaled == cost_scaled then
  redis.call('PEXPIREAT', key, string.format('%d', window_end_ms))
end
if used_scaled > capacity_scaled then
  redis.call('DECRBY', key, ARGV[1])
  local remaining_scaled = capacity_scaled - used_scaled + cost_scaled
  return { 0, 0, remaining_scaled, window_end_ms - now_ms, window_end_ms }
end
return { 1, 0, capacity_scaled - used_scaled, 0, window_end_ms }
""",
    # The previous window's counter weighted by what is left of it, plus the current one.
    "sliding_window": """
local window_start_ms = now_ms - now_ms % window_ms
local index = window_start_ms / window_ms
local window_s = window_ms / 1000
local elapsed_s = math.floor((now_ms - window_start_ms) / 1000)
local weight_permille = math.floor((window_s - elapsed_s) * 1000 / window_s)
local previous_scaled = redis.call('GET', KEYS[1] .. string.format(':%d', index - 1)) or 0
local room_scaled = capacity_scaled - math.floor(previous_scaled * weight_permille / 1000)
local key = KEYS[1] .. string.format(':%d', index)
local used_scaled = redis.call('INCRBY', key, ARGV[1])
if used_scaled > room_scaled then
  redis.call('DECRBY', key, ARGV[1])
  return { 0, 0, room_scaled - used_scaled + cost_scaled, 1000, window_start_ms + window_ms }
end
if used_scaled == cost_scaled then
  redis.call('PEXPIREAT', key, string.format('%d', window_start_ms + 2 * window_ms))
end
return { 1, 0, room_scaled - used_scaled, 0, window_start_ms + window_ms }
""",
    # Every admission in the window with its cost and running total: the newest entry and
    # the first in the window give the usage; trim and expiry once a second.
    "sliding_log": """
local key = KEYS[1] .. ':log'
local cutoff_ms = now_ms - window_ms
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local newest_at_ms, newest_total, usage_scaled = -1, 0, 0
if newest[1] then
  newest_at_ms, newest_total = tonumber(newest[2]), tonumber(string.match(newest[1], '^(%d+)'))
  local first = redis.call('ZRANGE', key, string.format('(%d', cutoff_ms), '+inf', 'BYSCORE',
    'LIMIT', 0, 1, 'WITHSCORES')
  if first[1] then
    local total, cost = string.match(first[1], '^(%d+):(%d+)$')
    usage_scaled = newest_total - (total - cost)
  end
end
if usage_scaled + cost_scaled > capacity_scaled then
  return { 0, 0, capacity_scaled - usage_scaled, 1000, now_ms + 1000 }
end
local stamp_ms = math.max(now_ms, newest_at_ms)
redis.call('ZADD', key, string.format('%d', stamp_ms),
  string.format('%016d:%d', newest_total + cost_scaled, cost_scaled))
if newest_at_ms < stamp_ms - stamp_ms % 1000 then
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', cutoff_ms))
  redis.call('PEXPIREAT', key, string.format('%d', stamp_ms - stamp_ms % 1000 + 2000 + window_ms))
end
return { 1, 0, capacity_scaled - usage_scaled - cost_scaled, 0, stamp_ms + window_ms }
""",
}


@dataclass(frozen=True)
class ScriptSubject:
    """One script, its keys and arguments, as redis-benchmark sends it."""

    name: str
    library: str  # moderato, limits, throttled-py, reference
    algorithm: str  # the moderato algorithm it stands beside
    policies: int
    origin: str  # where the source was read
    source: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


def moderato_subject(algorithm: str, rates: str) -> ScriptSubject:
    chosen = ALGORITHMS[algorithm]
    script = load_script(chosen.name)
    policy = policy_for(rates)
    args: list[str] = ["1000", "1"]
    keys = []
    for number, rate in enumerate(policy.rates):
        args += [str(arg) for arg in chosen.policy_args(rate)]
        # Each __rand_int__ is drawn on its own; the suffix keeps the policies' keys distinct.
        keys.append(f"cpu:{chosen.key_tag}:{{__rand_int__}}:p{number}")
    count = len(policy.rates)
    return ScriptSubject(
        name=f"moderato {algorithm}" + ("" if count == 1 else f", {count} policies"),
        library="moderato",
        algorithm=algorithm,
        policies=count,
        origin=f"lua/{chosen.name}.lua",
        source=script.source.decode(),
        keys=tuple(keys),
        args=tuple(args),
    )


def _package_file(package: str, relative: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


@dataclass(frozen=True)
class PeerScript:
    name: str
    library: str
    package: str
    relative: str
    algorithm: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


_RATE_PER_S = LIMIT / WINDOW_S
# The arguments each peer's own client would send for LIMIT per WINDOW_S, cost 1.
# Client-clock timestamps (limits' moving window, throttled-py's sliding window)
# are fixed: redis-benchmark sends one command text throughout.
PEERS = (
    PeerScript("limits incr_expire.lua", "limits", "limits",
               "resources/redis/lua_scripts/incr_expire.lua", "fixed_window",
               ("cpu:li:fw:{__rand_int__}",), (str(WINDOW_S), "1")),
    PeerScript("limits acquire_moving_window.lua", "limits", "limits",
               "resources/redis/lua_scripts/acquire_moving_window.lua", "sliding_log",
               ("cpu:li:mw:{__rand_int__}",), ("1700000000.5", str(LIMIT), str(WINDOW_S), "1")),
    PeerScript("throttled-py token_bucket.lua", "throttled-py", "throttled",
               "rate_limiter/lua/token_bucket.lua", "token_bucket",
               ("cpu:th:tb:{__rand_int__}",), (repr(_RATE_PER_S), str(LIMIT), "1")),
    PeerScript("throttled-py leaking_bucket.lua", "throttled-py", "throttled",
               "rate_limiter/lua/leaking_bucket.lua", "leaky_bucket",
               ("cpu:th:lb:{__rand_int__}",), (repr(_RATE_PER_S), str(LIMIT), "1")),
    PeerScript("throttled-py gcra.lua", "throttled-py", "throttled",
               "rate_limiter/lua/gcra.lua", "gcra",
               ("cpu:th:gc:{__rand_int__}",), (repr(1 / _RATE_PER_S), str(LIMIT), "1")),
    PeerScript("throttled-py sliding_window.lua", "throttled-py", "throttled",
               "rate_limiter/lua/sliding_window.lua", "sliding_window",
               ("cpu:th:sw:{__rand_int__}:1", "cpu:th:sw:{__rand_int__}:0"),
               (str(WINDOW_S), str(LIMIT), "1", "1700000000500")),
)  # fmt: skip


def peer_subjects() -> tuple[list[ScriptSubject], list[str]]:
    """The installed peers' scripts, and a note for each one not found."""
    found: list[ScriptSubject] = []
    missing: list[str] = []
    for peer in PEERS:
        path = _package_file(peer.package, peer.relative)
        if path is None:
            missing.append(f"{peer.name}: package {peer.package} not installed")
            continue
        found.append(
            ScriptSubject(
                name=peer.name,
                library=peer.library,
                algorithm=peer.algorithm,
                policies=1,
                origin=f"{peer.package}/{peer.relative}",
                source=path.read_text(),
                keys=peer.keys,
                args=peer.args,
            )
        )
    return found, missing


def floor_subjects() -> list[ScriptSubject]:
    """Each spec floor, called as moderato's one-policy script is (its own keys)."""
    floors = []
    for algorithm, body in SPEC_FLOORS.items():
        ours = moderato_subject(algorithm, f"{LIMIT}/minute")
        floors.append(
            replace(
                ours,
                name=f"spec floor {algorithm}",
                library="floor",
                origin="benchmarks/server_cpu.py SPEC_FLOORS",
                source=_FLOOR_CLOCK + body,
                keys=tuple(key.replace("cpu:", "cpu-floor:", 1) for key in ours.keys),
            )
        )
    return floors


def reference_subject() -> ScriptSubject:
    return ScriptSubject(
        name="plain token bucket (TIME + HMGET + HSET + PEXPIRE)",
        library="reference",
        algorithm="token_bucket",
        policies=1,
        origin="benchmarks/server_cpu.py",
        source=PLAIN_TOKEN_BUCKET,
        keys=("cpu:ref:tb:{__rand_int__}",),
        args=(str(LIMIT * 1000), repr(LIMIT * 1000 / (WINDOW_S * 1000)), "1000"),
    )


def _git_text(ref: str, path: str) -> str:
    command = ["git", "-C", str(ROOT), "show", f"{ref}:{path}"]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def _scripts_dir_at(ref: str) -> str:
    """Where the scripts were at git `ref`: lua/, or moderato/lua/ for a while before."""
    command = ["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}:lua/prelude.lua"]
    return "lua" if subprocess.run(command, capture_output=True).returncode == 0 else "moderato/lua"


def source_at(ref: str, script: str) -> str:
    """A script as it was at git `ref`, assembled as the loader does now: its
    ``--#include`` lines spliced, its comments stripped."""
    directory = _scripts_dir_at(ref)
    lines = _git_text(ref, f"{directory}/{script}.lua").split("\n")
    for index, line in enumerate(lines):
        if line.startswith("--#include "):
            included = line[len("--#include ") :].strip()
            lines[index] = _git_text(ref, f"{directory}/{included}").rstrip("\n")
    return without_comments("\n".join(lines).encode()).decode()


def before_subject(subject: ScriptSubject, ref: str) -> ScriptSubject:
    """The same calls with the script as it was at `ref`: a before beside the after."""
    return replace(
        subject,
        name=f"{subject.name} @{ref}",
        library="moderato-before",
        origin=f"{ref}:{subject.origin}",
        source=source_at(ref, subject.algorithm),
        keys=tuple(key.replace("cpu:", "cpu-before:", 1) for key in subject.keys),
    )


def all_subjects(before_ref: Optional[str] = None) -> tuple[list[ScriptSubject], list[str]]:
    subjects = [moderato_subject(name, f"{LIMIT}/minute") for name in ALGORITHMS]
    subjects += [moderato_subject(name, THREE_POLICIES) for name in ALGORITHMS]
    if before_ref:
        subjects += [before_subject(subject, before_ref) for subject in subjects]
    peers, missing = peer_subjects()
    return [*subjects, *floor_subjects(), *peers, reference_subject()], missing


# -- measuring ------------------------------------------------------------------------


def _cli(port: int, *args: str) -> str:
    command = ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def _info(port: int, section: str) -> dict[str, str]:
    lines = _cli(port, "INFO", section).splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line)


def _server_cpu_s(port: int) -> float:
    info = _info(port, "cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _command_calls(port: int) -> dict[str, int]:
    """Calls per command (the commands scripts run are counted too)."""
    return {name: int(fields["calls"]) for name, fields in _command_stats(port).items()}


def _command_stats(port: int) -> dict[str, dict[str, str]]:
    stats = {}
    for name, value in _info(port, "commandstats").items():
        stats[name.removeprefix("cmdstat_")] = dict(part.split("=", 1) for part in value.split(","))
    return stats


def _error_replies(port: int) -> int:
    return int(_info(port, "stats").get("total_error_replies", "0"))


def _load(port: int, subject: ScriptSubject) -> str:
    return _cli(port, "SCRIPT", "LOAD", subject.source).strip()


def command_words(subject: ScriptSubject, sha: str) -> list[str]:
    return ["EVALSHA", sha, str(len(subject.keys)), *subject.keys, *subject.args]


def benchmark_command(port: int, subject: ScriptSubject, sha: str, requests: int) -> list[str]:
    """The redis-benchmark run of one script: its calls over IDENTITIES keys."""
    return [
        "redis-benchmark", "-h", "127.0.0.1", "-p", str(port),
        "-c", str(CLIENTS), "-P", str(PIPELINE), "-n", str(requests),
        "-r", str(IDENTITIES), "--csv",
        *command_words(subject, sha),
    ]  # fmt: skip


def described(subject: ScriptSubject) -> dict[str, Any]:
    """What a result says of its subject."""
    return {
        "name": subject.name,
        "library": subject.library,
        "algorithm": subject.algorithm,
        "policies": subject.policies,
        "origin": subject.origin,
    }


def measure_once(port: int, subject: ScriptSubject, sha: str, requests: int) -> dict[str, Any]:
    """One redis-benchmark run of a script on an empty keyspace."""
    _cli(port, "FLUSHALL", "SYNC")
    _cli(port, "CONFIG", "RESETSTAT")
    command = benchmark_command(port, subject, sha, requests)
    cpu_before_s = _server_cpu_s(port)
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    cpu_after_s = _server_cpu_s(port)
    rows = [line.split('","') for line in output.splitlines() if line.startswith('"')]
    ops_per_s = float(rows[-1][1].strip('"'))
    stats = _command_stats(port)
    calls = {name: int(fields["calls"]) for name, fields in stats.items()}
    evalsha_calls = calls.pop("evalsha", 0)
    # INFO, CONFIG and FLUSHALL come from this harness and redis-benchmark, not the script.
    for name in list(calls):
        if name in ("info", "flushall") or name.startswith(("config|", "script|")):
            del calls[name]
    return {
        "us_per_decision": (cpu_after_s - cpu_before_s) / requests * 1e6,
        "ops_per_s": ops_per_s,
        "evalsha_calls": evalsha_calls,
        "error_replies": _error_replies(port),
        "redis_calls_per_decision": {
            name: count / max(evalsha_calls, 1) for name, count in sorted(calls.items())
        },
        # Redis's own timing of each command, the ones a script runs included (wall µs).
        "usec_per_call": {name: float(stats[name]["usec_per_call"]) for name in sorted(calls)},
    }


def sample_reply(port: int, subject: ScriptSubject, sha: str) -> str:
    """One call's reply on a fresh key, to show each script admits at this rate."""
    keys = [key.replace("__rand_int__", "sample") for key in subject.keys]
    return _cli(port, "EVALSHA", sha, str(len(keys)), *keys, *subject.args).strip()


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def run(
    port: int,
    requests: int,
    trials: int,
    step: Callable[[str], None] = lambda label: None,
    only: Optional[list[str]] = None,
    before_ref: Optional[str] = None,
) -> dict[str, Any]:
    """The section: every subject, `trials` interleaved rounds, on the server at `port`;
    with `before_ref`, each moderato script also as it was at that git ref."""
    subjects, missing = all_subjects(before_ref)
    if only:
        subjects = [s for s in subjects if any(word in s.name for word in only)]
    shas = {subject.name: _load(port, subject) for subject in subjects}
    runs: dict[str, list[dict[str, Any]]] = {subject.name: [] for subject in subjects}
    for trial in range(trials):
        for subject in subjects:
            step(f"{subject.name}, trial {trial + 1}")
            runs[subject.name].append(measure_once(port, subject, shas[subject.name], requests))
    results = []
    for subject in subjects:
        samples = runs[subject.name]
        results.append(
            {
                **described(subject),
                "command": " ".join(command_words(subject, shas[subject.name])),
                "us_per_decision": _summary([s["us_per_decision"] for s in samples]),
                "ops_per_s": _summary([s["ops_per_s"] for s in samples]),
                "error_replies": sum(s["error_replies"] for s in samples),
                "redis_calls_per_decision": samples[-1]["redis_calls_per_decision"],
                "sample_reply": sample_reply(port, subject, shas[subject.name]),
            }
        )
    return {
        "what": (
            f"redis-benchmark -c {CLIENTS} -P {PIPELINE} -n {requests} -r {IDENTITIES} EVALSHA "
            "per script on an empty keyspace; server CPU (INFO cpu used_cpu_user + "
            "used_cpu_sys) before and after, divided by the calls"
        ),
        "requests": requests,
        "trials": trials,
        "limit": f"{LIMIT}/minute",
        "three_policies": THREE_POLICIES,
        "before_ref": before_ref,
        "missing_peers": missing,
        "subjects": results,
        "ratios": ratios(results),
    }


# -- where a script's time goes ------------------------------------------------------------

# The script's reply shape with nothing computed: what EVALSHA, KEYS/ARGV and the reply
# cost by themselves.
_FLOOR_TAIL = "return { 1, 0, 5, 0, 7 }\n"


def profile_variants(subject: ScriptSubject) -> dict[str, str]:
    """Cumulative cuts of one moderato script, each ending in the same constant reply.

    A script with a one-policy straight-line path: nothing; the clock and that path's
    argument check; the whole script. One without: nothing; every definition (Redis
    builds each function of the script per call); and the argument check; the whole."""
    source = subject.source
    fast = source.find("if #KEYS == 1 and #ARGV ==")
    if fast >= 0:
        # The check ends where the straight-line path tests its outcome.
        checked = source.index("\nif cost_scaled", fast) + 1
        return {
            "empty script": _FLOOR_TAIL,
            "clock + argument check": source[:checked] + _FLOOR_TAIL,
            "whole script": source,
        }
    tail = source.rindex("return decide(")
    fields = source[tail:].split("(", 1)[1].split(",", 1)[0]
    definitions = source[:tail]
    return {
        "empty script": _FLOOR_TAIL,
        "definitions only": definitions + _FLOOR_TAIL,
        "definitions + argument check": definitions
        + f"if not arguments_fit({fields}) then return 0 end\n"
        + _FLOOR_TAIL,
        "whole script": source,
    }


def profile(port: int, requests: int, trials: int) -> dict[str, Any]:
    """For each moderato script (one policy): the server CPU of each cut, median of trials."""
    out: dict[str, Any] = {"requests": requests, "trials": trials, "scripts": {}}
    for algorithm in ALGORITHMS:
        subject = moderato_subject(algorithm, f"{LIMIT}/minute")
        samples: dict[str, list[float]] = {}
        whole: dict[str, Any] = {}
        for _ in range(trials):
            for cut, source in profile_variants(subject).items():
                variant = replace(subject, source=source)
                measured = measure_once(port, variant, _load(port, variant), requests)
                samples.setdefault(cut, []).append(measured["us_per_decision"])
                if cut == "whole script":
                    whole = measured
        out["scripts"][algorithm] = {
            "us_per_decision": {cut: statistics.median(v) for cut, v in samples.items()},
            "redis_calls_per_decision": whole["redis_calls_per_decision"],
            "usec_per_call": whole["usec_per_call"],
        }
    return out


def ratios(results: list[dict[str, Any]], metric: str = "us_per_decision") -> list[dict[str, Any]]:
    """Per algorithm: moderato's single-policy script over the peer's, medians of one run;
    where the algorithm has a spec floor, the floor over the peer's and moderato over it.
    The figures are `metric`'s (its median): server CPU µs (keys ending in _us), or
    instructions (keys ending in _instructions)."""
    unit = "us" if metric == "us_per_decision" else "instructions"
    by_name = {r["name"]: r for r in results}
    out = []
    for result in results:
        if result["library"] in ("moderato", "moderato-before", "reference", "floor"):
            continue
        algorithm = result["algorithm"]
        ours = by_name.get(f"moderato {algorithm}")
        if not ours:
            continue
        mine = ours[metric]["median"]
        theirs = result[metric]["median"]
        row: dict[str, Any] = {
            "algorithm": algorithm,
            "peer": result["name"],
            f"moderato_{unit}": mine,
            f"peer_{unit}": theirs,
            "ratio": mine / theirs,
        }
        floor = by_name.get(f"spec floor {algorithm}")
        if floor:
            least = floor[metric]["median"]
            row[f"floor_{unit}"] = least
            row.update(floor_ratio=least / theirs, over_floor=mine / least)
        out.append(row)
    return out


# -- instructions: a figure the machine's load does not move ------------------------------


class CallgrindServer(RedisServer):
    """redis-server under valgrind's callgrind, which counts the instructions it executes:
    slow (tens of times), but the count does not depend on what else the machine runs."""

    def _launch(self, args: list[str], what: str, timeout_s: float) -> None:
        self.dump_prefix = self.dir / "callgrind.out"
        wrapped = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.dump_prefix}.%p"]
        super()._launch([*wrapped, *args], what, max(timeout_s, 120.0))

    def instructions(self, command: list[str]) -> int:
        """The instructions redis-server executes while `command` runs (callgrind: zero,
        run, dump)."""
        assert self.process is not None
        pid = str(self.process.pid)
        subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
        subprocess.run(command, check=True, capture_output=True)
        before = set(self.dir.glob("callgrind.out.*"))
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
        (dump,) = set(self.dir.glob("callgrind.out.*")) - before
        for line in dump.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no instruction total in {dump}")


def instructions(
    requests: int, only: Optional[list[str]] = None, before_ref: Optional[str] = None
) -> dict[str, Any]:
    """Each subject once (the count is deterministic, up to a fraction of a percent): the
    instructions redis-server executes per call, everything the call costs the server
    included (reading the command, EVALSHA, the script, the reply). The server runs tens
    of times slower, so one key's calls spread over seconds: work done once per second
    or per window (the sliding log's trim and expiry, a window's first counter) is done
    on more of the calls than at full speed (redis_calls_per_decision says how many)."""
    subjects, missing = all_subjects(before_ref)
    if only:
        subjects = [s for s in subjects if any(word in s.name for word in only)]
    server = CallgrindServer()
    server.start()
    results = []
    try:
        port = server.port
        for subject in subjects:
            sha = _load(port, subject)
            _cli(port, "FLUSHALL", "SYNC")
            _cli(port, "CONFIG", "RESETSTAT")
            command = benchmark_command(port, subject, sha, requests)
            per_call = server.instructions(command) / requests
            results.append(
                {
                    **described(subject),
                    "instructions_per_decision": _summary([per_call]),
                    "error_replies": _error_replies(port),
                    "redis_calls_per_decision": {
                        name: calls / requests
                        for name, calls in sorted(_command_calls(port).items())
                        if name not in ("info", "flushall", "evalsha")
                        and not name.startswith(("config|", "script|"))
                    },
                    "sample_reply": sample_reply(port, subject, sha),
                }
            )
    finally:
        server.close()
    return {
        "what": (
            f"redis-benchmark -c {CLIENTS} -P {PIPELINE} -n {requests} -r {IDENTITIES} EVALSHA "
            "per script on an empty keyspace, redis-server under valgrind --tool=callgrind: "
            "instructions executed per call"
        ),
        "requests": requests,
        "before_ref": before_ref,
        "missing_peers": missing,
        "subjects": results,
        "ratios": ratios(results, "instructions_per_decision"),
    }


@contextlib.contextmanager
def own_server() -> Iterator[int]:
    """A fresh redis-server on a free loopback port, for this section alone."""
    server = RedisServer().start()
    try:
        yield server.port
    finally:
        server.close()


def _ratio_line(ratio: dict[str, Any], unit: str) -> str:
    floor = ""
    if "floor_ratio" in ratio:
        least = ratio["floor_us"] if unit == "µs" else ratio["floor_instructions"]
        floor = (
            f"; spec floor {least:,.2f} {unit} = {ratio['floor_ratio']:.2f}x the"
            f" peer, moderato {ratio['over_floor']:.2f}x the floor"
        )
    return f"{ratio['algorithm']:<16} {ratio['ratio']:.2f}x  ({ratio['peer']}){floor}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000, help="calls per script and trial")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--only", help="comma-separated words: only subjects naming one")
    parser.add_argument("--output", type=Path, help="write the result as JSON here")
    parser.add_argument(
        "--before", metavar="REF", help="also each moderato script as at this git ref, same run"
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="instead: instructions per call under valgrind (callgrind), a load-proof figure",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: where each moderato script's server CPU goes (cumulative cuts)",
    )
    args = parser.parse_args()
    if args.profile:
        with own_server() as port:
            found = profile(port, args.requests, args.trials)
        for algorithm, data in found["scripts"].items():
            cuts = ", ".join(f"{cut} {us:.2f}" for cut, us in data["us_per_decision"].items())
            print(f"{algorithm:<16} µs/decision: {cuts}")
        if args.output:
            args.output.write_text(json.dumps(found, indent=1) + "\n")
        return
    only = [w.strip() for w in args.only.split(",")] if args.only else None
    if args.instructions:
        counted = instructions(args.requests, only, args.before)
        for subject in counted["subjects"]:
            per_call = subject["instructions_per_decision"]["median"]
            print(f"{subject['name']:<58} {per_call:>12,.0f} instructions/decision")
        for ratio in counted["ratios"]:
            print(_ratio_line(ratio, "instructions"))
        if args.output:
            args.output.write_text(json.dumps(counted, indent=1) + "\n")
        return
    with own_server() as port:
        result = run(port, args.requests, args.trials, only=only, before_ref=args.before)
    print(f"{'subject':<58} {'µs/decision':>12} {'ops/s':>10}  redis calls/decision")
    for subject in result["subjects"]:
        calls = ", ".join(f"{k} {v:.2f}" for k, v in subject["redis_calls_per_decision"].items())
        print(
            f"{subject['name']:<58} {subject['us_per_decision']['median']:>12.2f} "
            f"{subject['ops_per_s']['median']:>10,.0f}  {calls}"
            + (f"  ERRORS {subject['error_replies']}" if subject["error_replies"] else "")
        )
    for ratio in result["ratios"]:
        print(_ratio_line(ratio, "µs"))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
