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
from typing import Any, NamedTuple, Optional

from starlette.types import Scope, Send

from ..errors import BackendError, RateLimitCallbackError, RateLimitExceeded
from .decisions import recorded
from .headers import HeaderList, HeaderStyle, legacy_for_denial, render, report


class ErrorResponse(NamedTuple):
    # A NamedTuple, not a frozen dataclass: built for every denied request of a
    # flood, and a frozen dataclass's __init__ costs several times a tuple's.
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
    if style == "legacy":  # the default: no Report needed (tests/test_headers_fast_path.py)
        return legacy_for_denial(recorded(scope), response.denial)
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
    payload = _encoded(body)
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


_ENCODED_MAX = 256
"""Bodies remembered by _encoded: a flood repeats a handful (retry_after counts down)."""
_encoded_bodies: dict[tuple[tuple[str, Any], ...], bytes] = {}


def _encoded(body: dict[str, Any]) -> bytes:
    """``body`` as compact JSON; the few distinct error bodies are encoded once each."""
    key = tuple(body.items())
    try:
        return _encoded_bodies[key]
    except KeyError:
        pass
    except TypeError:  # a value that cannot be a key: encode it every time
        return _dumps(body)
    payload = _dumps(body)
    if len(_encoded_bodies) >= _ENCODED_MAX:
        _encoded_bodies.clear()
    _encoded_bodies[key] = payload
    return payload


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
