"""Decisions made by the Lua scripts inside Redis."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from ..algorithms import Algorithm, ScriptArg
from ..errors import BackendError, RateLimitConfigError, RedisReplyError
from ..redis import ClusterClient, RedisClient
from ..scripts import load_script
from .base import DecisionReply

_SCAN_BATCH = 1000


def _script_error(script: str, error: RedisReplyError) -> Exception:
    # The scripts prefix their own refusals, so a bad argument from a direct
    # caller reads as a configuration error rather than an outage.
    if error.message.startswith("MODERATO_ARG"):
        return RateLimitConfigError(f"{script}: {error.message}")
    return error


class RedisBackend:
    """Runs the scripts through a RedisClient (one server) or a ClusterClient (a cluster).

    Both route the same calls: every key of one decision shares a hash tag, so
    a decision is one script call on one node; reset's SCAN carries the
    identity's hash tag in its MATCH pattern, so on a cluster it walks only the
    node owning that slot.
    """

    def __init__(self, client: Union[RedisClient, ClusterClient]) -> None:
        self.client = client

    async def connect(self) -> None:
        await self.client.connect()

    async def close(self) -> None:
        await self.client.close()

    async def decide(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        script = load_script(algorithm.script)
        try:
            reply: DecisionReply = await self.client.evalsha(script, keys, args)
        except RedisReplyError as error:
            raise _script_error(script.name, error) from None
        return reply

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        script = load_script("reset")
        try:
            deleted = await self.client.evalsha(script, keys, windows_s)
        except RedisReplyError as error:
            raise _script_error(script.name, error) from None
        return _as_count(deleted, script.name)

    async def delete_matching(self, pattern: bytes) -> int:
        deleted = 0
        cursor: Any = b"0"
        while True:
            reply = await self.client.execute(
                "SCAN", cursor, "MATCH", pattern, "COUNT", _SCAN_BATCH
            )
            cursor, found = reply[0], reply[1]
            if found:
                deleted += _as_count(await self.client.execute("UNLINK", *found), "UNLINK")
            if cursor in (b"0", 0, "0"):
                return deleted


def _as_count(reply: object, what: str) -> int:
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise BackendError(f"{what} replied {reply!r}, expected an integer count")
    return reply
