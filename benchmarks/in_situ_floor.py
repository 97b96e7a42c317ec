"""The floor under issue 30's in-situ targets, measured in situ: the same asyncio
RateLimiter, the same 100 tasks, the same batched calls, with each call's script swapped
for one that does only its family's state commands (state_floor.py's sketches).

state_floor.py measures each family's state commands alone with ``redis-benchmark``,
whose C client keeps Redis busy on eight pipelined connections. The targets are taken
in situ, where one Python process's 100 tasks feed Redis one loop turn's calls at a
time and Redis waits between them: Redis's CPU per decision there holds what it spends
between calls (waking, reading, writing) as well as the calls themselves, so a floor
taken the other way is not a floor for them. This one is taken their way: a real
``RateLimiter`` with batching on checks over 1,000 identities (each check a random one,
as batch_in_situ.py), and in "floor" trials the client's batched form of the algorithm's
script (``moderato.scripts.batched_script``) is replaced before the limiter starts by a
script that reads the client's call layout (the part count, a first part in full, then
"K" parts of their own key and "=" repeats), runs the family's sketch over the parts'
keys (``state_floor.SPREAD``: its commands, its least math) and answers each part as
moderato's batched scripts do (five entries, or ``-1`` for the same decision as the part
before), so the client decodes it as ever. "moderato" trials run the shipped script in
the same harness; "off" trials the shipped script with batching off (a call a check),
one of the two befores of issue 30's checks/s target. With ``--before TREE`` (a checkout
of the build the issue started from, ``7d76950``, its extension built in place) "before"
trials run that tree's limiter, a call a check: the other before, the one the target
names ("today's, same run, before/after builds"). Each mode runs in a process of its own
(the client's batched forms are fixed once per process; a "before" child imports moderato
from TREE and says where it found it), the modes interleaved trial by trial (each trial
starting from the next mode) on one redis-server; medians of the trials.

With ``--hot`` every check is one hot identity's, and the floor's script is the family's
sketch of one key's run (``state_floor.HOT``: the state read once and written once, every
check of the call decided between), the target 0.1x the best peer.

For the sliding log and the buckets, "layout" trials swap in the sketch of the state
layout they keep (``state_floor.SPREAD["log as laid out"]``: its three commands, no entry
checked; ``["bucket as laid out"]``: the three fields read), beside the family's sketch,
which is cheaper than any log of unequal costs, or reads two fields where a bucket has
three.

With ``--with-peers`` the family's peers run as trials of their own ("peers": each peer
of peers_in_situ.py over one window, the one costing Redis least a decision taken), so
each row's target comes from this run; with ``--peers results/peers-in-situ-<time>.json``,
from that record. Either way each row is set against issue 30's target for it (the best
peer's Redis µs per decision times 0.2), and checks/s against the 1.5x target: with
``--before``, on ÷ the build before issue 30; the floor's checks/s likewise.

    flock /tmp/bench.lock .venv/bin/python benchmarks/in_situ_floor.py [--trials N]
        [--seconds S] [--algorithms ...] [--peers FILE | --with-peers] [--before TREE] [--hot]

Writes ``benchmarks/results/in-situ-floor-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
# A "before" trial's child imports moderato from the older tree, at once: the modules
# imported below put this tree first on the path again, and moderato's submodules come
# from wherever the package was found.
BEFORE_TREE = os.environ.get("IN_SITU_FLOOR_BEFORE_TREE")
if BEFORE_TREE:
    sys.path.insert(0, BEFORE_TREE)
    import moderato  # noqa: F401

import redis  # noqa: E402
from batch_floor import write_results  # noqa: E402
from batch_in_situ import RATE, server_meter  # noqa: E402
from batch_in_situ import trial as batch_trial  # noqa: E402
from in_situ import in_situ_options  # noqa: E402
from redis_servers import RedisServer  # noqa: E402
from state_floor import FAMILIES, HOT, SPREAD, TARGET_FACTOR, best_peer_us  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.scripts import Script  # noqa: E402

MODES = ("off", "moderato", "floor")
WITH_BEFORE = ("before", *MODES)
# Each algorithm's family sketch (its first in state_floor.FAMILIES), and for the sliding
# log and the buckets also the sketch of the state layout they keep ("layout" trials): the
# count sketch is cheaper than any log that admits checks of unequal costs, the hash
# sketch reads two fields where a bucket's layout has three.
SHAPE_OF: dict[str, str] = {}
for _shape, _names in FAMILIES.items():
    for _name in _names:
        SHAPE_OF.setdefault(_name, _shape)
# The rows' ratios of one mode's median to another's (where both ran): Redis time a
# decision against a floor, checks/s against a before.
RATIOS = {
    "moderato_over_floor": ("moderato", "floor", "redis_us_per_decision"),
    "moderato_over_layout": ("moderato", "layout", "redis_us_per_decision"),
    **{
        f"{top}_checks_per_s_over_{bottom}": (top, bottom, "checks_per_s")
        for bottom in ("off", "before")
        for top in ("moderato", "floor", "layout", "off")
        if top != bottom
    },
}
LAID_OUT = {
    "sliding_log": "log as laid out",
    "token_bucket": "bucket as laid out",
    "leaky_bucket": "bucket as laid out",
}

# The client's call layout read into the keys of its parts, and the policy's integers as
# state_floor.HEAD names them (from the first part, sent in full: its key count, its
# argument count, then cost, "1", capacity, window in seconds, ...). A part marked "K"
# brings its own key, "=" repeats the part before; a cost of its own ("C", "KC") or a
# part in full after the first do not come from this benchmark's checks (one policy,
# one cost), and are refused. Then the reply: per part five entries (allowed, deciding,
# remaining, retry, reset), or -1 for a decision the same as the part before's.
FLOOR_HEAD = """
local time = redis.call('TIME')
local now_ms = time[1] * 1000 + math.floor(time[2] / 1000)
local format = string.format -- the sketches send every number as '%d' text
local part_count = tonumber(ARGV[1])
local key_count, arg_count = tonumber(ARGV[2]), tonumber(ARGV[3])
if key_count ~= 1 then
  return redis.error_reply('floor: the first part must have one key')
