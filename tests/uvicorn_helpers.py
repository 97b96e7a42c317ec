"""Real uvicorn servers on free loopback ports: in this event loop, or as processes of their own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from redis_servers import free_port

TESTS_DIR = Path(__file__).resolve().parent


@asynccontextmanager
async def running(app: Any, **options: Any) -> AsyncIterator[int]:
    """Serve ``app`` in this event loop; yields the port. ``options`` go to uvicorn.Config."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # uvicorn would otherwise rewrite the client from X-Forwarded-For itself
        # (it trusts 127.0.0.1); moderato's own identity rules are under test.
        proxy_headers=False,
        **options,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    deadline_s = time.monotonic() + 5
    while not server.started:
        if task.done() or time.monotonic() > deadline_s:
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=5)


@contextmanager
def app_processes(
    app_path: str, count: int, env: dict[str, str], log_dir: Path, ready_path: str = "/healthz"
) -> Iterator[list[str]]:
    """``count`` processes of ``uvicorn <app_path>`` (a module of tests/), each on a free port.

    ``env`` is added to this process's environment. Yields their base URLs once
    each answers ``ready_path`` with 200; a process that exits or stays silent
    for 20 s fails the start with its log. Each process leads its own session
    and is ended (SIGTERM, then SIGKILL) on the way out.
    """
    with ExitStack() as stack:
        logs = [log_dir / f"uvicorn-{n}.log" for n in range(count)]
        started = [stack.enter_context(_app_process(app_path, env, log)) for log in logs]
        for (url, process), log in zip(started, logs):
            _wait_until_serving(url + ready_path, process, log)
        yield [url for url, _ in started]


@contextmanager
def _app_process(
    app_path: str, env: dict[str, str], log_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app_path, "--app-dir", str(TESTS_DIR),
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield f"http://127.0.0.1:{port}", process
        finally:
            _stop(process)


def _wait_until_serving(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start serving {url}:\n{log_path.read_text()}")
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
