"""Redis instructions per batched call of sliding-log denials, counted by callgrind
(benchmarks/batch_instructions.py's ``counted``: the script calls only), for one tree's
scripts: every check denied, on one log or each check on its own log, the log holding one
entry (limit 1) or 1,000 (limit 1,000, the entries' costs alike, spread over the last
30 s; its ZADDs are not script calls, so not counted).

    python denial_instructions.py <tree>
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from batch_instructions import counted  # noqa: E402

from moderato.scripts import batched_script  # noqa: E402

try:  # the compact layout (main after c147726): the client's encoder
    from moderato.redis.grouping import batch_layout
except ImportError:  # c45bd8a and before: per part its key count, argument count, arguments
    batch_layout = None

CALLS = 20


def instructions(parts, entries, own_logs):
    keys = [f"{{k{part if own_logs else 0}}}" for part in range(parts)]
    now = int(time.time() * 1000)
    calls = []
    for key in sorted(set(keys)):
        members = []
        for i in range(entries):
            members += [now - 30_000 + i * 25_000 // entries, f"{(i + 1) * 1000:016d}:1000"]
        calls.append(["ZADD", key + ":log", *members])
    args = [1000, 1, entries * 1000, 60]
    if batch_layout:
        keys, argv = batch_layout([([key], args) for key in keys])
    else:
        argv = [parts]
        for _ in range(parts):
            argv += [1, len(args), *args]
    sha = batched_script("sliding_log").sha
    calls += [["EVALSHA", sha, len(keys), *keys, *argv]] * CALLS
    return counted(["sliding_log"], calls) // CALLS


figures = {}
for entries in (1, 1000):
    for parts in (1, 8, 16):
        figures[f"one log of {entries}, {parts} checks"] = instructions(parts, entries, False)
    figures[f"8 logs of {entries}, 8 checks"] = instructions(8, entries, True)
print(json.dumps(figures, indent=1))
