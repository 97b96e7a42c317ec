"""Decisions made by the Lua scripts inside Redis."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Callable, Union

from ..algorithms import RESET_SUFFIXES, Algorithm, ScriptArg
from ..plans import Plan
from ..policy import SCALE
from ..redis import ClusterClient, RedisClient, RedisClientError, SentinelClient
from ..results import CheckResult
from ..scripts import RESET_SCRIPT, load_script
from ..steps import run_async
from .announce import announcement_failed, reset_announcement
from .base import DirectDecisions, KeySpaceBound, Part, cluster_routes
from .composite import composite_call
from .redis_py import RedisPyClient
from .replies import DecisionReply, decoded, split_replies, translated
from .scan import as_count, deletion, literal_hash_tag

Execute = Callable[..., Awaitable[Any]]
"""A client's (or one node's) ``execute``."""


class RedisBackend(DirectDecisions, KeySpaceBound):
    """Runs the scripts through a RedisClient (one server), a ClusterClient (a cluster),
    a SentinelClient (the primary the sentinels name) or a RedisPyClient (a user's
    own redis-py client).

    They route the same calls: every key of one decision shares a hash tag, so
    a decision is one script call on one node; a reset within one scope
    SCANs with the identity's hash tag in its MATCH pattern, so on a cluster
    it walks only the node owning that slot; a reset of every scope has no
    literal hash tag and walks every primary.
    """

    synchronous = False
    """Every decision waits for a reply."""

    def __init__(
        self, client: Union[RedisClient, ClusterClient, SentinelClient, RedisPyClient]
    ) -> None:
        self.client = client
        self.node_of, self.reload_routes = cluster_routes(client, isinstance(client, ClusterClient))

    def start_check(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> Awaitable[Any]:
        args = (
            plan.unit_args if cost_scaled == SCALE and apply else plan.arguments(cost_scaled, apply)
        )
        # The client's future itself, no coroutine around it: this is every check's path.
        return self.client.evalsha(load_script(plan.script_name), keys, args)

    def finish_check(self, plan: Plan, sent: object, reply: Any) -> CheckResult:
        return decoded(plan, reply)

    def check_failed(self, plan: Plan, sent: object, error: BaseException) -> BaseException:
        return translated(error, plan.algorithm.name)

    async def connect(self) -> None:
        try:
            await self.client.connect()
        except RedisClientError as error:
            raise translated(error) from None

    async def close(self) -> None:
        try:
            await self.client.close()
        except RedisClientError as error:
            raise translated(error) from None

    async def direct_reply(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> object:
        try:
            return await self.client.evalsha(load_script(algorithm.name), keys, args)
        except RedisClientError as error:
            raise translated(error, algorithm.name) from None

    async def decide_together(self, parts: Sequence[Part]) -> list[DecisionReply]:
        call = composite_call(parts)
        try:
            reply = await self.client.evalsha(call.script, call.keys, call.arguments)
        except RedisClientError as error:
            raise translated(error, call.script.name) from None
        return split_replies(call.key_counts, reply)

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        script = load_script(RESET_SCRIPT)
        try:
            deleted = await self.client.evalsha(script, keys, [*windows_s, *RESET_SUFFIXES])
        except RedisClientError as error:
            raise translated(error, script.name) from None
        return as_count(deleted, script.name)

    async def announce_reset(self) -> None:
        client = self.client
        if not isinstance(client, RedisClient):
            return  # only a single server's limiters remember denials
        try:
            await client.execute(*reset_announcement(self.keyspace.prefix))
        except RedisClientError as error:
            announcement_failed(error)

    async def delete_matching(self, pattern: bytes) -> int:
        try:
            return await self._delete_matching(pattern)
        except RedisClientError as error:
            raise translated(error) from None

    async def _delete_matching(self, pattern: bytes) -> int:
        client = self.client
        cluster = isinstance(client, ClusterClient) or (
            isinstance(client, RedisPyClient) and client.is_cluster
        )
        if not cluster or literal_hash_tag(pattern):
            # One server, or one slot's owner (the client routes SCAN by the hash tag).
            return await _scan_and_unlink(client.execute, client.execute, pattern, cluster)
        # No one slot holds the matches: walk every primary.
        scanners: list[Execute]
        if isinstance(client, ClusterClient):
            await client.connect()  # loads the slot map: the primaries are known
            scanners = [client.node_client(name).execute for name in client.primaries()]
        else:
            assert isinstance(client, RedisPyClient)
            scanners = await client.primary_executors()
        deleted = 0
        for scan in scanners:
            deleted += await _scan_and_unlink(scan, client.execute, pattern, cluster)
        return deleted


async def _scan_and_unlink(scan: Execute, unlink: Execute, pattern: bytes, cluster: bool) -> int:
    """SCAN with ``scan`` for ``pattern`` and UNLINK what it finds with ``unlink`` (scan.py)."""
    return await run_async(
        deletion(pattern, cluster),
        lambda command: (scan if command[0] == "SCAN" else unlink)(*command),
    )
