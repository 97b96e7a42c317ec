"""Tests in a headless Chromium (the demo page, driven over the DevTools protocol)
against the demo app on a redis-server of their own.

redis-server and Chromium are looked for when this folder is collected: a missing
binary stops the run here with the install hint, and never turns into skipped tests.
"""

from __future__ import annotations

import pytest
from chromium import INSTALL_HINT, find_chromium
from redis_servers import redis_server_binary

redis_server_binary()
if find_chromium() is None:
    raise pytest.UsageError(INSTALL_HINT)
