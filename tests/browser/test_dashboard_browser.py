"""The dashboard in a real browser, watching three uvicorn processes that share one redis-server.

Three processes serve the same app (tests/dashboard_worker.py: three limits, each
request meeting one) on their own ports, as three replicas would. The test sends
them traffic concurrently, a flood from one identity among it, counts every answer
(200 allowed, 429 denied, 422 permanent denial), then opens the dashboard of the
first process in headless Chromium (driven as tests/browser/devtools.py drives
it) and reads from the page itself: the outcome totals, the process count,
the limits' decisions and the most-limited identity. Then it resets that identity
with the page's own buttons and checks it is let through again. Screenshots are left
in test-artifacts/ and checked: not blank, the chart drawn.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_worker import EXPORT_RATE, SEARCH_RATE
from devtools import ARTIFACTS, DevTools, page_problems, requested_urls, stop, text_of, within
from example_helpers import ROOT
from PIL import Image

PROCESSES = 3
TIME_LIMIT_S = 120.0
OUTCOME_OF_STATUS = {200: "allowed", 429: "denied", 422: "permanent"}


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Three processes of tests/dashboard_worker.py; yields their base URLs."""
    processes: list[subprocess.Popen[str]] = []
    logs = []
    try:
        for index in range(PROCESSES):
            log = (tmp_path / f"worker-{index}.log").open("w")
            logs.append(log)
            command = [sys.executable, str(ROOT / "tests" / "dashboard_worker.py"), redis_url]
            environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
            processes.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    start_new_session=True,
                    env=environment,
                )
            )
        urls = []
        for process in processes:
            assert process.stdout is not None
            port = process.stdout.readline().strip()
            if not port:
                logs_text = "\n".join(path.read_text() for path in tmp_path.glob("*.log"))
                raise RuntimeError(f"a dashboard worker did not start:\n{logs_text}")
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for process in processes:
            stop(process)
        for log in logs:
            log.close()


async def send_load(urls: list[str]) -> Counter[tuple[str, str]]:
    """Concurrent traffic over the three processes; every answer counted by (route, outcome)."""
    requests: list[tuple[str, dict[str, str]]] = []
    for n in range(90):
        requests.append((f"/api/items?n={n}", {"x-user": f"user:{n % 9}"}))
    for _ in range(150):
        requests.append(("/api/search", {"x-user": "user:flood"}))
    for n in range(12):
        requests.append(("/api/search", {"x-user": f"user:{n % 4}"}))
    for n in range(12):  # cost 4 of 10: some fit; cost 11 never can (a permanent denial)
        cost = 11 if n % 3 == 0 else 4
        requests.append((f"/api/export?cost={cost}", {"x-user": f"user:{n % 2}"}))
    counted: Counter[tuple[str, str]] = Counter()
    targets = itertools.cycle(urls)
    limit = asyncio.Semaphore(12)
    async with httpx.AsyncClient(timeout=30) as client:

        async def one(path: str, headers: dict[str, str], base: str) -> None:
            async with limit:
                reply = await client.get(base + path, headers=headers)
            route = path.split("?")[0]
            counted[route, OUTCOME_OF_STATUS[reply.status_code]] += 1

        await asyncio.gather(*(one(path, headers, next(targets)) for path, headers in requests))
    return counted


async def click(tab: DevTools, element_id: str) -> None:
    """A real mouse click, on the element scrolled into view first (the page is long)."""
    await tab.evaluate(
        f"document.getElementById({element_id!r}).scrollIntoView({{block: 'center'}})"
    )
    await tab.click(element_id)


def page_totals() -> str:
    return (
        "Object.fromEntries(['allowed','denied','permanent','bypassed','error','shadow_denied']"
        ".map((o) => [o, Number(document.getElementById('total-' + o).textContent)]))"
    )


async def screenshot(tab: DevTools, name: str) -> Image.Image:
    shot = await tab.call("Page.captureScreenshot", format="png")
    data = base64.b64decode(shot["data"])
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_bytes(data)
    return Image.open(io.BytesIO(data)).convert("RGB")


def chart_pixels(image: Image.Image, box: list[float], rgb: tuple[int, int, int]) -> int:
    """How many pixels of the chart's box have (about) the colour ``rgb``."""
    left, top, width, height = (round(value) for value in box)
    region = image.crop((left, top, left + width, top + height))
    return sum(
        count
        for count, pixel in region.getcolors(maxcolors=1 << 20) or []
        if all(abs(channel - want) <= 24 for channel, want in zip(pixel, rgb))
    )


