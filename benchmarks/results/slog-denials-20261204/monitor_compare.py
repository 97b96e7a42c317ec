"""MONITOR-compare the sliding log script alone, tree A (main) against tree B (the branch),
on random histories (40 checks each, some on odd logs): the same replies, log and PEXPIRETIME,
the same writes, and B's commands a subsequence of A's.

    python monitor_compare.py HISTORIES TREE_A TREE_B
"""

import json
import random
import sys
import time

sys.path.insert(0, sys.argv[3] + "/tests")
import redis
from redis_servers import RedisServer

TIME_LINE = b"local time = redis.call('TIME')"
CLOCK_LINE = (
    b"local time = (function() local clock_ms = tonumber(redis.call('GET', 'clock')) "
    b"return { math.floor(clock_ms / 1000), (clock_ms % 1000) * 1000 } end)()"
)


def source(tree):
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from moderato.scripts import load_script; "
            "sys.stdout.buffer.write(load_script('sliding_log').source)",
            tree,
        ],
        capture_output=True,
        check=True,
    ).stdout
    assert out.count(TIME_LINE) == 1
    return out.replace(TIME_LINE, CLOCK_LINE)


def history(tree, seed):
    src = source(tree)
    s = RedisServer().start()
    try:
        r = redis.Redis(port=s.port)
        sha = r.script_load(src)
        lines = []
        mon = redis.Redis(port=s.port).monitor()
        m = mon.__enter__()
        rng = random.Random(seed)
        t = (int(time.time() * 1000) // 86_400_000 + 2) * 86_400_000
        replies = []
        key = "{k}"
        if rng.random() < 0.3:  # odd state
            ents = []
            tot = 0
            for _ in range(rng.randrange(1, 30)):
                c = rng.choice((1000, 3000))
                tot += c
                mem = f"{tot:016d}:{c}" if rng.random() > 0.1 else f"{tot - 5000:016d}:{c}"
                ents += [t - rng.randrange(0, 70_000), mem]
            r.zadd(key + ":log", dict(zip(ents[1::2], ents[0::2])))
        for _ in range(40):
            t += rng.choice((0, 0, 1, 10, 300, 1500, 20_000))
            r.set("clock", t)
            cap = rng.choice((5, 10, 10, 30)) * 1000
            cost = rng.choice((1000, 1000, 2000, 7000, 0))
            apply = 1 if cost else rng.choice((0, 1))
            try:
                replies.append(r.evalsha(sha, 1, key, cost, apply, cap, 60))
            except redis.ResponseError as e:
                replies.append(str(e))
        state = (r.zrange(key + ":log", 0, -1, withscores=True), r.pexpiretime(key + ":log"))
        r.set("done", 1)
        for cmd in m.listen():
            c = cmd["command"]
            if c.startswith("SET done"):
                break
            if cmd.get("client_type") == "lua" or "lua" in str(cmd.get("client_address", "")):
                lines.append(c)
        return replies, state, lines
    finally:
        s.close()


tot = {"main": 0, "branch": 0}
for seed in range(int(sys.argv[1])):
    a = history(sys.argv[2], seed)
    b = history(sys.argv[3], seed)
    assert a[0] == b[0], (seed, "replies")
    assert a[1] == b[1], (seed, "state")
    wa = [c for c in a[2] if not c.startswith(("ZRANGE", "ZCOUNT", "ZCARD", "GET"))]
    wb = [c for c in b[2] if not c.startswith(("ZRANGE", "ZCOUNT", "ZCARD", "GET"))]
    assert wa == wb, (seed, "writes")
    it = iter(a[2])
    assert all(any(x == y for y in it) for x in b[2]), (seed, "not a subsequence")
    tot["main"] += len(a[2])
    tot["branch"] += len(b[2])
print(
    json.dumps(
        {
            "histories": int(sys.argv[1]),
            "script commands": tot,
            "replies, state, writes": "identical",
        }
    )
)
