"""Where the time goes: py-spy profiles of the benchmark's hot paths, summarised.

Each target runs one workload of benchmarks/performance.py under
``py-spy record`` (sampling the busy CPU time of the process, idle waits
excluded), keeps the collapsed stacks under benchmarks/profiles/ (gzipped: gunzip and
open them in speedscope or flamegraph.pl), and prints the functions with the most self time and
the largest inclusive shares.

    python benchmarks/hotspots.py e2e --app moderato_decorator --path allowed
    python benchmarks/hotspots.py limiter --algorithm token_bucket --tasks 100
    python benchmarks/hotspots.py memory --algorithm fixed_window

``e2e`` samples the uvicorn process while wrk loads it; ``limiter`` and
``memory`` sample a child process running the limiter-only / in-process loop.
py-spy comes with the ``bench`` extra (``pip install py-spy``); it needs the
right to ptrace the child (root, or kernel.yama.ptrace_scope = 0).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from redis_servers import RedisServer  # noqa: E402

from benchmarks import performance  # noqa: E402

PROFILES = ROOT / "benchmarks" / "profiles"
FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")

# The child process of the ``limiter`` and ``memory`` targets.
LOOP = """
import asyncio, sys, time
sys.path.insert(0, {root!r})
from moderato import RateLimiter
from benchmarks.subjects import RATE

async def main():
    limiter = RateLimiter({url!r}, key_prefix="bench-profile")
    await limiter.connect()
    keys = [f"id{{n}}" for n in range(1000)]
    deadline = time.perf_counter() + {seconds}
    async def worker(start):
        index = start
        while time.perf_counter() < deadline:
            await limiter.check_with_info(keys[index % 1000], RATE, algorithm={algorithm!r})
            index += {tasks}
    await asyncio.gather(*(worker(n) for n in range({tasks})))
    await limiter.close()

