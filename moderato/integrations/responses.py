"""The JSON error responses both middlewares send, straight over ASGI.

- RateLimitExceeded, temporary: 429
  ``{"error": "Rate limit exceeded", "retry_after": 7, "limit": 100}``
- RateLimitExceeded, cost above capacity: 422
  ``{"error": "Rate limit exceeded", "retry_after": null, "limit": 100}``
- BackendError: 503 ``{"error": "Rate limit backend unavailable"}``
- RateLimitCallbackError: 503 ``{"error": "Rate limit callback failed", "callback": "key"}``

A 503 carries no quota or retry headers: the backend did not decide, so
nothing is known about the quota.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Optional

from starlette.types import Scope, Send

from ..errors import BackendError, RateLimitCallbackError, RateLimitExceeded
from .decisions import recorded
from .headers import HeaderList, HeaderStyle, render, report


@dataclass(frozen=True)
class ErrorResponse:
    status: int
    body: dict[str, Any]
    denial: Optional[RateLimitExceeded]
    """Set for a quota denial, whose headers describe the policy that denied."""


def error_response(error: BaseException) -> Optional[ErrorResponse]:
    """The response for a moderato exception, or None for anything else (left to propagate)."""
    error = _single_leaf(error)
    if isinstance(error, RateLimitExceeded):
        body = {
            "error": "Rate limit exceeded",
            "retry_after": error.retry_after,
            "limit": error.limit,
        }
        return ErrorResponse(error.status_code, body, error)
    if isinstance(error, RateLimitCallbackError):
        return ErrorResponse(
            503, {"error": "Rate limit callback failed", "callback": error.callback}, None
        )
    if isinstance(error, BackendError):
        return ErrorResponse(503, {"error": "Rate limit backend unavailable"}, None)
    return None


def denial_headers(response: ErrorResponse, scope: Scope, style: HeaderStyle) -> HeaderList:
    """Quota headers and Retry-After for a denial (the policy that denied); none for a 503."""
    if response.denial is None:
        return []
    denial_report = report(recorded(scope), response.denial)
    return [] if denial_report is None else render(denial_report, style, time.time())


def _single_leaf(error: BaseException) -> BaseException:
    # Task groups (anyio, BaseHTTPMiddleware) may wrap the one real error in an
    # exception group; a group of several is not ours to interpret.
    while True:
        inner = getattr(error, "exceptions", None)
        if not isinstance(inner, tuple) or len(inner) != 1:
            return error
        error = inner[0]


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: HeaderList, *, prefix: str = ""
) -> None:
    """Send a complete JSON response; ``prefix="websocket."`` sends it as a handshake denial."""
    payload = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
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
