"""The error responses of every web integration: status and JSON body, framework-free.

- RateLimitExceeded, temporary: 429
  ``{"error": "Rate limit exceeded", "retry_after": 7, "limit": 100}``
- RateLimitExceeded, cost above capacity: 422
  ``{"error": "Rate limit exceeded", "retry_after": null, "limit": 100}``
- BackendError: 503 ``{"error": "Rate limit backend unavailable"}``
- RateLimitCallbackError: 503 ``{"error": "Rate limit callback failed", "callback": "key"}``

A 503 carries no quota or retry headers: the backend did not decide, so
nothing is known about the quota. The ASGI middlewares send these straight
over ASGI (integrations/responses.py), the Django integration as an
HttpResponse; both encode the body with ``encoded_body``.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple, Optional

from ..errors import BackendError, RateLimitCallbackError, RateLimitExceeded

JSON_CONTENT_TYPE = "application/json"


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


def _single_leaf(error: BaseException) -> BaseException:
    # Task groups (anyio, BaseHTTPMiddleware) may wrap the one real error in an
    # exception group; a group of several is not ours to interpret.
    while True:
        inner = getattr(error, "exceptions", None)
        if not isinstance(inner, tuple) or len(inner) != 1:
            return error
        error = inner[0]


_ENCODED_MAX = 256
"""Bodies remembered by encoded_body: a flood repeats a handful (retry_after counts down)."""
_encoded_bodies: dict[tuple[tuple[str, Any], ...], bytes] = {}


def encoded_body(body: dict[str, Any]) -> bytes:
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
