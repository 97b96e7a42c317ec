"""What both Sentinel clients (asyncio and blocking) decide without I/O.

Which server the sentinels name (their ``get-master-addr-by-name`` reply, or
``SENTINEL MASTER`` with its configuration epoch and ``SENTINEL REPLICAS``),
whether the server named is a primary (its ``ROLE`` reply), which error
replies mean the primary moved, and the order in which sentinels are asked.
sentinel.py and blocking/sentinel.py do the asking with them.
"""

from __future__ import annotations

import contextlib
import math
from time import monotonic
from typing import Any, Optional

from .errors import RedisClientError, RedisConnectionError
from .url import SentinelAddress

__all__ = [
    "RETRY_INTERVAL_S",
    "SentinelState",
    "host_port",
    "moved_primary",
    "not_a_primary",
    "primary_named",
    "sentinel_fields",
]

# While the sentinels keep naming a server that is not a primary (a failover
# in progress), they are asked again at most this often.
RETRY_INTERVAL_S = 0.05


# A replica a sentinel flags so cannot be promoted by it.
DOWN_FLAGS = frozenset({"s_down", "o_down", "disconnected"})


def host_port(at: tuple[str, int]) -> str:
    host, port = at
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def moved_primary(message: str) -> bool:
    """Whether an error reply means the server is no primary any more: ``READONLY``
    (demoted to a replica, it refused the write, nothing ran)."""
    return "READONLY" in message


def not_a_primary(role: Any, where: tuple[str, int], service: str) -> Optional[str]:
    """Why the server the sentinels named may not be decided on, from its ROLE reply;
    None when it is a master."""
    if isinstance(role, list) and role and role[0] == b"master":
        return None
    shown = role[0].decode() if isinstance(role, list) and role else repr(role)
    return (
        f"{host_port(where)}, named primary of {service!r} by the sentinels, is a {shown} "
        "(a failover in progress?)"
    )


class SentinelState:
    """The sentinels of one address: whom to ask first, what they said, and when to ask again."""

    def __init__(self, address: SentinelAddress) -> None:
        self.address = address
        self.order = list(address.sentinels)
        self.retry_at = 0.0
        self.last_error: Optional[RedisClientError] = None

    def too_soon(self) -> Optional[RedisConnectionError]:
        """The error to fail with while the last discovery's failure is fresh, else None."""
        wait_s = self.retry_at - monotonic()
        if wait_s > 0 and self.last_error is not None:
            return RedisConnectionError(
                f"{self.last_error}; next sentinel query in {math.ceil(wait_s * 1000)} ms"
            )
        return None

    def failed(self, error: RedisClientError) -> None:
        self.retry_at = monotonic() + RETRY_INTERVAL_S
        self.last_error = error

    def found(self) -> None:
        self.last_error = None

    def answer(
        self, at: tuple[str, int], reply: Any, problems: list[str]
    ) -> Optional[tuple[str, int]]:
        """The primary a sentinel's reply names (it is asked first next time), or None
        with the reason added to ``problems``."""
        name = self.address.service_name
        if reply is None:
            problems.append(f"sentinel {host_port(at)} does not monitor {name!r}")
            return None
        with contextlib.suppress(ValueError, TypeError, IndexError, AttributeError):
            where = (reply[0].decode(), int(reply[1]))
            self.order.remove(at)
            self.order.insert(0, at)
            return where
        problems.append(f"sentinel {host_port(at)} replied {reply!r}")
        return None

    def unreachable(
        self, at: tuple[str, int], error: RedisClientError, problems: list[str]
    ) -> None:
        problems.append(f"sentinel {host_port(at)}: {error}")

    def none_named(self, problems: list[str]) -> RedisConnectionError:
        name = self.address.service_name
        return RedisConnectionError(
            f"no sentinel of {self.address} named a primary for {name!r}: " + "; ".join(problems)
        )


def primary_named(master: Any, replicas: Any) -> Optional[tuple[tuple[str, int], int, int]]:
    """(where, configuration epoch, replicas up) from ``SENTINEL MASTER`` and ``SENTINEL
    REPLICAS`` replies; None if the first names no address. A replica counts as up
    unless the sentinel flags it down or cannot reach it (it could not promote it)."""
    fields = sentinel_fields(master)
    try:
        where = (fields["ip"], int(fields["port"]))
        epoch = int(fields.get("config-epoch", "0"))
    except (KeyError, ValueError):
        return None
    up = 0
    if isinstance(replicas, list):
        for replica in replicas:
            flags = set(sentinel_fields(replica).get("flags", "").split(","))
            if not flags & DOWN_FLAGS:
                up += 1
    return where, epoch, up


def sentinel_fields(reply: Any) -> dict[str, str]:
    """A sentinel's flat [name, value, name, value, ...] reply as a dict of str."""
    if not isinstance(reply, list):
        return {}
    pairs = zip(reply[::2], reply[1::2])
    return {
        name.decode(errors="replace"): value.decode(errors="replace")
        for name, value in pairs
        if isinstance(name, bytes) and isinstance(value, bytes)
    }
