"""``limiter.message_limit(...)``: a limit on the messages of an open websocket.

The handshake is limited by the decorator, the dependency or the middleware;
once a socket is open, messages are what costs. ``await messages.check(ws)``
decides and charges one message and returns the decision (a CheckResult). It
never raises for a denial and never closes the socket: the application
chooses to drop the message, tell the client, or close. Backend and callback
failures do raise (BackendError, RateLimitCallbackError), under the
limiter's failure policy, as for a manual ``check_with_info``.

Every connection of one identity shares the quota: by default the bucket is
``WS-MESSAGE:<route template>`` (``WS-MESSAGE:/chat``), apart from the
handshakes' ``WS:/chat``, and the identity is the limiter's default key or
the client address, as for HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.websockets import WebSocket

from ..results import CheckResult
from ..specs import MESSAGE_OPTIONS, MessageOptions, RateSpec
from .declared import declare
from .rule import LimitRule, check_options
from .scope import WEBSOCKET_METHOD, route_scope

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..limiter import RateLimiter

MESSAGE_SCOPE_PREFIX = "WS-MESSAGE:"


class MessageLimit:
    """A per-message limit for use inside a websocket handler; see the module docstring."""

    def __init__(
        self, limiter: RateLimiter, rate: RateSpec, **options: Unpack[MessageOptions]
    ) -> None:
        check_options("message_limit()", options, MESSAGE_OPTIONS)
        self.rule = LimitRule(limiter, rate, **options)
        self.rule.origin = "limiter.message_limit"
        declare(self.rule)

    async def check(self, websocket: WebSocket) -> CheckResult:
        """Charge one message for this socket's identity; the decision, admitted or denied."""
        return await self.rule.decide(websocket, self.rule.scope or message_scope(websocket))


def message_scope(websocket: WebSocket) -> str:
    """``WS-MESSAGE:/chat`` for a socket whose handshake scope is ``WS:/chat``."""
    handshake = route_scope(websocket.scope)
    return MESSAGE_SCOPE_PREFIX + handshake[len(WEBSOCKET_METHOD) + 1 :]
