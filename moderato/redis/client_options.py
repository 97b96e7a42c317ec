"""What both clients (asyncio and blocking) check in their options, and their reconnect pacing.

One place for the rules, so a setting means the same on either client.
"""

from __future__ import annotations

import math
import ssl

from .url import RedisAddress, client_name_problem

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_START_S",
    "checked_client_name",
    "checked_ssl_context",
    "positive_seconds",
    "reconnect_delay_s",
]

# After a connect fails, new connects wait this long, doubling per failure up
# to the cap: a dead server is not hammered, and a returning one is found
# within BACKOFF_CAP_S.
BACKOFF_START_S = 0.025
BACKOFF_CAP_S = 0.5


def reconnect_delay_s(failures: int) -> float:
    """How long after the ``failures``-th failed connect in a row the next one may start."""
    delay_s: float = BACKOFF_START_S * 2.0 ** (failures - 1)
    return min(delay_s, BACKOFF_CAP_S)


def positive_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def checked_ssl_context(
    ssl_context: ssl.SSLContext | None, address: RedisAddress
) -> ssl.SSLContext | None:
    """``ssl_context`` if it may be used for ``address`` (only a TLS address takes one)."""
    if ssl_context is None:
        return None
    if not isinstance(ssl_context, ssl.SSLContext):
        raise TypeError(f"ssl_context must be an ssl.SSLContext, got {type(ssl_context).__name__}")
    if not address.tls:
        raise ValueError(f"ssl_context was given but {address} is not a TLS address; use rediss://")
    return ssl_context


def checked_client_name(client_name: str | None, address: RedisAddress) -> str | None:
    """The name sent with CLIENT SETNAME: an explicit one wins over the URL's ``?client_name=``."""
    if client_name is None:
        return address.client_name
    if not isinstance(client_name, str):
        raise TypeError(f"client_name must be a str, got {type(client_name).__name__}")
    problem = client_name_problem(client_name)
    if problem:
        raise ValueError(problem)
    return client_name
