"""Redis instructions per batched call of sliding-log denials, counted by callgrind
(``--toggle-collect=luaCallFunction``: the script calls only), for one tree's scripts:
every check denied, on one log or each check on its own log, the log holding one entry
(limit 1) or 1,000 (limit 1,000, the entries' costs alike, spread over the last 30 s).

    python denial_instructions.py <tree>
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
import redis  # noqa: E402
from redis_servers import free_port  # noqa: E402

from moderato.scripts import batched_script  # noqa: E402

try:  # the compact layout (main after c147726): the client's encoder and the flat reply
    from moderato.redis.grouping import batch_layout, split_reply
except ImportError:  # c45bd8a and before: per part its key count, argument count, arguments
    batch_layout = split_reply = None

CALLS = 20


def instructions(parts, entries, own_logs):
    port = free_port()
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "callgrind.out")
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                "--toggle-collect=luaCallFunction",
                "redis-server",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        r = redis.Redis(port=port)
        for _ in range(200):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        sha = r.script_load(batched_script("sliding_log").source)
        keys = [f"{{k{part if own_logs else 0}}}" for part in range(parts)]
        now = int(time.time() * 1000)
        for key in set(keys):
            members = {
                f"{(i + 1) * 1000:016d}:1000": now - 30_000 + i * 25_000 // entries
                for i in range(entries)
            }
            r.zadd(key + ":log", members)
        args = [1000, 1, entries * 1000, 60]
        if batch_layout:
            keys, argv = batch_layout([([key], args) for key in keys])
        else:
            argv = [parts]
            for _ in range(parts):
                argv += [1, len(args), *args]
        for _ in range(CALLS):
            reply = r.evalsha(sha, len(keys), *keys, *argv)
            if split_reply:
                reply = split_reply(reply, parts)
            assert all(decided[0] == 0 for decided in reply), reply
        r.shutdown(nosave=True)
        server.wait()
        text = Path(out).read_text()
    total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    return int(total.group(1)) // CALLS


figures = {}
for entries in (1, 1000):
    for parts in (1, 8, 16):
        figures[f"one log of {entries}, {parts} checks"] = instructions(parts, entries, False)
    figures[f"8 logs of {entries}, 8 checks"] = instructions(8, entries, True)
print(json.dumps(figures, indent=1))
