"""The error responses both middlewares send, straight over ASGI.

The statuses and JSON bodies are web/responses.py's (shared with the Django
integration); this module adds the headers a denial carries, from the
decisions recorded in the ASGI scope, and sends the response.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import Scope, Send

from ..web.headers import HeaderList, HeaderStyle, legacy_for_denial, render, report
from ..web.responses import ErrorResponse, encoded_body
from .decisions import recorded


def denial_headers(response: ErrorResponse, scope: Scope, style: HeaderStyle) -> HeaderList:
    """Quota headers and Retry-After for a denial (the policy that denied); none for a 503."""
    if response.denial is None:
        return []
    if style == "legacy":  # the default: no Report needed (tests/unit/test_headers_fast_path.py)
        return legacy_for_denial(recorded(scope), response.denial)
    denial_report = report(recorded(scope), response.denial)
    return [] if denial_report is None else render(denial_report, style, time.time())


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: HeaderList, *, prefix: str = ""
) -> None:
    """Send a complete JSON response; ``prefix="websocket."`` sends it as a handshake denial."""
    payload = encoded_body(body)
    await send(
        {
            "type": f"{prefix}http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": f"{prefix}http.response.body", "body": payload})
