"""Python and C calls per request of two end-to-end apps, and which the second makes more.

Drives each app of benchmarks/apps/ through ``app_cpu.py``'s in-process driver
(``--concurrency`` requests in flight, a private redis-server, on uvloop when
installed, as there) under
``sys.setprofile`` and counts each function's calls over the measured requests:
a Python function's ``call`` events (a coroutine's every resumption is one: it
costs about what a call does) and each C function's. Prints the totals per
request and, function by function, the second app's count less the first's.
``--opcodes`` counts bytecodes executed per Python function instead
(``sys.settrace`` with ``f_trace_opcodes``): what a call's body costs.

    python benchmarks/app_calls.py floor_moderato_client moderato_decorator
    python benchmarks/app_calls.py --opcodes floor_moderato_client moderato_decorator
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from benchmarks.app_cpu import Driver, run  # noqa: E402


def _name(frame: FrameType, event: str, arg: Any) -> str:
    if event == "c_call":
        owner = getattr(arg, "__self__", None)
        if owner is not None and not isinstance(owner, type(sys)):
            return f"C:{type(owner).__name__}.{arg.__name__}"
        return f"C:{arg.__name__}"
    code = frame.f_code
    path = code.co_filename
    for base in (str(ROOT) + os.sep, *(p + os.sep for p in sys.path if p.endswith("-packages"))):
        if path.startswith(base):
            path = path[len(base) :]
            break
    else:
        path = os.path.basename(path)
    return f"{path}:{code.co_name}"


async def counted(module: str, requests: int, concurrency: int, opcodes: bool) -> Counter[str]:
    driver = Driver(module, "allowed")
    await driver.start()
    await driver.run(max(requests // 4, concurrency), concurrency)  # warm-up
    counts: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            counts[_name(frame, event, arg)] += 1

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        name = _name(frame, event, arg)

        def each(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[name] += 1
            return each

        return each

    if opcodes:
        sys.settrace(trace)
    else:
        sys.setprofile(profile)
    try:
        await driver.run(requests, concurrency)
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    await driver.stop()
    if driver.statuses.get(200, 0) < requests:
        raise RuntimeError(f"{module}: statuses {driver.statuses}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("first", help="the app compared against (e.g. floor_moderato_client)")
    parser.add_argument("second", help="the app whose extra calls are listed")
    parser.add_argument("--requests", type=int, default=320)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--opcodes", action="store_true", help="bytecodes, not calls")
    args = parser.parse_args()
    from redis_servers import RedisServer

    server = RedisServer().start()
    os.environ["MODERATO_BENCH_REDIS_URL"] = server.url
    # Traced, the app runs many times slower than Redis answers (as under callgrind).
    os.environ.setdefault("MODERATO_BENCH_TIMEOUT_S", "60")
    try:
        first = run(counted(args.first, args.requests, args.concurrency, args.opcodes))
        second = run(counted(args.second, args.requests, args.concurrency, args.opcodes))
    finally:
        server.close()
    n = args.requests

    def python(counts: Counter[str]) -> float:
        return sum(v for k, v in counts.items() if not k.startswith("C:")) / n

    if args.opcodes:
        print(
            f"bytecodes per request: {args.first} {python(first):.1f}, "
            f"{args.second} {python(second):.1f}"
        )
    else:
        print(
            f"calls per request: {args.first} {sum(first.values()) / n:.1f}, "
            f"{args.second} {sum(second.values()) / n:.1f} "
            f"(python: {python(first):.1f} vs {python(second):.1f})"
        )
    differences = {name: (second[name] - first[name]) / n for name in {*first, *second}}
    for name, difference in sorted(differences.items(), key=lambda item: (-item[1], item[0])):
        if abs(difference) >= 0.005:
            print(f"{difference:+7.2f}  {name}")


if __name__ == "__main__":
    main()
