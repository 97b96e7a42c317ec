"""Sans-I/O steps, driven to their end.

A generator holds the rules of a task made of several calls (a SCAN and
UNLINK walk, checks decided together): it yields each call it needs, is sent
that call's outcome and returns the task's result. ``run`` makes the calls
blocking, ``run_async`` awaits them; neither knows what the calls are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator
from typing import Any, Callable, TypeVar, cast

Call = TypeVar("Call")
Outcome = TypeVar("Outcome")
Result = TypeVar("Result")


def run(steps: Generator[Call, Outcome, Result], call: Callable[[Call], Outcome]) -> Result:
    """``steps``' result, each call it yields made by ``call``."""
    outcome: Any = None  # what starts a generator
    while True:
        try:
            step = steps.send(outcome)
        except StopIteration as done:
            return cast(Result, done.value)
        outcome = call(step)


async def run_async(
    steps: Generator[Call, Outcome, Result], call: Callable[[Call], Awaitable[Outcome]]
) -> Result:
    """``run``, each call awaited."""
    outcome: Any = None
    while True:
        try:
            step = steps.send(outcome)
        except StopIteration as done:
            return cast(Result, done.value)
        outcome = await call(step)