end
local cost_scaled, capacity_scaled = tonumber(ARGV[4]), tonumber(ARGV[6])
local window_ms = tonumber(ARGV[7]) * 1000
local part_keys, at, key_at = {KEYS[1]}, 4 + arg_count, 1
for part = 2, part_count do
  local head = ARGV[at]
  if head == 'K' then
    key_at = key_at + 1
  elseif head ~= '=' then
    return redis.error_reply('floor: part ' .. part .. ' is neither "K" nor "="')
  end
  part_keys[part] = KEYS[key_at]
  at = at + 1
end
local KEYS = part_keys
local reply, at = {}, 0
local before_remaining, before_reset_ms
local function answer(allowed, remaining_scaled, retry_ms, reset_ms)
  if remaining_scaled == before_remaining and reset_ms == before_reset_ms then
    reply[at + 1] = -1
    at = at + 1
  else
    reply[at + 1], reply[at + 2], reply[at + 3] = 5, allowed, 0
    reply[at + 4], reply[at + 5], reply[at + 6] = remaining_scaled, retry_ms, reset_ms
    at = at + 6
    before_remaining, before_reset_ms = remaining_scaled, reset_ms
  end
end
"""


def floor_script(algorithm: str, shape: str | None = None, hot: bool = False) -> Script:
    """The batched form's stand-in for ``algorithm``: its family's state commands alone
    (``shape``'s sketch: by default its family's). ``hot``: the sketch of one key's run
    (state_floor.HOT: read once, written once) over the call's parts, whose keys are one
    hot identity's."""
    shape = shape or SHAPE_OF[algorithm]
    body = HOT[shape].replace("tonumber(ARGV[4])", "part_count") if hot else SPREAD[shape]
    source = (FLOOR_HEAD + body + "return reply\n").encode()
    name = f"floor({algorithm}, {shape}{', hot' if hot else ''})"
    return Script(name, source, hashlib.sha1(source).hexdigest())


