"""Who is asking: the client address (proxy-aware) or an API key.

Forwarding headers are only believed when the direct peer is a trusted proxy:
anyone can send ``X-Forwarded-For``, so from an untrusted peer it would let a
client pick its own identity and escape its limit.
"""

from __future__ import annotations

import ipaddress
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


def _forwarded_for(values: Sequence[str]) -> list[str]:
    # RFC 7239: elements separated by ",", pairs by ";"; only "for=" names a hop.
    hops: list[str] = []
    for value in values:
        for element in value.split(","):
            for pair in element.split(";"):
                name, _, hop = pair.strip().partition("=")
                if name.strip().lower() == "for" and hop:
                    hops.append(hop.strip())
    return hops


class ClientIdentity:
    """The default ``key`` callback: an API key if configured and sent, else the client IP.

    ``trusted_proxies`` lists the CIDRs of reverse proxies in front of the app.
    Only when the direct peer is one of them is ``proxy_header`` read, and the
    client is the right-most hop that is not itself a trusted proxy: hops
    further left were written by the client and may be forged. Name the one
    header your proxy sets: a header it merely passes through is client-written.

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
        if self.proxy_header == "forwarded":
            hops = _forwarded_for(values)
        elif self.proxy_header == "x-real-ip":
            # One value, written by the proxy; several headers mean it was not overwritten.
            hops = [values[-1]] if values else []
        else:
            hops = [hop for value in values for hop in value.split(",")]
        # Walk from the proxy towards the client; stop at the first untrusted hop.
        nearest: str = str(peer)
        for hop in reversed([hop.strip() for hop in hops if hop.strip()]):
            address = parse_address(hop)
            if address is None:
                # A trusted proxy wrote something that is not an address ("unknown",
                # an obfuscated node name): it cannot be resolved further, so that
                # token is the client as far as this proxy chain can tell.
                return hop.strip().strip('"').lower()
            if not self._trusted(address):
                return str(address)
            nearest = str(address)
        # Every hop is a trusted proxy: the left-most one is the closest to a client.
        return nearest


def _header_values(scope: Scope, name: str) -> list[str]:
    wanted = name.encode("latin-1")
    return [
        value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == wanted
    ]


DEFAULT_IDENTITY = ClientIdentity()
"""The direct peer's address; no proxy headers are believed."""
