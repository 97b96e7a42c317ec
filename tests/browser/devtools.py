"""Headless Chromium driven over the DevTools protocol, for the browser tests (the demo
page, the dashboard) and tools/dashboard_screenshot.py: the browser, a tab, and the
smallest protocol client that drives them.

Chromium comes from Debian's ``chromium`` package (``make test`` installs it through
tools/ensure-chromium.sh, or MODERATO_CHROMIUM names one); no driver and no download
is involved.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from chromium import INSTALL_HINT, find_chromium
from example_helpers import ROOT
from process_helpers import stop_session
from websockets.asyncio.client import ClientConnection, connect

ARTIFACTS = ROOT / "test-artifacts"

T = TypeVar("T")


def chromium_binary() -> str:
    path = find_chromium()
    if not path:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


def stop(process: subprocess.Popen[Any]) -> None:
    """End a process this test started, and its children (it leads its own session)."""
    stop_session(process, term_wait_s=5)


@contextmanager
def launched_browser() -> Iterator[str]:
    """Headless Chromium with a throwaway profile; yields its DevTools HTTP address."""
    binary = chromium_binary()
    profile = Path(tempfile.mkdtemp(prefix="moderato-chromium-"))
    process = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            # Loopback only: any other host name fails to resolve.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1280,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Port 0: Chromium picks a free port and writes it to this file.
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60  # a loaded machine starts Chromium slowly
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium ({binary}) did not open its DevTools port")
            time.sleep(0.05)
        yield f"127.0.0.1:{port_file.read_text().splitlines()[0]}"
    finally:
        stop(process)
        shutil.rmtree(profile, ignore_errors=True)


class DevTools:
    """The smallest Chrome DevTools Protocol client: commands by id, events kept in a list."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.socket:
            message = json.loads(raw)
            future = self.pending.pop(message.get("id", -1), None)
            if future is None:
                self.events.append(message)
            elif "error" in message:
                future.set_exception(RuntimeError(f"DevTools error: {message['error']}"))
            else:
                future.set_result(message.get("result", {}))

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        command_id = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[command_id] = future
        await self.socket.send(json.dumps({"id": command_id, "method": method, "params": params}))
        return await asyncio.wait_for(future, timeout=10)

    async def evaluate(self, expression: str) -> Any:
        reply = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"page script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 10) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for: {expression}")
            await asyncio.sleep(0.05)

    async def click(self, element_id: str) -> None:
        """A real mouse click in the middle of the element, as a person would make it."""
        box = await self.evaluate(
            f"(() => {{ const r = document.getElementById({element_id!r})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            await self.call(
                "Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                button="left", clickCount=1,
            )  # fmt: skip

    async def close(self) -> None:
        await self.socket.close()
        self.reader.cancel()


@asynccontextmanager
async def opened_page(browser: str) -> AsyncIterator[DevTools]:
    """A fresh tab, with network, console and exception events recorded."""
    async with httpx.AsyncClient() as http:
        target = (await http.put(f"http://{browser}/json/new?about:blank")).json()
    async with connect(target["webSocketDebuggerUrl"], max_size=None) as socket:
        devtools = DevTools(socket)
        for domain in ("Page", "Runtime", "Network"):
            await devtools.call(f"{domain}.enable")
        await devtools.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280, height=1000, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        try:
            yield devtools
        finally:
            await devtools.close()


def text_of(element_id: str) -> str:
    return f"document.getElementById({element_id!r}).textContent"


def requested_urls(events: list[dict[str, Any]]) -> list[str]:
    """Every URL the page asked for, in order."""
    return [
        event["params"]["request"]["url"]
        for event in events
        if event.get("method") == "Network.requestWillBeSent"
    ]


def page_problems(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the page's scripts raised or logged as an error (or a failed assert)."""
    return [
        event
        for event in events
        if event.get("method") == "Runtime.exceptionThrown"
        or (
            event.get("method") == "Runtime.consoleAPICalled"
            and event["params"].get("type") in ("error", "assert")
        )
    ]


async def within(scenario: Awaitable[T], time_limit_s: float) -> T:
    """What ``scenario`` returns, which must be done within ``time_limit_s``."""
    started = time.monotonic()
    result = await asyncio.wait_for(scenario, timeout=time_limit_s)
    assert time.monotonic() - started < time_limit_s
    return result
