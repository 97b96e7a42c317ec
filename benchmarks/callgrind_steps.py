"""Instructions per call, counted by callgrind, for the step-by-step benchmarks
(hot_path.py, sync_hot_path.py): a figure other processes cannot move.

Each script runs itself under ``valgrind --tool=callgrind`` with ``--callgrind STEP
COUNT``: every step's warm-up, then STEP COUNT times. One call of the step costs
(total - total of a run with STEP "none" and COUNT 0) / COUNT instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable


def add_callgrind_options(parser: argparse.ArgumentParser, default_count: int) -> None:
    """The options both scripts take: one step's run, and every step's."""
    parser.add_argument("--callgrind", nargs=2, metavar=("STEP", "COUNT"))
    parser.add_argument("--callgrind-all", action="store_true")
    parser.add_argument("--callgrind-count", type=int, default=default_count)


def callgrind_total(argv: list[str]) -> int:
    """The instructions the command ``argv`` ran, in user space, under callgrind."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
        subprocess.run(command, check=True, capture_output=True)
        text = Path(out).read_text()
    match = re.search(r"^summary:\s+(\d+)", text, re.MULTILINE) or re.search(
        r"^totals:\s+(\d+)", text, re.MULTILINE
    )
    assert match, "no totals in callgrind's output"
    return int(match.group(1))


def instructions_per_call(
    script: list[str], steps: Iterable[str], count: int, line: Callable[[str, float], str]
) -> dict[str, Any]:
    """Each step's instructions per call (``script`` run with ``--callgrind STEP COUNT``),
    each printed as ``line`` words it as soon as it is known; the baseline and count too."""
    base = callgrind_total([*script, "--callgrind", "none", "0"])
    figures: dict[str, Any] = {"baseline_instructions": base, "count": count}
    for name in steps:
        total = callgrind_total([*script, "--callgrind", name, str(count)])
        figures[name] = (total - base) / count
        print(line(name, figures[name]), flush=True)
    return figures
