"""Shared pieces of the HTTP integration tests: clients and header assertions."""

from __future__ import annotations

import math
from typing import Any, Optional

import httpx

QUOTA_HEADERS = (
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
)


def client(
    app: Any,
    *,
    ip: str = "127.0.0.1",
    root_path: str = "",
    base_url: str = "http://testserver",
    headers: Optional[dict[str, str]] = None,
) -> httpx.AsyncClient:
    """An httpx client talking to ``app`` in process, as the peer ``ip``."""
    transport = httpx.ASGITransport(app=app, client=(ip, 51234), root_path=root_path)
    return httpx.AsyncClient(transport=transport, base_url=base_url, headers=headers)


def rate_headers(response: httpx.Response) -> dict[str, str]:
    """Only the rate-limit headers of a response (plus Retry-After)."""
    names = (*QUOTA_HEADERS, "retry-after")
    return {name: response.headers[name] for name in names if name in response.headers}


def next_utc_midnight(now_s: float) -> int:
    """The reset of a fixed daily window that contains ``now_s``."""
    return (math.floor(now_s) // 86_400 + 1) * 86_400
