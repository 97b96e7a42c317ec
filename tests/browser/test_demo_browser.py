"""The demo page in a real browser: headless Chromium, driven over the DevTools protocol.

The demo app runs under uvicorn on a free loopback port (started the way
``make demo`` starts it), Chromium loads its page with no network beyond
loopback, the test clicks "Send burst" with the mouse and reads the counters
the page shows. A screenshot is left in test-artifacts/demo_page.png.

Chromium comes from Debian's ``chromium`` package (``make test`` installs it
through tools/ensure-chromium.sh); no driver and no download is involved.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from devtools import ARTIFACTS, DevTools, page_problems, requested_urls, text_of, within
from example_helpers import ROOT
from uvicorn_helpers import app_process

TIME_LIMIT_S = 30.0


@pytest.fixture
def demo_server(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """``uvicorn examples.fastapi_app:app`` on a free port, as ``make demo`` runs it."""
    env = {"MODERATO_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    with app_process(
        "examples.fastapi_app:app",
        env,
        tmp_path / "uvicorn.log",
        app_dir=None,
        cwd=ROOT,
        ready_path="/api/status",
        timeout_s=60,  # a loaded machine starts the app slowly
    ) as base_url:
        yield base_url


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
        # The message shows before the reset's usage poll ends, and the buttons stay
        # disabled until it does: a click before then is ignored (a loaded CI machine
        # clicked in that gap).
        await page.wait_for("document.body.dataset.busy === 'false'")
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

    shown = await within(scenario(), TIME_LIMIT_S)

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
    urls = requested_urls(page.events)
    assert urls and all(url.startswith(demo_server) for url in urls), urls
    assert sum(url.endswith("/api/algorithms/token_bucket") for url in urls) == 11
    assert page_problems(page.events) == []
    assert (ARTIFACTS / "demo_page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
