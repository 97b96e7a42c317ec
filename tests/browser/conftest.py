"""Tests in a headless Chromium (the demo page, driven over the DevTools protocol)
against the demo app on a redis-server of their own.

redis-server and Chromium are looked for when this folder is collected: a missing
binary stops the run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from chromium import INSTALL_HINT, find_chromium
from devtools import DevTools, launched_browser, opened_page
from redis_servers import redis_server_binary

redis_server_binary()
if find_chromium() is None:
    raise pytest.UsageError(INSTALL_HINT)


@pytest.fixture
def browser() -> Iterator[str]:
    """Headless Chromium with a throwaway profile; yields its DevTools HTTP address."""
    with launched_browser() as address:
        yield address


@pytest.fixture
async def page(browser: str) -> AsyncIterator[DevTools]:
    """A fresh tab, with network, console and exception events recorded."""
    async with opened_page(browser) as devtools:
        yield devtools
