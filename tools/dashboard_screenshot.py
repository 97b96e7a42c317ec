"""Redraw docs/dashboard.png: the dashboard watching three processes under a few minutes of traffic.

Starts a redis-server and three processes of tests/dashboard_worker.py (as
tests/browser/test_dashboard_browser.py does), sends them varying traffic for
``--minutes`` (steady reads, a search flood from one identity that comes and
goes, exports of which some cost more than the limit holds), then opens the
first process's dashboard in headless Chromium (driven over the DevTools
protocol as tests/browser/devtools.py drives it), inspects the flooded
identity and saves the whole page.

    python tools/dashboard_screenshot.py [--minutes 3] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from devtools import launched_browser, opened_page  # noqa: E402
from redis_servers import RedisServer  # noqa: E402


def start_workers(redis_url: str, count: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    processes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "dashboard_worker.py"), redis_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        for _ in range(count)
    ]
    urls = []
    for process in processes:
        assert process.stdout is not None
        urls.append(f"http://127.0.0.1:{process.stdout.readline().strip()}")
    return processes, urls


async def traffic(urls: list[str], seconds: float) -> None:
    """About 30 requests a second, rising and falling; a flood every other minute."""
    targets = itertools.cycle(urls)
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        tick = 0
        while (elapsed := time.monotonic() - started) < seconds:
            wave = 1 + math.sin(elapsed / 20)
            batch = [
                (f"/api/items?n={tick}", f"user:{tick % 23}") for _ in range(int(6 * wave) + 2)
            ]
            if int(elapsed // 60) % 2 == 0 and (elapsed % 60) < 25:
                batch += [("/api/search", "user:flood")] * 6
            if tick % 4 == 0:
                batch.append(("/api/search", f"user:{tick % 7}"))
            if tick % 9 == 0:
                cost = 11 if tick % 27 == 0 else 3
                batch.append((f"/api/export?cost={cost}", f"user:{tick % 5}"))
            await asyncio.gather(
                *(
                    client.get(next(targets) + path, headers={"x-user": user})
                    for path, user in batch
                )
            )
            tick += 1
            await asyncio.sleep(0.25)


async def screenshot(dashboard_url: str, out: Path) -> None:
    # The tests' own headless Chromium and tab (tests/browser/devtools.py).
    with launched_browser() as browser:
        async with opened_page(browser) as page:
            await page.call("Page.navigate", url=dashboard_url)
            await page.wait_for("document.body && document.body.dataset.ready === 'true'", 30)
            await page.evaluate("document.getElementById('identity').value = 'user:flood'")
            await page.evaluate("document.getElementById('inspect').click()")
            await page.wait_for("document.body.dataset.inspected === '1'", 15)
            await asyncio.sleep(1.5)  # one more refresh, after the inspection
            height = await page.evaluate("document.documentElement.scrollHeight")
            await page.call(
                "Emulation.setDeviceMetricsOverride",
                width=1280, height=int(height), deviceScaleFactor=1, mobile=False,
            )  # fmt: skip
            await asyncio.sleep(1.5)
            shot = await page.call("Page.captureScreenshot", format="png")
            out.write_bytes(base64.b64decode(shot["data"]))


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    arguments = parser.parse_args()
    server = RedisServer().start()
    processes: list[subprocess.Popen[str]] = []
    try:
        processes, urls = start_workers(server.url, 3)
        await traffic(urls, arguments.minutes * 60)
        await asyncio.sleep(2)  # every process has published its last second
        await screenshot(f"{urls[0]}/ratelimits/", arguments.out)
        print(f"written: {arguments.out}")
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
