"""Real uvicorn servers on free loopback ports: in this event loop, or as processes of their own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import uvicorn
from process_helpers import stop_session
from redis_servers import free_port

TESTS_DIR = Path(__file__).resolve().parent


@asynccontextmanager
async def running(app: Any, **options: Any) -> AsyncIterator[int]:
    """Serve ``app`` in this event loop; yields the port. ``options`` go to uvicorn.Config
    (over the settings here)."""
    port = free_port()
    settings: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "on",
        # uvicorn would otherwise rewrite the client from X-Forwarded-For itself
        # (it trusts 127.0.0.1); moderato's own identity rules are under test.
        "proxy_headers": False,
    }
    config = uvicorn.Config(app, host="127.0.0.1", port=port, **{**settings, **options})
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


Start = Callable[[Any], Awaitable[int]]
"""Serve an app (``running``) until the ``serving`` block ends; answers its port."""

Serve = Callable[[Any], Awaitable[str]]
"""The ``serve`` fixture (tests/http/conftest.py): serve an app under uvicorn for the
rest of the test; answers its base URL."""


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[Start]:
    """Start apps under uvicorn in this event loop (``running``, with ``options``); every
    one of them stops when the block ends."""
    async with AsyncExitStack() as servers:

        async def start(app: Any) -> int:
            return await servers.enter_async_context(running(app, **options))

        yield start


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
            wait_until_serving(url + ready_path, process, log.read_text)
        yield [url for url, _ in started]


@contextmanager
def app_process(
    app_path: str,
    env: dict[str, str],
    log_path: Path,
    *,
    app_dir: Optional[Path] = TESTS_DIR,
    cwd: Optional[Path] = None,
    ready_path: str = "/healthz",
    timeout_s: float = 20,
) -> Iterator[str]:
    """One process of ``uvicorn <app_path>`` on a free port (``app_dir`` None: the app is
    found from ``cwd``, as a user's shell finds it); yields its base URL once it answers
    ``ready_path`` with 200, as ``app_processes`` does."""
    with _app_process(app_path, env, log_path, app_dir=app_dir, cwd=cwd) as (url, process):
        wait_until_serving(url + ready_path, process, log_path.read_text, timeout_s=timeout_s)
        yield url


@contextmanager
def _app_process(
    app_path: str,
    env: dict[str, str],
    log_path: Path,
    *,
    app_dir: Optional[Path] = TESTS_DIR,
    cwd: Optional[Path] = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    found_in = ["--app-dir", str(app_dir)] if app_dir is not None else []
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app_path, *found_in,
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
            cwd=cwd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield f"http://127.0.0.1:{port}", process
        finally:
            stop_session(process, term_wait_s=10)


def wait_until_serving(
    url: str,
    process: subprocess.Popen[bytes],
    output: Callable[[], str],
    *,
    timeout_s: float = 20,
    poll_s: float = 0.05,
    name: str = "uvicorn",
) -> None:
    """Return once ``url`` answers 200; a RuntimeError with the server's ``output`` (its
    log) if ``process`` exits first or ``timeout_s`` passes (a loaded machine starts
    servers slowly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}):\n{output()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start serving {url} in {timeout_s} s:\n{output()}")
        time.sleep(poll_s)