asyncio.run(main())
"""


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy (or the bench extra)")
    return found


def record(target: list[str], seconds: float, name: str, native: bool) -> Path:
    """Collapsed stacks (flamegraph.pl / speedscope input) of ``target`` for ``seconds``."""
    PROFILES.mkdir(parents=True, exist_ok=True)
    raw = PROFILES / f"{name}.txt"
    command = [py_spy(), "record", "--rate", "250", "--duration", str(int(seconds))]
    if native:
        command.append("--native")
    command += ["--format", "raw", "--output", str(raw), *target]
    subprocess.run(command, check=True, capture_output=True)
    # Native stacks run to a megabyte of text: keep them gzipped (gunzip for speedscope).
    packed = raw.with_name(raw.name + ".gz")
    packed.write_bytes(gzip.compress(raw.read_bytes()))
    raw.unlink()
    return packed


def read_stacks(raw: Path) -> list[str]:
    data = raw.read_bytes()
    if raw.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode().splitlines()


def summarise(raw: Path, top: int, focus: str) -> str:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in read_stacks(raw):
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [_short(frame) for frame in stack.split(";")]
        self_time[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples of busy CPU ({raw.resolve().relative_to(ROOT)})", "", "self time:"]
    for frame, count in self_time.most_common(top):
        lines.append(f"  {count / total:6.1%}  {frame}")
    lines += ["", "inclusive (the function and everything it calls):"]
    for frame, count in inclusive.most_common(top):
        lines.append(f"  {count / total:6.1%}  {frame}")
    if focus:
        lines += ["", f"inclusive, frames in {focus!r} only:"]
        focused = [(frame, count) for frame, count in inclusive.most_common() if focus in frame]
        for frame, count in focused[:top]:
            lines.append(f"  {count / total:6.1%}  {frame}")
    return "\n".join(lines)


# moderato frames that wrap the application: time below them is the app's,
# unless nothing but native code is below them.
WRAPPERS = {
    "RateLimitHeadersMiddleware.__call__",
    "RateLimitMiddleware.__call__",
    "serve",
    "serve.<locals>.send_with_headers",
    "_wrap.<locals>.limited",
}


def breakdown(raw: Path) -> str:
    """Busy CPU split into garbage collection, moderato's layers and everything else.

    A sample goes to the garbage collector if it is collecting; else to the
    innermost moderato frame on its stack: the core check
    (``RateLimiter.check_with_info`` and below), the Redis client's callbacks
    run by the loop (``moderato/redis/``), or the HTTP layer
    (``moderato/integrations/``: rule, identity, scope, headers). A wrapper
    frame (middleware ``serve``, the decorator's ``limited``) counts only when
    no Python frame of the application is below it.
    """
    shares: Counter[str] = Counter()
    total = 0
    for line in read_stacks(raw):
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        shares[_category(frames)] += count
    lines = [f"breakdown of {total} samples:"]
    for category, count in shares.most_common():
        lines.append(f"  {count / total:6.1%}  {category}")
    return "\n".join(lines)


def _category(frames: list[str]) -> str:
    if any("gc_collect" in frame for frame in frames):
        return "garbage collection"
    if any("RateLimiter.check_with_info" in frame for frame in frames):
        return "moderato: the check (RateLimiter.check_with_info and below)"
    for depth in range(len(frames) - 1, -1, -1):
        match = FRAME.match(frames[depth].strip())
        if not match or "moderato/" not in match["file"]:
            continue
        function = match["function"]
        if function in WRAPPERS:
            below = [FRAME.match(f.strip()) for f in frames[depth + 1 :]]
            if any(m and m["file"].endswith(".py") for m in below):
                return "application, framework and server"
        if "moderato/redis/" in match["file"]:
            return "moderato: Redis client callbacks (replies, flushes)"
        return "moderato: HTTP layer (rule, identity, scope, headers)"
    return "application, framework and server"


def _short(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/work/main/", str(ROOT) + "/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{match['function']} ({path})"


def profile_e2e(args: argparse.Namespace) -> Path:
    server = RedisServer().start()
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"moderato-profile-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    app = performance.start_app(args.app, args.app, server.url, log_dir)
    try:
        performance.wait_ready(app)
        for _ in range(20):
            performance.http_status(f"{app.base}/{args.path}")
        wrk = subprocess.Popen(
            [
                "wrk", "-t", "1", "-c", str(performance.WRK_CONNECTIONS),
                "-d", f"{int(args.seconds) + 2}s", f"{app.base}/{args.path}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        time.sleep(0.5)
        name = f"e2e-{args.app}-{args.path}{'-native' if args.native else ''}"
        raw = record(["--pid", str(app.process.pid)], args.seconds, name, args.native)
        output, _ = wrk.communicate(timeout=60)
        print(output)
        return raw
    finally:
        app.process.terminate()
        app.process.wait(timeout=10)
        server.close()
        shutil.rmtree(log_dir, ignore_errors=True)


def profile_loop(args: argparse.Namespace, url: str, label: str) -> Path:
    code = LOOP.format(
        root=str(ROOT),
        url=url,
        seconds=args.seconds + 1,
        algorithm=args.algorithm,
        tasks=args.tasks,
    )
    name = f"{label}-{args.algorithm}-{args.tasks}t{'-native' if args.native else ''}"
    return record(["--", sys.executable, "-c", code], args.seconds, name, args.native)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("target", choices=("e2e", "limiter", "memory"))
    parser.add_argument("--app", default="moderato_decorator", help="module under benchmarks/apps")
    parser.add_argument("--path", default="allowed", choices=("allowed", "limited"))
    parser.add_argument("--algorithm", default="token_bucket")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--native", action="store_true", help="include C frames (slower)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--focus", default="moderato/", help="also list inclusive shares of frames matching this"
    )
    args = parser.parse_args()
    if args.target == "e2e":
        raw = profile_e2e(args)
    elif args.target == "memory":
        raw = profile_loop(args, "memory://", "memory")
    else:
        server = RedisServer().start()
        try:
            raw = profile_loop(args, server.url, "limiter")
        finally:
            server.close()
    summary = summarise(raw, args.top, args.focus) + "\n\n" + breakdown(raw)
    Path(str(raw).replace(".txt.gz", ".summary.txt")).write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
