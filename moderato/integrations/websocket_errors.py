"""How a websocket handshake is refused: before ``accept``, never after.

A refused handshake must not become an open socket. Servers that offer the
ASGI denial-response extension (``websocket.http.response``; uvicorn does)
let the application answer the upgrade request with an ordinary HTTP
response: the same 429 (422, 503), body and headers as an HTTP request gets.
Elsewhere the only refusal ASGI has is ``websocket.close`` before
``accept``, with close code 1008 (policy violation) for a denial and 1011
(internal error) when the backend or a callback could not decide; servers
usually turn that into an HTTP 403 on the wire.

Two forms of the same refusal:

- ``websocket_error``: the exception a decorator or dependency raises, which
  the framework's exception handling turns into the refusal (an
  HTTPException subclass is sent as a denial response by Starlette; a
  ``WebSocketException`` closes);
- ``refuse``: the ASGI messages themselves, for the middleware, which runs
  before any framework.
"""

from __future__ import annotations

from typing import Optional

from starlette.exceptions import WebSocketException
from starlette.types import Scope, Send

from ..errors import ModeratoError, RateLimitExceeded
from ..web.headers import HeaderStyle
from ..web.responses import ErrorResponse, error_response
from .http_errors import http_error
from .responses import denial_headers, send_json

DENIAL_EXTENSION = "websocket.http.response"

POLICY_VIOLATION = 1008
"""Close code of a denied handshake where no denial response can be sent."""
INTERNAL_ERROR = 1011
"""Close code when the backend or a callback could not decide."""


def is_websocket(scope: Scope) -> bool:
    return scope.get("type") == "websocket"


def offers_denial_response(scope: Scope) -> bool:
    return DENIAL_EXTENSION in (scope.get("extensions") or {})


def websocket_error(error: ModeratoError, scope: Scope) -> Optional[Exception]:
    """The exception that refuses this handshake, or None for an error that is not moderato's."""
    if offers_denial_response(scope):
        return http_error(error, scope)
    response = error_response(error)
    if response is None:
        return None
    return WebSocketException(_close_code(response), _reason(response))


async def refuse(error: Exception, scope: Scope, send: Send, style: HeaderStyle) -> bool:
    """Refuse the handshake for a moderato exception; False (nothing sent) for any other."""
    response = error_response(error)
    if response is None:
        return False
    if not offers_denial_response(scope):
        await send(
            {"type": "websocket.close", "code": _close_code(response), "reason": _reason(response)}
        )
        return True
    headers = denial_headers(response, scope, style)
    await send_json(send, response.status, response.body, headers, prefix="websocket.")
    return True


def _close_code(response: ErrorResponse) -> int:
    return POLICY_VIOLATION if isinstance(response.denial, RateLimitExceeded) else INTERNAL_ERROR


def _reason(response: ErrorResponse) -> str:
    return str(response.body["error"])
