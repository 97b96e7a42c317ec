"""How a new connection reaches its server, what it says first, and what the replies mean
(both clients' connections, and the asyncio subscriptions).

The RESP2 greeting of an address: AUTH, SELECT, CLIENT SETNAME, whichever
apply, else a PING; then ROLE when the connection requires a role (a
Sentinel client's primary must be a master on every connect, reconnects
included: a server can be demoted while a client is away from it). A TCP
accept alone proves little (the kernel accepts for a paused server), so
"ready" always means Redis itself answered.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any, Callable

from ._encoding import encode_command
from .errors import RedisConnectionError, RedisReplyError
from .url import RedisAddress

__all__ = ["authentication", "greeting", "open_transport", "refused_steps"]


async def open_transport(
    loop: asyncio.AbstractEventLoop,
    protocol: Callable[[], asyncio.BaseProtocol],
    address: RedisAddress,
    ssl_context: ssl.SSLContext | None,
) -> Any:
    """Open an asyncio connection to ``address``: its unix socket, else TCP, with TLS
    when the address asks for it (``ssl_context``, else the system's defaults)."""
    if address.unix_path is not None:
        return await loop.create_unix_connection(protocol, address.unix_path)
    if address.tls:
        return await loop.create_connection(
            protocol,
            address.host,
            address.port,
            ssl=ssl_context or ssl.create_default_context(),
            server_hostname=address.host,
        )
    return await loop.create_connection(protocol, address.host, address.port)


def authentication(address: RedisAddress) -> bytes | None:
    """The encoded AUTH an address needs (None without a password): what every
    connection sends first, subscriptions included."""
    if address.password is None:
        return None
    if address.username is not None:
        return encode_command("AUTH", address.username, address.password)
    return encode_command("AUTH", address.password)


def greeting(
    address: RedisAddress, client_name: str | None, *, role: str | None = None
) -> tuple[list[str], list[bytes]]:
    """(step names, encoded commands) of the greeting, sent in one write."""
    steps: list[str] = []
    payloads: list[bytes] = []
    auth = authentication(address)
    if auth is not None:
        payloads.append(auth)
        steps.append("AUTH")
    if address.db:
        payloads.append(encode_command("SELECT", address.db))
        steps.append(f"SELECT {address.db}")
    if client_name is not None:
        payloads.append(encode_command("CLIENT", "SETNAME", client_name))
        steps.append("CLIENT SETNAME")
    if role is not None:
        payloads.append(encode_command("ROLE"))
        steps.append("ROLE")
    if not steps:
        payloads.append(encode_command("PING"))
        steps.append("PING")
    return steps, payloads


def refused_steps(
    label: str, steps: Sequence[str], replies: Sequence[object], *, role: str | None = None
) -> None:
    """Raise RedisConnectionError naming every step Redis refused, if any, and a ROLE
    reply that names another role than ``role``.

    A refused SELECT must never let a command run in the wrong database, nor a
    server of the wrong role get a command, so one refusal fails the whole
    connection.
    """
    failures = [
        f"{step} was refused: {reply.message}"
        for step, reply in zip(steps, replies)
        if isinstance(reply, RedisReplyError)
    ]
    for step, reply in zip(steps, replies):
        if step == "ROLE" and not isinstance(reply, RedisReplyError):
            reported = reply[0] if isinstance(reply, list) and reply else None
            shown = reported.decode(errors="replace") if isinstance(reported, bytes) else None
            if shown != role:
                failures.append(
                    f"it is a {shown or repr(reply)}, not a {role} (ROLE); "
                    "no command was sent to it"
                )
    if failures:
        raise RedisConnectionError(f"{label}: {'; '.join(failures)}")