async def test_three_processes_one_dashboard_exact_totals_top_identity_and_reset(
    fleet: list[str],
    page: DevTools,
) -> None:
    counted = await send_load(fleet)
    sent = sum(counted.values())
    by_outcome = Counter[str]()
    for (_, outcome), count in counted.items():
        by_outcome[outcome] += count
    # What the limits make of it, whichever process answered: one shared quota per identity.
    assert counted == {
        ("/api/items", "allowed"): 90,
        ("/api/search", "allowed"): 40 + 12,  # the flood's 40, and the others' 3 each
        ("/api/search", "denied"): 110,
        ("/api/export", "allowed"): 4,  # two cost-4 requests of each identity fit in 10
        ("/api/export", "denied"): 4,
        ("/api/export", "permanent"): 4,  # cost 11 above a capacity of 10
    }

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await page.call("Page.navigate", url=f"{fleet[0]}/ratelimits/")
        await page.wait_for("document.body && document.body.dataset.ready === 'true'", 30)
        # Each process publishes within a second; the page refreshes every second.
        seen["totals"] = await page.wait_for(
            f"(() => {{ const t = {page_totals()}; return "
            f"Object.values(t).reduce((a, b) => a + b, 0) === {sent} && t; }})()",
            30,
        )
        seen["processes"] = await page.wait_for(
            f"{text_of('process-count')} === '{PROCESSES}' && {text_of('process-count')}", 30
        )
        seen["top"] = await page.evaluate(
            "Array.from(document.querySelectorAll('#top-identities tbody tr')).map((r) =>"
            " [r.querySelector('.identity').textContent, Number(r.querySelector('.denials')"
            ".textContent)])"
        )
        seen["limits"] = await page.evaluate(
            "Array.from(document.querySelectorAll('#limits tbody tr')).map((r) =>"
            " [r.cells[0].textContent, r.cells[2].textContent, Number(r.cells[8].textContent)])"
        )
        seen["drawn"] = int(await page.evaluate("document.getElementById('chart').dataset.drawn"))
        seen["box"] = await page.evaluate(
            "(() => { const r = document.getElementById('chart').getBoundingClientRect();"
            " return [r.x, r.y, r.width, r.height]; })()"
        )
        seen["image"] = await screenshot(page, "dashboard.png")

        # Inspect the flooded identity, then reset it with the page's button (two clicks).
        await page.evaluate("document.getElementById('identity').value = 'user:flood'")
        await click(page, "inspect")
        await page.wait_for("document.body.dataset.inspected === '1'", 15)
        seen["usage"] = await page.evaluate(
            "Array.from(document.querySelectorAll('#usage tbody tr')).map((r) =>"
            " [r.querySelector('.scope').textContent, r.querySelector('.used').textContent])"
        )
        await click(page, "reset")
        await click(page, "reset")
        seen["reset"] = await page.wait_for(
            f"document.getElementById('reset-result').dataset.outcome === 'done' && "
            f"{text_of('reset-result')}",
            15,
        )
        await page.wait_for("document.body.dataset.inspected === '2'", 15)
        seen["usage_after"] = await page.evaluate(
            "Array.from(document.querySelectorAll('#usage tbody tr')).map((r) =>"
            " [r.querySelector('.scope').textContent, r.querySelector('.used').textContent])"
        )
        return seen

    seen = await within(scenario(), TIME_LIMIT_S)

    assert seen["totals"] == {
        "allowed": by_outcome["allowed"],
        "denied": by_outcome["denied"],
        "permanent": by_outcome["permanent"],
        "bypassed": 0,
        "error": 0,
        "shadow_denied": 0,
    }
    assert seen["processes"] == str(PROCESSES)
    assert seen["top"][0] == ["user:flood", 110]  # every denial of the flood, across processes
    decisions = {(kind, rate): count for kind, rate, count in seen["limits"]}
    assert decisions == {
        ("@limiter.limit", "1000/minute"): 90,
        ("limiter.dependency", SEARCH_RATE): 162,
        ("@limiter.limit", EXPORT_RATE): 12,
    }
    assert ["search", "40 / 40"] in seen["usage"]
    assert seen["reset"].startswith("reset user:flood: ")
    assert ["search", "0 / 40"] in seen["usage_after"]
    async with httpx.AsyncClient() as client:
        again = await client.get(f"{fleet[1]}/api/search", headers={"x-user": "user:flood"})
    assert again.status_code == 200

    # The screenshot: not blank, and the chart drawn in the outcomes' colours.
    image = seen["image"]
    assert len(image.getcolors(maxcolors=1 << 20) or []) > 50
    assert seen["drawn"] > 0
    assert chart_pixels(image, seen["box"], (0x2E, 0x9D, 0x5B)) > 20  # allowed
    assert chart_pixels(image, seen["box"], (0xE0, 0x8A, 0x1E)) > 20  # denied

    # Nothing left loopback, and the page raised nothing.
    urls = requested_urls(page.events)
    assert urls and all(url.startswith(fleet[0] + "/ratelimits/") for url in urls), urls
    assert page_problems(page.events) == []
