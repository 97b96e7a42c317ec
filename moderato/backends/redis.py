"""Decisions made by the Lua scripts inside Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Callable, Optional, Union

from ..algorithms import Algorithm, ScriptArg
from ..errors import BackendError, RedisReplyError
from ..redis import ClusterClient, RedisClient, SentinelClient
from ..scripts import load_script
from .base import DecisionReply, script_refusal
from .redis_py import RedisPyClient

_SCAN_BATCH = 1000


class RedisBackend:
    """Runs the scripts through a RedisClient (one server), a ClusterClient (a cluster)
    a SentinelClient (the primary the sentinels name) or a RedisPyClient (a user's
    own redis-py client).

    Both route the same calls: every key of one decision shares a hash tag, so
    a decision is one script call on one node; reset's SCAN carries the
    identity's hash tag in its MATCH pattern, so on a cluster it walks only the
    node owning that slot.
    """

    def __init__(
        self, client: Union[RedisClient, ClusterClient, SentinelClient, RedisPyClient]
    ) -> None:
        self.client = client
        # On a cluster, the node owning a key: the limiter keeps a circuit
        # breaker per node, so one failing primary does not stop the others.
        self.node_of: Optional[Callable[[bytes], Optional[str]]] = (
            client.node_for_key if isinstance(client, ClusterClient) else None
        )

    async def connect(self) -> None:
        await self.client.connect()

    async def close(self) -> None:
        await self.client.close()

    def decide(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> Awaitable[DecisionReply]:
        # The client's future itself, no coroutine around it: this is every
        # check's path. A refusal arrives as RedisReplyError; the limiter maps
        # it with script_refusal().
        return self.client.evalsha(load_script(algorithm.script), keys, args)

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        script = load_script("reset")
        try:
            deleted = await self.client.evalsha(script, keys, windows_s)
        except RedisReplyError as error:
            raise script_refusal(script.name, error) from None
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
