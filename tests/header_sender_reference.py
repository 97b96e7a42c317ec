"""The headers middleware's send wrapper in Python: the reference csrc/fast_route.c's
HeaderSender is held to (tests/unit/test_header_sender.py).

It is the wrapper middleware.py used before the C one: made per request as
``HeaderSender(scope, send, style)``, called with every message, it adds the request's
decision headers to the response start.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

from moderato.integrations.decisions import DECISIONS, HEADERS_DONE
from moderato.web.headers import HeaderStyle, legacy_for_one, render, report


class HeaderSender:
    """``send`` with the decision headers added to the response start."""

    __slots__ = ("scope", "send", "started", "style")

    def __init__(self, scope: dict[str, Any], send: Any, style: HeaderStyle) -> None:
        self.scope = scope
        self.send = send
        self.style = style
        self.started = False

    def __call__(self, message: dict[str, Any]) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            self.started = True
            scope = self.scope
            if not scope.get(HEADERS_DONE):
                scope[HEADERS_DONE] = True
                decisions = scope.get(DECISIONS)
                if decisions:
                    extra = None
                    if self.style == "legacy" and len(decisions) == 1:
                        extra = legacy_for_one(decisions[0])  # one admitted decision
                    if extra is None:
                        decision_report = report(decisions)
                        extra = (
                            []
                            if decision_report is None
                            else render(decision_report, self.style, time.time())
                        )
                    if extra:
                        headers = list(message.get("headers", ()))
                        present = set()
                        for name, _ in headers:
                            present.add(name.lower())
                        # The application's own values win (its handler's Retry-After).
                        for pair in extra:
                            if pair[0] not in present:
                                headers.append(pair)
                        message = {**message, "headers": headers}
        result: Awaitable[None] = self.send(message)
        return result
