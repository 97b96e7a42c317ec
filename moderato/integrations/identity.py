"""Who is asking: the client address (proxy-aware) or an API key.

The address rules (which peers are trusted proxies, which forwarded hop is
the client, the cap on hops read) are web/addresses.py's, shared with the
Django integration; this module reads the peer and the headers from the
ASGI scope.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from starlette.requests import HTTPConnection
from starlette.types import Scope

from ..errors import RateLimitConfigError
from ..web.addresses import UNKNOWN_CLIENT, ProxyHeader, ProxyRules

__all__ = ["API_KEY_PREFIX", "DEFAULT_IDENTITY", "UNKNOWN_CLIENT", "ClientIdentity"]

API_KEY_PREFIX = "apikey:"
"""Keeps API keys and IP addresses apart, so a client cannot send a key that
spells another client's address and drain that address's quota."""


class ClientIdentity:
    """The default ``key`` callback: an API key if configured and sent, else the client IP.

    ``trusted_proxies`` lists the CIDRs of reverse proxies in front of the app.
    Only when the direct peer is one of them is ``proxy_header`` read, and the
    client is the right-most hop that is not itself a trusted proxy: hops
    further left were written by the client and may be forged. Name the one
    header your proxy sets: a header it merely passes through is client-written.
    At most ``MAX_FORWARDED_HOPS`` hops are read (web/addresses.py says what a
    longer chain of trusted proxies yields).

    ``api_key_header`` (e.g. ``"X-API-Key"``) makes that header's value the
    identity when present, as ``"apikey:<value>"``. An unverified key lets a
    client start a fresh quota by sending a new key; verify keys upstream, or
    limit by IP as well.
    """

    def __init__(
        self,
        *,
        trusted_proxies: Iterable[str] = (),
        proxy_header: ProxyHeader = "x-forwarded-for",
        api_key_header: Optional[str] = None,
    ) -> None:
        rules = ProxyRules(trusted_proxies, proxy_header)
        if api_key_header is not None and (
            not isinstance(api_key_header, str) or not api_key_header
        ):
            raise RateLimitConfigError("api_key_header must be a non-empty header name or None")
        self.rules = rules
        self.trusted_proxies = rules.trusted_proxies
        self.proxy_header = rules.proxy_header
        self.api_key_header = api_key_header.lower() if api_key_header else None

    def __call__(self, request: HTTPConnection) -> str:
        return self.identify(request.scope)

    def identify(self, scope: Scope) -> str:
        if self.api_key_header is not None:
            api_key = _header_values(scope, self.api_key_header)
            if api_key and api_key[0].strip():
                return API_KEY_PREFIX + api_key[0].strip()
        return self.client_ip(scope)

    def client_ip(self, scope: Scope) -> str:
        client = scope.get("client")
        if not client:
            return UNKNOWN_CLIENT
        return self.rules.client_address(str(client[0]), _header_values, scope)


def _header_values(scope: Scope, name: str) -> list[str]:
    wanted = name.encode("latin-1")
    return [
        value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == wanted
    ]


DEFAULT_IDENTITY = ClientIdentity()
"""The direct peer's address; no proxy headers are believed."""
