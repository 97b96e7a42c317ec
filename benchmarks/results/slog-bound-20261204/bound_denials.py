"""The sliding log's bound: Redis µs per batched call of 8 and 16 checks, every check admitted
(batch_bound.run) or every check denied on a full log of 1,000 or 100,000 entries.

    python bound_denials.py <tree>
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import redis  # noqa: E402
from batch_bound import run  # noqa: E402
from redis_servers import RedisServer  # noqa: E402

from moderato.scripts import batched_script  # noqa: E402


def denials(parts, entries, calls=100):
    server = RedisServer().start()
    try:
        r = redis.Redis(port=server.port)
        sha = r.script_load(batched_script("sliding_log").source)
        key = "{k}:p0"
        now = int(time.time() * 1000)
        pipe = r.pipeline(transaction=False)
        for start in range(0, entries, 1000):
            args = []
            for i in range(start, min(entries, start + 1000)):
                args += [now - 30_000 + i * 25_000 // entries, f"{(i + 1) * 1000:016d}:1000"]
            pipe.execute_command("ZADD", key + ":log", *args)
        pipe.execute()
        args = [1000, 1, entries * 1000, 60]
        argv = [parts]
        for _ in range(parts):
            argv += [1, len(args), *args]
        r.config_resetstat()
        for _ in range(calls):
            reply = r.evalsha(sha, parts, *([key] * parts), *argv)
        assert reply[0][0] == 0, reply[0]
        return float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    finally:
        server.close()


out = {}
for parts in (8, 16):
    out[f"admitted, {parts} checks"] = run("sliding_log", 1, parts)
    for entries in (1000, 100_000):
        out[f"denied on a full log of {entries}, {parts} checks"] = denials(parts, entries)
print(json.dumps(out, indent=1))
