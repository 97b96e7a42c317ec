"""What stops issue 31's sequential target (b): the bare client with each of the
guarantees moderato's check keeps, one at a time, against the bare client itself.

One task, sequential checks, every subject on its own connection to one private
redis-server (loopback TCP, as performance.py's sequential section), alternated in
short slices in rotating order (the median of per-rotation ratios, as that
section takes it):

    bare            performance.py's bare asyncio client (subjects.bare_client):
                    the EVALSHA written at once, hiredis, one future per command
    bare+turn       the same, but the write left to a loop.call_soon callback:
                    one write per loop turn for every command of the turn, what
                    moderato's pipelining keeps (one asyncio Handle per turn)
    bare+result     the bare client, then the CheckResult built from the reply
                    (moderato's _accel.check_result), what the limiter returns
    bare+both       both of the above: the floor of any client that pipelines
                    per loop turn and returns moderato's result
    moderato        RateLimiter.check_with_info (token bucket), as performance.py

    python benchmarks/sequential_floor.py [--rotations 60] [--slice-s 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from redis_servers import RedisServer  # noqa: E402

from benchmarks.performance import load_average, measure  # noqa: E402
from benchmarks.subjects import RATE, Opened, bare_client  # noqa: E402
from moderato import RateLimiter, _accel  # noqa: E402
from moderato.algorithms import ALGORITHMS  # noqa: E402
from moderato.policy import policy_for  # noqa: E402
from moderato.scripts import load_script  # noqa: E402

IDENTITIES = 1000


async def bare_variant(port: int, *, per_turn: bool, result: bool) -> Opened:
    """The bare client, its write deferred to the turn's end and/or its reply decoded."""
    chosen = ALGORITHMS["token_bucket"]
    policy = policy_for(RATE)
    script = load_script(chosen.name)
    args = (1000, 1, *chosen.policy_args(policy.rates[0]))
    loop = asyncio.get_running_loop()
    transport, send = await bare_client(
        lambda protocol: loop.create_connection(protocol, "127.0.0.1", port),
        script.source,
        per_turn=per_turn,
    )
    limiter = RateLimiter("memory://")
    shape = limiter.plan_for(RATE, algorithm="token_bucket").result_shape
    check_result = _accel.check_result

    def check(key: str) -> Awaitable[Any]:
        keys = _accel.build_keys("bench-floor", chosen.key_tag, "", "global", key, (60,))
        future = send(_accel.encode_evalsha(script.sha, keys, args))
        if not result:
            return future  # type: ignore[no-any-return]
        return _decoded(future, check_result, shape)

    async def close() -> None:
        transport.close()

    return Opened(check, lambda reply: True, close)


async def _decoded(future: Awaitable[Any], check_result: Callable[..., Any], shape: Any) -> Any:
    return check_result(await future, shape)


async def moderato_subject(url: str) -> Opened:
    limiter = RateLimiter(url, key_prefix="bench-floor-lo", connect_timeout_s=5.0)
    await limiter.connect()
    check_with_info = limiter.check_with_info

    def check(key: str) -> Awaitable[Any]:
        return check_with_info(key, RATE, algorithm="token_bucket")

    return Opened(check, lambda result: True, limiter.close)


async def run(port: int, rotations: int, slice_s: float, ramp_s: float) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{port}"
    subjects: dict[str, Opened] = {
        "bare": await bare_variant(port, per_turn=False, result=False),
        "bare+turn": await bare_variant(port, per_turn=True, result=False),
        "bare+result": await bare_variant(port, per_turn=False, result=True),
        "bare+both": await bare_variant(port, per_turn=True, result=True),
        "moderato": await moderato_subject(url),
    }
    keys = [f"id{n}" for n in range(IDENTITIES)]
    names = list(subjects)
    for name in names:
        await measure(subjects[name], 1, 0.1, 0.05, keys)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for rotation in range(rotations):
        order = names[rotation % len(names) :] + names[: rotation % len(names)]
        if rotation % 2:
            order.reverse()
        for name in order:
            taken = await measure(subjects[name], 1, slice_s, ramp_s, keys)
            rates[name].append(taken["checks_per_s"])
    for opened in subjects.values():
        await opened.close()
    ratios = {
        name: statistics.median(ours / bare for ours, bare in zip(rates[name], rates["bare"]))
        for name in names
    }
    return {
        "rotations": rotations,
        "slice_s": slice_s,
        "ramp_s": ramp_s,
        "checks_per_s_median": {name: statistics.median(values) for name, values in rates.items()},
        "ratio_to_bare_median": ratios,
        "checks_per_s": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rotations", type=int, default=60)
    parser.add_argument("--slice-s", type=float, default=0.02)
    parser.add_argument("--ramp-s", type=float, default=0.004)
    parser.add_argument("--json", type=Path, help="write the figures here")
    options = parser.parse_args()
    load_before = load_average()
    server = RedisServer().start()
    try:
        figures = asyncio.run(run(server.port, options.rotations, options.slice_s, options.ramp_s))
    finally:
        server.stop()
    figures["load"] = [load_before, load_average()]
    figures["python"] = sys.version.split()[0]
    figures["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name, ratio in figures["ratio_to_bare_median"].items():
        rate = figures["checks_per_s_median"][name]
        print(f"{name:12} {rate:9,.0f} checks/s   {ratio:.3f} of bare (median per rotation)")
    print(f"load average {figures['load'][0]} -> {figures['load'][1]}")
    if options.json:
        options.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
