"""What a new connection says first, and what its replies mean (both clients' connections).

The RESP2 greeting of an address: AUTH, SELECT, CLIENT SETNAME, whichever
apply, else a PING; then ROLE when the connection requires a role (a
Sentinel client's primary must be a master on every connect, reconnects
included: a server can be demoted while a client is away from it). A TCP
accept alone proves little (the kernel accepts for a paused server), so
"ready" always means Redis itself answered.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._encoding import encode_command
from .errors import RedisConnectionError, RedisReplyError
from .url import RedisAddress

__all__ = ["greeting", "refused_steps"]


def greeting(
    address: RedisAddress, client_name: str | None, *, role: str | None = None
) -> tuple[list[str], list[bytes]]:
    """(step names, encoded commands) of the greeting, sent in one write."""
    steps: list[str] = []
    payloads: list[bytes] = []
    if address.password is not None:
        if address.username is not None:
            payloads.append(encode_command("AUTH", address.username, address.password))
        else:
            payloads.append(encode_command("AUTH", address.password))
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
