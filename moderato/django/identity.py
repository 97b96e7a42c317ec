"""``client_ip(request)``: the client's address as moderato identifies it, for your own keys."""

from __future__ import annotations

from django.http import HttpRequest

from .keys import client_address
from .limiters import get_settings


def client_ip(request: HttpRequest) -> str:
    """``REMOTE_ADDR``, or the right-most forwarded hop that is not a trusted proxy when
    the peer is one of ``MODERATO['TRUSTED_PROXIES']`` (what ``key="ip"`` uses)."""
    return client_address(request, get_settings().proxy_rules)
