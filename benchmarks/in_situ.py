"""What the in-situ benchmarks share (batch_in_situ.py, cluster_batch_in_situ.py,
peers_in_situ.py): their command line, the run itself (the servers started, the
measuring, the servers closed, the raw record written), and a trial's window of
``TASKS`` asyncio tasks checking in a loop, over ``IDENTITIES`` identities (each
check a random one) or one hot identity.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from batch_floor import ROOT, write_results

TASKS = 100
IDENTITIES = 1000

Reading = TypeVar("Reading")


class Servers(Protocol):
    def close(self) -> None: ...


def in_situ_options(doc: str, algorithms: Iterable[str]) -> argparse.ArgumentParser:
    """The options every in-situ benchmark takes (``--trials``, ``--seconds``,
    ``--algorithms``, by default ``algorithms``), described by the first line of ``doc``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--algorithms", nargs="*", default=list(algorithms))
    return parser


def run_in_situ(
    benchmark: str,
    options: argparse.Namespace,
    servers: Servers,
    measure: Callable[[], Awaitable[list[dict[str, Any]]]],
    **more: Any,
) -> None:
    """Run ``measure()`` in an event loop against ``servers`` (started), close them, and
    write the rows to benchmarks/results/ (batch_floor.write_results) with ``more``."""
    try:
        rows = asyncio.run(measure())
    finally:
        servers.close()
    path = write_results(benchmark, vars(options), rows, tasks=TASKS, **more)
    print(f"wrote {path.relative_to(ROOT)}")


async def checks_window(
    check: Callable[..., Awaitable[Any]],
    hot: bool,
    seconds: float,
    warm_up_s: float,
    read: Callable[[], Reading],
    *args: Any,
    **keywords: Any,
) -> tuple[int, float, Reading, Reading]:
    """``TASKS`` tasks each awaiting ``check(identity, *args, **keywords)`` in a loop;
    after ``warm_up_s`` (every task under way) a window of ``seconds``: the checks made
    in it, its length on the wall clock, and ``read()`` at its start and at its end."""
    names = ["hot"] if hot else [f"id{i}" for i in range(IDENTITIES)]
    stop = False
    counts = [0] * TASKS

    async def task(index: int) -> None:
        pick = random.Random(index).choice
        while not stop:
            await check(pick(names), *args, **keywords)
            counts[index] += 1

    tasks = [asyncio.ensure_future(task(i)) for i in range(TASKS)]
    await asyncio.sleep(warm_up_s)
    before = read()
    checks_before, started = sum(counts), time.perf_counter()
    await asyncio.sleep(seconds)
    checks = sum(counts) - checks_before
    elapsed = time.perf_counter() - started
    after = read()
    stop = True
    await asyncio.gather(*tasks)
    return checks, elapsed, before, after
