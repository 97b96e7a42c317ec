"""The same traffic through every algorithm: a comparison table and a chart of what each admits.

    python examples/algorithms_demo.py             # writes algorithms_demo.png too
    python examples/algorithms_demo.py --no-chart  # the table only (`make demo` prints it)
    python examples/algorithms_demo.py --chart docs/algorithms.png --url memory://

The backend: ``--url``, else MODERATO_REDIS_URL, else the Redis on
localhost:6379 when one answers there, else memory://
(examples/backend_choice.py); the first log line says which.

Three patterns are sent at once, each from its own client, through every
algorithm in ``moderato.algorithms.ALGORITHMS`` under one rate, ``10/2 seconds``:

- steady: one request every 0.4 s, half the rate: no algorithm should refuse it;
- burst: 25 requests at once, and 25 more 2.3 s later;
- boundary: 10 requests just before a window boundary and 10 just after,
  the pattern that lets a fixed window admit twice its limit in 0.3 s.

The schedule starts on a window boundary. On memory:// it runs on a virtual
clock: instant, and the same numbers on any machine. On Redis it runs in real
time (about six seconds, most of it waiting), since Redis reads its own clock,
which must agree with this machine's (as a local Redis's does). The chart
needs matplotlib: ``pip install 'moderato[chart]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

from moderato import RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.memory import MemoryBackend

try:  # `python -m examples.algorithms_demo`, from the repository's root
    from examples.backend_choice import backend_url
except ModuleNotFoundError:  # `python examples/algorithms_demo.py`: its own folder is on the path
    from backend_choice import backend_url

RATE = "10/2 seconds"
LIMIT = 10
WINDOW_S = 2
LATE_WARNING_S = 0.1
"""A batch that finishes later than this after its slot may land in another window."""


@dataclass(frozen=True)
class Pattern:
    name: str
    summary: str
    title: str
    sends: tuple[tuple[float, int], ...]
    """(seconds after the first window boundary, requests sent at that moment)."""

    @property
    def total(self) -> int:
        return sum(count for _, count in self.sends)


PATTERNS = (
    Pattern(
        "steady",
        "one request every 0.4 s (half the rate) for 4.8 s",
        "one every 0.4 s",
        tuple((round(0.05 + 0.4 * tick, 2), 1) for tick in range(12)),
    ),
    Pattern(
        "burst",
        "25 at once at 0.1 s, 25 more at 2.4 s",
        "25 at once, twice",
        ((0.1, 25), (2.4, 25)),
    ),
    Pattern(
        "boundary",
        "10 at 1.75 s and 10 at 2.05 s, either side of the window boundary at 2 s",
        "10 either side of a boundary",
        ((1.75, 10), (2.05, 10)),
    ),
)


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep_until(self, when: float) -> None: ...


class RealClock:
    """Wall-clock time, as Redis reads it (``TIME``): the schedule really waits."""

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, when: float) -> None:
        delay = when - time.time()
        if delay > 0:
            await asyncio.sleep(delay)


class VirtualClock:
    """Time that jumps to each slot: the in-process backend reads it, nothing waits."""

    def __init__(self, start_s: float) -> None:
        self.now_s = start_s

    def now(self) -> float:
        return self.now_s

    def now_ms(self) -> int:
        return round(self.now_s * 1000)

    async def sleep_until(self, when: float) -> None:
        self.now_s = max(self.now_s, when)


def virtual_clock_for(limiter: RateLimiter) -> Optional[VirtualClock]:
    """A virtual clock wired into a memory:// limiter; None for Redis (its clock is its own)."""
    # The in-process backend reads time from its ``clock`` attribute.
    backend = limiter.backend
    if not isinstance(backend, MemoryBackend):
        return None
    clock = VirtualClock(time.time())
    backend.clock = clock.now_ms
    return clock


