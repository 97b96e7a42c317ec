"""Running a body in a fork()ed child, for the blocking client's and limiter's fork tests."""

from __future__ import annotations

import json
import os
from typing import Any, Callable


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
