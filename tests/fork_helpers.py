"""Running a body in a fork()ed child, for the fork tests: a blocking body (in_child), or a
coroutine on a new loop after closing the inherited one (in_child_of_loop)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def in_child(body: Callable[[], Any]) -> Any:
    """Fork; run ``body`` in the child; return what it returned (as JSON over a pipe).

    The child's exception, if any, fails the test with its text; the child
    never returns into pytest.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            outcome = {"result": body()}
        except BaseException as error:  # reported to the parent, which fails the test
            outcome = {"error": repr(error)}
        with os.fdopen(write_end, "w") as report:
            report.write(json.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        outcome = json.loads(report.read() or '{"error": "the child reported nothing"}')
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "error" not in outcome, outcome["error"]
    return outcome["result"]


def in_child_of_loop(
    body: Callable[[], Awaitable[T]], *, close_inherited: asyncio.AbstractEventLoop
) -> T:
    """Fork; the child closes the inherited loop, runs ``body`` on a new loop and reports.

    Returns what ``body`` returned in the child (over a pipe, as JSON); the
    child's exception, if any, fails the test with its text.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        outcome: dict[str, Any]
        try:
            close_inherited.close()
            outcome = {"result": asyncio.run(body())}
        except BaseException as error:  # reported to the parent, which fails the test
            outcome = {"error": repr(error)}
        with os.fdopen(write_end, "w") as report:
            report.write(json.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        outcome = json.loads(report.read() or '{"error": "the child reported nothing"}')
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "error" not in outcome, outcome["error"]
    result: T = outcome["result"]
    return result