@dataclass
class Report:
    algorithms: tuple[str, ...]
    admitted_at: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(algorithm, pattern) -> scheduled offsets of the admitted requests."""
    latest_finish_s: float = 0.0
    """The longest a batch took to be decided, counted from its scheduled moment."""
    virtual_time: bool = False

    def admitted(self, algorithm: str, pattern: str) -> int:
        return len(self.admitted_at.get((algorithm, pattern), []))

    def peak(self, algorithm: str, pattern: str) -> int:
        """The most requests admitted within any span of one window length."""
        offsets = sorted(self.admitted_at.get((algorithm, pattern), []))
        best = 0
        for index, start in enumerate(offsets):
            inside = sum(1 for offset in offsets[index:] if offset < start + WINDOW_S - 1e-9)
            best = max(best, inside)
        return best

    def as_dict(self) -> dict[str, object]:
        return {
            "rate": RATE,
            "patterns": {p.name: {"summary": p.summary, "sent": p.total} for p in PATTERNS},
            "admitted": {
                a: {p.name: self.admitted(a, p.name) for p in PATTERNS} for a in self.algorithms
            },
            "peak_in_one_window": {
                a: {p.name: self.peak(a, p.name) for p in PATTERNS} for a in self.algorithms
            },
            "latest_finish_s": round(self.latest_finish_s, 3),
            "virtual_time": self.virtual_time,
        }


async def run(redis_url: str) -> Report:
    """Send every pattern through every algorithm; returns what each one admitted.

    On memory:// the schedule runs on a virtual clock (instant, and exact on any
    machine); on Redis it runs in real time, since Redis reads its own clock.
    """
    algorithms = tuple(ALGORITHMS)
    report = Report(algorithms)
    # A fresh scope per run: earlier runs against the same Redis cannot leak into this one.
    scope = f"run-{secrets.token_hex(6)}"
    async with RateLimiter(redis_url, key_prefix="algorithms-demo") as limiter:
        clock: Clock = virtual_clock_for(limiter) or RealClock()
        report.virtual_time = isinstance(clock, VirtualClock)
        # Load every script before the clock starts, so the first slot is not late.
        for algorithm in algorithms:
            await limiter.get_usage("warm-up", RATE, scope=scope, algorithm=algorithm)
        start = math.ceil((clock.now() + 0.3) / WINDOW_S) * WINDOW_S
        slots = sorted({offset for pattern in PATTERNS for offset, _ in pattern.sends})
        for offset in slots:
            await clock.sleep_until(start + offset)
            batch = [
                (algorithm, pattern.name)
                for pattern in PATTERNS
                for slot, count in pattern.sends
                if slot == offset
                for algorithm in algorithms
                for _ in range(count)
            ]
            results = await asyncio.gather(
                *(
                    limiter.check_with_info(client, RATE, scope=scope, algorithm=algorithm)
                    for algorithm, client in batch
                )
            )
            report.latest_finish_s = max(report.latest_finish_s, clock.now() - (start + offset))
            for (algorithm, client), result in zip(batch, results):
                if result.allowed:
                    report.admitted_at.setdefault((algorithm, client), []).append(offset)
    return report


def render_table(report: Report) -> str:
    timing = "virtual time" if report.virtual_time else "real time"
    lines = [f"rate {RATE}; every pattern starts on a window boundary ({timing})", ""]
    lines.append(f"{'pattern':<10}{'sent':>5}  what is sent")
    for pattern in PATTERNS:
        lines.append(f"{pattern.name:<10}{pattern.total:>5}  {pattern.summary}")
    lines += ["", "admitted (most admitted within any 2 s in brackets)"]
    width = max(len(name) for name in report.algorithms) + 2
    lines.append(f"{'algorithm':<{width}}" + "".join(f"{p.name:>14}" for p in PATTERNS))
    for algorithm in report.algorithms:
        cells = "".join(
            f"{f'{report.admitted(algorithm, p.name)} ({report.peak(algorithm, p.name)})':>14}"
            for p in PATTERNS
        )
        lines.append(f"{algorithm:<{width}}{cells}")
    if report.latest_finish_s > LATE_WARNING_S:
        lines += [
            "",
            f"warning: a batch was decided {report.latest_finish_s * 1000:.0f} ms after its "
            "slot; on a busy machine the counts near the boundary can differ",
        ]
    return "\n".join(lines)


def write_chart(report: Report, path: Path) -> None:
    """A grid of small charts: one row per algorithm, one column per pattern.

    Each panel shows, at every moment of the schedule, the requests sent (grey)
    and the requests admitted (coloured), with the window boundaries dotted.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows, columns = len(report.algorithms), len(PATTERNS)
    figure, axes = plt.subplots(
        rows, columns, figsize=(12, 1.45 * rows + 1.2), sharex=True, squeeze=False,
        constrained_layout=True,
    )  # fmt: skip
    colours = plt.get_cmap("tab10")
    end_s = max(offset for pattern in PATTERNS for offset, _ in pattern.sends) + 0.35
    for row, algorithm in enumerate(report.algorithms):
        for column, pattern in enumerate(PATTERNS):
            axis = axes[row][column]
            offsets = report.admitted_at.get((algorithm, pattern.name), [])
            slots = [offset for offset, _ in pattern.sends]
            sent = [count for _, count in pattern.sends]
            admitted = [sum(1 for moment in offsets if moment == slot) for slot in slots]
            axis.bar(slots, sent, width=0.12, color="#d5dae0", label="sent")
            axis.bar(slots, admitted, width=0.12, color=colours(row % 10), label="admitted")
            for boundary in range(0, math.ceil(end_s) + 1, WINDOW_S):
                axis.axvline(boundary, color="#8d96a0", linewidth=1, linestyle=":", zorder=0)
            axis.set_xlim(-0.1, end_s)
            axis.set_ylim(0, max(sent) * 1.45)
            axis.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
            axis.text(
                0.99, 0.93, f"{len(offsets)} of {pattern.total} admitted",
                transform=axis.transAxes, ha="right", va="top", fontsize=9,
            )  # fmt: skip
            axis.tick_params(labelsize=8)
            if row == 0:
                axis.set_title(f"{pattern.name}: {pattern.title}", fontsize=10)
            if column == 0:
                axis.set_ylabel(algorithm, fontsize=10)
            if row == rows - 1:
                axis.set_xlabel("seconds (dotted: window boundaries)", fontsize=8)
    figure.suptitle(f"Requests sent (grey) and admitted (colour) at {RATE}", fontsize=12)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        help="backend URL (default: MODERATO_REDIS_URL, else a Redis answering on "
        "localhost:6379, else memory://)",
    )
    parser.add_argument("--chart", type=Path, help="PNG to write (default algorithms_demo.png)")
    parser.add_argument("--no-chart", action="store_true", help="print the table only")
    parser.add_argument("--json", type=Path, help="also write the counts as JSON")
    args = parser.parse_args(argv)

    report = asyncio.run(run(args.url or backend_url("algorithms_demo")))
    print(render_table(report))
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    if args.no_chart:
        return 0
    chart = args.chart or Path("algorithms_demo.png")
    try:
        write_chart(report, chart)
    except ImportError:
        print(
            "\nno chart: matplotlib is not installed (pip install 'moderato[chart]')",
            file=sys.stderr,
        )
        # Asked for by name, a missing chart is an error; by default, only a note.
        return 1 if args.chart else 0
    print(f"\nchart: {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