async def peers_trial(port: int, algorithm: str, hot: bool, seconds: float) -> dict[str, Any]:
    """The family's peers (peers_in_situ.py's subjects and trial), each over one window:
    the figures of the one costing Redis least a decision, and each peer's."""
    from peers_in_situ import limits_subjects, throttled_subjects
    from peers_in_situ import trial as peer_trial

    admin = redis.Redis(port=port)
    figures: dict[str, tuple[float, float]] = {}
    for subject in limits_subjects(port, algorithm) + throttled_subjects(port, algorithm):
        figures[subject.name] = await peer_trial(subject, admin, hot, seconds)
        await subject.close()
    best = min(figures, key=lambda name: figures[name][0])
    return {
        "redis_us_per_decision": figures[best][0],
        "checks_per_s": figures[best][1],
        "checks_per_call": 1.0,
        "best_peer": best,
        "peers_us": {name: us for name, (us, _) in figures.items()},
    }


async def child_trial(
    url: str, port: int, mode: str, algorithm: str, hot: bool, seconds: float
) -> None:
    if mode == "peers":
        import moderato

        measured = await peers_trial(port, algorithm, hot, seconds)
        print(json.dumps({**measured, "moderato_from": str(Path(moderato.__file__).parent)}))
        return
    if mode in ("floor", "layout"):
        import moderato.scripts

        # Before the client first asks for its batched forms (moderato.redis.grouping
        # keeps them for the process).
        def batched_stand_in(algorithm: str) -> Script:
            # "layout": the sketch of the layout the algorithm keeps (its family's, for an
            # algorithm with none of its own).
            shape = LAID_OUT.get(algorithm) if mode == "layout" else None
            return floor_script(algorithm, shape, hot)

        moderato.scripts.batched_script = batched_stand_in  # type: ignore[assignment]
    import moderato
    from moderato import RateLimiter

    limiter = RateLimiter(url, key_prefix=mode, command_timeout_s=10.0)
    if mode != "before":  # the older tree's client has no batching to turn off
        limiter._backend.client.batch_decisions = mode != "off"  # type: ignore[attr-defined]
    await limiter.check_with_info("warm-up", RATE, algorithm=algorithm)
    # batch_in_situ.py's trial: the same window, meter and measures.
    meter = server_meter(redis.Redis(port=port))
    measures = await batch_trial(limiter, meter, algorithm, hot, seconds, RATE)
    await limiter.close()
    print(json.dumps({**measures, "moderato_from": str(Path(moderato.__file__).parent)}))


