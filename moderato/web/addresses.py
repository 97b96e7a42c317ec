"""The client's address: the direct peer, or a forwarded hop only a trusted proxy vouches for.

Forwarding headers are only believed when the direct peer is a trusted proxy:
anyone can send ``X-Forwarded-For``, so from an untrusted peer it would let a
client pick its own identity and escape its limit. The rules here know no
web framework: the ASGI integration reads the peer and the headers from the
ASGI scope, the Django one from ``request.META``, and both ask ``ProxyRules``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Callable, Literal, Optional, Union

from ..errors import RateLimitConfigError

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
ProxyHeader = Literal["x-forwarded-for", "forwarded", "x-real-ip"]

PROXY_HEADERS: tuple[ProxyHeader, ...] = ("x-forwarded-for", "forwarded", "x-real-ip")

UNKNOWN_CLIENT = "unknown"
"""Identity of a request with no peer address (e.g. a Unix socket without a proxy)."""

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

HeaderValues = Callable[[Any, str], Sequence[str]]
"""The values of one request header, from the request (whatever the framework's
request is) and the header's lower-case name, in the order received."""

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


def check_proxy_header(proxy_header: object) -> ProxyHeader:
    if proxy_header not in PROXY_HEADERS:
        raise RateLimitConfigError(
            f"proxy_header must be one of {', '.join(PROXY_HEADERS)}, got {proxy_header!r:.80}"
        )
    return proxy_header


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


parsed_peer = _peer
"""``_peer``, for the one-limit check (integrations/stack.py), which asks it directly:
``ProxyRules.client_address`` for a peer no proxy is trusted for is its second item."""


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


class ProxyRules:
    """Which peers are trusted proxies, and which header they set.

    ``client_address`` gives the direct peer unless it is one of
    ``trusted_proxies``; then the client is the right-most hop of
    ``proxy_header`` that is not itself a trusted proxy: hops further left
    were written by the client and may be forged. Name the one header your
    proxy sets: a header it merely passes through is client-written. At most
    ``MAX_FORWARDED_HOPS`` hops are read (see there for what a longer chain of
    trusted proxies yields).
    """

    def __init__(
        self, trusted_proxies: Iterable[str] = (), proxy_header: object = "x-forwarded-for"
    ) -> None:
        self.proxy_header = check_proxy_header(proxy_header)
        self.trusted_proxies = parse_networks(trusted_proxies)
        self._warned_long_chain = False

    def client_address(
        self, peer_text: Optional[str], header_values: HeaderValues, request: Any
    ) -> str:
        """The client's canonical address (or the peer's text when it is no address);
        ``UNKNOWN_CLIENT`` without a peer. ``header_values(request, name)`` is called
        only when the peer is a trusted proxy."""
        if not peer_text:
            return UNKNOWN_CLIENT
        peer, canonical = _peer(peer_text)
        if peer is None or not self.trusted_proxies or not self.trusted(peer):
            return canonical
        return self._forwarded_client(header_values(request, self.proxy_header), peer)

    def trusted(self, address: IPAddress) -> bool:
        return any(address in network for network in self.trusted_proxies)

    def _forwarded_client(self, values: Sequence[str], peer: IPAddress) -> str:
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
            if not self.trusted(address):
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
