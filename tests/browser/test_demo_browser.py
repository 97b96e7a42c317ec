"""The demo page in a real browser: headless Chromium, driven over the DevTools protocol.

The demo app runs under uvicorn on a free loopback port (started the way
``make demo`` starts it), Chromium loads its page with no network beyond
loopback, the test clicks "Send burst" with the mouse and reads the counters
the page shows. A screenshot is left in test-artifacts/demo_page.png.

Chromium comes from Debian's ``chromium`` package (``make test`` installs it
through tools/ensure-chromium.sh); no driver and no download is involved.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromium import INSTALL_HINT, find_chromium
from example_helpers import ROOT
from redis_servers import free_port
from websockets.asyncio.client import ClientConnection, connect

ARTIFACTS = ROOT / "test-artifacts"
TIME_LIMIT_S = 30.0


def chromium_binary() -> str:
    path = find_chromium()
    if not path:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a process this test started, and its children (it leads its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


@pytest.fixture
def demo_server(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """``uvicorn examples.fastapi_app:app`` on a free port, as ``make demo`` runs it."""
    port = free_port()
    env = {**os.environ, "MODERATO_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "uvicorn.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts the app slowly
        while True:
            try:
                if httpx.get(f"{base_url}/api/status", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the demo app did not start:\n" + (tmp_path / "uvicorn.log").read_text()
                )
            time.sleep(0.05)
        yield base_url
    finally:
        stop(process)
        log.close()


@pytest.fixture
def browser() -> Iterator[str]:
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


@pytest.fixture
async def page(browser: str) -> AsyncIterator[DevTools]:
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


async def test_burst_button_shows_allowed_and_denied_counts(
    demo_server: str, page: DevTools
) -> None:
    async def scenario() -> dict[str, Any]:
        await page.call("Page.navigate", url=f"{demo_server}/")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'")
        assert await page.evaluate(text_of("backend")) == "redis (connected)"
        # Token bucket, 5 per 10 s: a burst of 10 admits exactly 5 whenever it is sent.
        await page.evaluate(
            "(() => { const s = document.getElementById('route'); s.value = 'token_bucket';"
            " s.dispatchEvent(new Event('change')); document.getElementById('burst-size')"
            ".value = '10'; })()"
        )
        await page.click("send-burst")
        await page.wait_for(
            f"document.body.dataset.busy === 'false' && "
            f"Number({text_of('allowed')}) + Number({text_of('denied')}) === 10"
        )
        shown = await page.evaluate(
            "Object.fromEntries(['allowed', 'denied', 'other', 'limit', 'remaining', 'message']"
            ".map((id) => [id, document.getElementById(id).textContent]))"
        )
        shown["cells"] = await page.evaluate(
            "Array.from(document.querySelectorAll('#timeline span')).map((s) => s.className)"
        )
        shown["rows"] = await page.evaluate("document.querySelectorAll('#log tr').length")
        # The live panel polls /api/usage each second: it comes to agree with the headers.
        shown["live"] = await page.wait_for(
            f"{text_of('live-limit')} === '5' && Number({text_of('live-remaining')}) <= 1"
            f" && {text_of('live-remaining')}"
        )
        shown["reset_in"] = await page.evaluate(text_of("reset-in"))
        screenshot = await page.call("Page.captureScreenshot", format="png")
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "demo_page.png").write_bytes(base64.b64decode(screenshot["data"]))

        # Reset the quotas, then one request: a full bucket again, less one.
        await page.click("reset")
        shown["after_reset"] = await page.wait_for(
            f"{text_of('message')}.startsWith('quotas reset') && {text_of('message')}"
        )
        await page.click("send-one")
        try:
            await page.wait_for(f"{text_of('allowed')} === '1'")
        except AssertionError as error:  # say what the page showed instead
            state = await page.evaluate(
                "['allowed', 'denied', 'remaining', 'last-status', 'message']"
                ".map((id) => document.getElementById(id).textContent).join(' | ')"
            )
            raise AssertionError(f"{error}; the page shows: {state}") from None
        shown["single"] = await page.evaluate(
            "['allowed', 'denied', 'remaining', 'last-status']"
            ".map((id) => document.getElementById(id).textContent)"
        )
        return shown

    started = time.monotonic()
    shown = await asyncio.wait_for(scenario(), timeout=TIME_LIMIT_S)
    assert time.monotonic() - started < TIME_LIMIT_S

    assert (shown["allowed"], shown["denied"], shown["other"]) == ("5", "5", "0")
    assert shown["message"] == "burst of 10: 5 allowed, 5 denied"
    assert (shown["limit"], shown["remaining"]) == ("5", "0")
    assert sorted(shown["cells"]) == ["s200"] * 5 + ["s429"] * 5
    assert shown["rows"] == 10
    assert shown["live"] in ("0", "1")  # one token is back after 2 s
    seconds = int(shown["reset_in"].strip("(in s)"))
    assert 0 <= seconds <= 10
    # The token bucket's state and the app-wide window's counter.
    assert shown["after_reset"] == "quotas reset for 127.0.0.1 (2 keys deleted)"
    assert shown["single"] == ["1", "0", "4", "200"]

    # Nothing left loopback: every request the page made went to the demo app.
    urls = [
        event["params"]["request"]["url"]
        for event in page.events
        if event.get("method") == "Network.requestWillBeSent"
    ]
    assert urls and all(url.startswith(demo_server) for url in urls), urls
    assert sum(url.endswith("/api/algorithms/token_bucket") for url in urls) == 11
    problems = [
        event
        for event in page.events
        if event.get("method") == "Runtime.exceptionThrown"
        or (
            event.get("method") == "Runtime.consoleAPICalled"
            and event["params"].get("type") in ("error", "assert")
        )
    ]
    assert problems == []
    assert (ARTIFACTS / "demo_page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