def trial(
    url: str,
    port: int,
    mode: str,
    algorithm: str,
    hot: bool,
    seconds: float,
    before: Path | None,
) -> dict[str, Any]:
    """One trial of ``mode`` in a process of its own: its measures."""
    environment = dict(os.environ)
    environment.pop("IN_SITU_FLOOR_BEFORE_TREE", None)
    if mode == "before":
        assert before is not None
        environment["IN_SITU_FLOOR_BEFORE_TREE"] = str(before)
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            algorithm,
            url,
            str(port),
            "hot" if hot else "many",
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=environment,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {mode} trial of {algorithm} failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = (before if mode == "before" else ROOT).resolve() / "moderato"
    if Path(result.pop("moderato_from")).resolve() != expected:
        raise SystemExit(f"the {mode} trial imported moderato from elsewhere than {expected}")
    measures: dict[str, Any] = result
    return measures


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        mode, algorithm, url, port, where, seconds = sys.argv[2:8]
        asyncio.run(child_trial(url, int(port), mode, algorithm, where == "hot", float(seconds)))
        return
    parser = in_situ_options(__doc__, ALGORITHMS)
    parser.add_argument("--peers", type=Path, help="a peers_in_situ.py raw record")
    parser.add_argument(
        "--hot", action="store_true", help="one hot identity (else 1,000 identities)"
    )
    parser.add_argument(
        "--with-peers",
        action="store_true",
        help="the family's peers as trials of this run (the target from them)",
    )
    parser.add_argument(
        "--before", type=Path, help="a checkout of the build before issue 30, built in place"
    )
    options: argparse.Namespace = parser.parse_args()
    modes = (
        *(WITH_BEFORE if options.before else MODES),
        *(("peers",) if options.with_peers else ()),
    )
    best = best_peer_us(json.loads(options.peers.read_text())) if options.peers else {}
    server = RedisServer().start()
    rows: list[dict[str, Any]] = []
    try:
        where = "hot" if options.hot else "1,000 identities"  # TARGET_FACTOR's keys
        for algorithm in options.algorithms:
            these = (*modes, "layout") if algorithm in LAID_OUT else modes
            samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in these}
            for number in range(options.trials):
                # Each trial starts from the next mode, so none always follows another.
                first = number % len(these)
                for mode in these[first:] + these[:first]:
                    samples[mode].append(
                        trial(
                            server.url,
                            server.port,
                            mode,
                            algorithm,
                            options.hot,
                            options.seconds,
                            options.before,
                        )
                    )
            row: dict[str, Any] = {"algorithm": algorithm, "identities": where}
            for mode, trials in samples.items():
                for field in ("checks_per_s", "redis_us_per_decision", "checks_per_call"):
                    row[f"{mode}_{field}"] = statistics.median(t[field] for t in trials)
                row[f"{mode}_trials"] = trials
            for name, (top, bottom, field) in RATIOS.items():
                if top in samples and bottom in samples:
                    row[name] = row[f"{top}_{field}"] / row[f"{bottom}_{field}"]
            peer_us = best.get((algorithm, where))
            if "peers" in samples:
                # This run's best peer: its median over the trials (each trial's best).
                peer_us = row["peers_redis_us_per_decision"]
                row["best_peers"] = [t["best_peer"] for t in samples["peers"]]
            row["target_us"] = peer_us * TARGET_FACTOR[where] if peer_us is not None else None
            row["moderato_over_best_peer"] = (
                row["moderato_redis_us_per_decision"] / peer_us if peer_us is not None else None
            )
            rows.append(row)
            verdict = ""
            if row["target_us"] is not None:
                stopped = row["floor_redis_us_per_decision"] > row["target_us"]
                verdict = (
                    f"; target {row['target_us']:.2f} "
                    + ("(under the floor)" if stopped else "(above the floor)")
                    + f", moderato {row['moderato_over_best_peer']:.2f}x the best peer"
                )
            print(
                f"{algorithm:<15} Redis us/decision: moderato "
                f"{row['moderato_redis_us_per_decision']:.2f}, floor "
                f"{row['floor_redis_us_per_decision']:.2f} "
                f"({row['moderato_over_floor']:.2f}x){verdict}; checks/s off "
                f"{row['off_checks_per_s']:,.0f}, moderato {row['moderato_checks_per_s']:,.0f} "
                f"({row['moderato_checks_per_s_over_off']:.2f}x), floor "
                f"{row['floor_checks_per_s']:,.0f} ({row['floor_checks_per_s_over_off']:.2f}x); "
                f"checks/call {row['moderato_checks_per_call']:.1f} / "
                f"{row['floor_checks_per_call']:.1f}"
                + (
                    f"; before {row['before_checks_per_s']:,.0f}/s, moderato on ÷ before "
                    f"{row['moderato_checks_per_s_over_before']:.2f}x, off ÷ before "
                    f"{row['off_checks_per_s_over_before']:.2f}x, floor ÷ before "
                    f"{row['floor_checks_per_s_over_before']:.2f}x"
                    if options.before
                    else ""
                ),
                flush=True,
            )
            if "layout" in samples:
                print(
                    f"{'':<15} the layout's floor ({LAID_OUT[algorithm]}): Redis us/decision "
                    f"{row['layout_redis_us_per_decision']:.2f} (moderato "
                    f"{row['moderato_over_layout']:.2f}x); checks/s "
                    f"{row['layout_checks_per_s']:,.0f} "
                    f"({row['layout_checks_per_s_over_off']:.2f}x off"
                    + (
                        f", {row['layout_checks_per_s_over_before']:.2f}x before"
                        if options.before
                        else ""
                    )
                    + ")",
                    flush=True,
                )
    finally:
        server.close()
    path = write_results(
        "in_situ_floor",
        {**vars(options), "peers": str(options.peers or ""), "before": str(options.before or "")},
        rows,
    )
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
