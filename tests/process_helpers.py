"""Ending the processes tests start in sessions of their own (servers, browsers, workers)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def stop_session(process: subprocess.Popen[Any], term_wait_s: float) -> None:
    """End ``process`` and its children (it leads its own session): SIGTERM, then SIGKILL
    if it has not exited ``term_wait_s`` later."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=term_wait_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
