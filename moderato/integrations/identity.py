"""Who is asking: the client address (proxy-aware) or an API key.

Forwarding headers are only believed when the direct peer is a trusted proxy:
anyone can send ``X-Forwarded-For``, so from an untrusted peer it would let a
client pick its own identity and escape its limit.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Literal, Optional, Union

from starlette.requests import HTTPConnection
from starlette.types import Scope

from ..errors import RateLimitConfigError

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
ProxyHeader = Literal["x-forwarded-for", "forwarded", "x-real-ip"]

UNKNOWN_CLIENT = "unknown"
"""Identity of a request with no peer address (e.g. a Unix socket without a proxy)."""

API_KEY_PREFIX = "apikey:"
"""Keeps API keys and IP addresses apart, so a client cannot send a key that
spells another client's address and drain that address's quota."""

_PROXY_HEADERS: tuple[ProxyHeader, ...] = ("x-forwarded-for", "forwarded", "x-real-ip")

MAX_FORWARDED_HOPS = 32
"""The most proxy-header elements examined per request, right-most first.

Real proxy chains are a handful of hops; without a bound, a header of
thousands of trusted hops would cost each request milliseconds to tenths of
a second of CPU. When every examined hop is a trusted proxy and the header
holds more, the client is taken to be the left-most examined hop: a trusted
proxy, so every such request through it shares that proxy's one quota.
That is stricter than reading further, never looser: nothing beyond the
cap can give a request an identity of its own choosing.
"""

logger = logging.getLogger("moderato")


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """Parse trusted-proxy CIDRs ("10.0.0.0/8", "::1", ...); a bad one is a config error."""
    if isinstance(cidrs, str):
        # A bare string would iterate per character; accept it as one network.
        cidrs = (cidrs,)
    networks: list[IPNetwork] = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr, strict=False))
        except (TypeError, ValueError):
            raise RateLimitConfigError(
                f"trusted proxy {cidr!r:.80} is not an IP address or CIDR such as '10.0.0.0/8'"
            ) from None
    return tuple(networks)


def parse_address(text: str) -> Optional[IPAddress]:
    """An address from a header or peer: strips ports, brackets and quotes; None if invalid."""
    value = text.strip().strip('"')
    if value.startswith("["):
        # "[2001:db8::1]:4711" (Forwarded, RFC 7239) or "[2001:db8::1]"
        end = value.find("]")
        value = value[1:end] if end > 0 else value
    elif value.count(":") == 1:
        # "192.0.2.1:8080": one colon can only be an IPv4 port separator.
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # A dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d; one client, one identity.
        return address.ipv4_mapped
    return address


@lru_cache(maxsize=4096)
def _peer(text: str) -> tuple[Optional[IPAddress], str]:
    """The connection's peer address and its canonical text (the text itself if invalid).

    Cached: a server sees the same peers (its proxies, its busy clients) again
    and again, and parsing an address costs more than the rest of the check.
    """
    address = parse_address(text)
    return address, text if address is None else str(address)


def _rightmost_elements(values: Sequence[str], limit: int) -> tuple[list[str], bool]:
    """Up to ``limit`` comma-separated elements, nearest the server first.

    Several header lines read as one list, the last line last. Also says
    whether elements were left unread: ``rsplit`` stops after ``limit``
    commas, so the work is bounded however long the header is.
    """
    elements: list[str] = []
    for value in reversed(values):
        room = limit - len(elements)
        if room == 0:
            return elements, True
        parts = value.rsplit(",", room)
        if len(parts) > room:  # parts[0] is what lies beyond the limit
            elements.extend(reversed(parts[1:]))
            return elements, True
        elements.extend(reversed(parts))
    return elements, False


def _forwarded_for(element: str) -> str:
    # RFC 7239: pairs separated by ";"; only "for=" names a hop ("" if absent).
    for pair in element.split(";"):
        name, _, hop = pair.strip().partition("=")
        if name.strip().lower() == "for" and hop:
            return hop
    return ""


class ClientIdentity:
    """The default ``key`` callback: an API key if configured and sent, else the client IP.

    ``trusted_proxies`` lists the CIDRs of reverse proxies in front of the app.
    Only when the direct peer is one of them is ``proxy_header`` read, and the
    client is the right-most hop that is not itself a trusted proxy: hops
    further left were written by the client and may be forged. Name the one
    header your proxy sets: a header it merely passes through is client-written.
    At most ``MAX_FORWARDED_HOPS`` hops are read (see there for what a longer
    chain of trusted proxies yields).

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
        if proxy_header not in _PROXY_HEADERS:
            raise RateLimitConfigError(
                f"proxy_header must be one of {', '.join(_PROXY_HEADERS)}, got {proxy_header!r}"
            )
        if api_key_header is not None and (
            not isinstance(api_key_header, str) or not api_key_header
        ):
            raise RateLimitConfigError("api_key_header must be a non-empty header name or None")
        self.trusted_proxies = parse_networks(trusted_proxies)
        self.proxy_header = proxy_header
        self.api_key_header = api_key_header.lower() if api_key_header else None
        self._warned_long_chain = False

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
        peer, canonical = _peer(str(client[0]))
        if peer is None or not self.trusted_proxies or not self._trusted(peer):
            return canonical
        return self._forwarded_client(scope, peer)

    def _trusted(self, address: IPAddress) -> bool:
        return any(address in network for network in self.trusted_proxies)

    def _forwarded_client(self, scope: Scope, peer: IPAddress) -> str:
        values = _header_values(scope, self.proxy_header)
        if self.proxy_header == "x-real-ip":
            # One value, written by the proxy; several headers mean it was not overwritten.
            elements, unread = ([values[-1]] if values else []), False
        else:
            elements, unread = _rightmost_elements(values, MAX_FORWARDED_HOPS)
        forwarded = self.proxy_header == "forwarded"
        # Walk from the proxy towards the client; stop at the first untrusted hop.
        nearest: str = str(peer)
        for element in elements:
            hop = (_forwarded_for(element) if forwarded else element).strip()
            if not hop:
                continue
            address = parse_address(hop)
            if address is None:
                # A trusted proxy wrote something that is not an address ("unknown",
                # an obfuscated node name): it cannot be resolved further, so that
                # token is the client as far as this proxy chain can tell.
                return hop.strip('"').lower()
            if not self._trusted(address):
                return str(address)
            nearest = str(address)
        if unread:
            self._warn_long_chain(nearest)
        # Every hop read is a trusted proxy: the left-most one is the closest to a
        # client (past MAX_FORWARDED_HOPS, a proxy whose one quota they all share).
        return nearest

    def _warn_long_chain(self, identity: str) -> None:
        if self._warned_long_chain:
            return
        self._warned_long_chain = True
        logger.warning(
            "moderato: a %s header held more than %d hops, all trusted proxies as far as "
            "read; such requests are limited as the last hop read (%s), sharing its quota. "
            "Check trusted_proxies if this is not an attack (logged once)",
            self.proxy_header,
            MAX_FORWARDED_HOPS,
            identity,
        )


def _header_values(scope: Scope, name: str) -> list[str]:
    wanted = name.encode("latin-1")
    return [
        value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == wanted
    ]


DEFAULT_IDENTITY = ClientIdentity()
"""The direct peer's address; no proxy headers are believed."""
