"""What a new connection says first, and what its replies mean (both clients' connections).

The RESP2 greeting of an address: AUTH, SELECT, CLIENT SETNAME, whichever
apply, else a PING. A TCP accept alone proves little (the kernel accepts for
a paused server), so "ready" always means Redis itself answered.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._encoding import encode_command
from .errors import RedisConnectionError, RedisReplyError
from .url import RedisAddress

__all__ = ["greeting", "refused_steps"]


def greeting(address: RedisAddress, client_name: str | None) -> tuple[list[str], list[bytes]]:
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
    if not steps:
        payloads.append(encode_command("PING"))
        steps.append("PING")
    return steps, payloads


def refused_steps(label: str, steps: Sequence[str], replies: Sequence[object]) -> None:
    """Raise RedisConnectionError naming every step Redis refused, if any.

    A refused SELECT must never let a command run in the wrong database, so
    one refusal fails the whole connection.
    """
    failures = [
        f"{step} was refused: {reply.message}"
        for step, reply in zip(steps, replies)
        if isinstance(reply, RedisReplyError)
    ]
    if failures:
        raise RedisConnectionError(f"{label}: {'; '.join(failures)}")
