"""Decisions made by the Lua scripts inside Redis, for the blocking RateLimiter.

The asyncio RedisBackend's twin (redis.py): the same scripts on the same
keys with the same arguments, the same error mapping and reply decoding
(base.py), the same reset (scan.py), through a blocking client: one server,
a cluster, the primary Sentinel names, or a user's own redis-py client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Union

from .. import _accel
from ..algorithms import RESET_SUFFIXES, Algorithm, ScriptArg
from ..plans import Plan
from ..policy import SCALE
from ..redis.blocking import ClusterClient, RedisClient, SentinelClient
from ..redis.errors import RedisClientError
from ..results import CheckResult
from ..scripts import RESET_SCRIPT, load_script
from ..steps import run
from .announce import announcement_failed, reset_announcement
from .base import KeySpaceBound, Part, cluster_routes
from .composite import composite_call
from .redis_py_blocking import BlockingRedisPyClient
from .replies import DecisionReply, malformed, split_replies, translated
from .scan import as_count, deletion, literal_hash_tag

__all__ = ["BlockingRedisBackend"]

BlockingClient = Union[RedisClient, ClusterClient, SentinelClient, BlockingRedisPyClient]
Execute = Callable[..., Any]


class BlockingRedisBackend(KeySpaceBound):
    """The BlockingBackend protocol over a blocking Redis client (see the module doc)."""

    def __init__(self, client: BlockingClient) -> None:
        self.client = client
        self.node_of, self.reload_routes = cluster_routes(client, isinstance(client, ClusterClient))

    def check_now(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> CheckResult:
        args = (
            plan.unit_args if cost_scaled == SCALE and apply else plan.arguments(cost_scaled, apply)
        )
        try:
            reply = self.client.evalsha(load_script(plan.script_name), keys, args)
        except RedisClientError as error:
            raise translated(error, plan.algorithm.name) from None
        try:  # decoded(plan, reply), written out: this is every check's path
            result: CheckResult = _accel.check_result(reply, plan.result_shape)
        except (TypeError, ValueError) as error:
            raise malformed(plan.algorithm.name, error) from None
        return result

    def decide_now(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        try:
            reply: DecisionReply = self.client.evalsha(load_script(algorithm.name), keys, args)
        except RedisClientError as error:
            raise translated(error, algorithm.name) from None
        return reply

    def decide_together_now(self, parts: Sequence[Part]) -> list[DecisionReply]:
        call = composite_call(parts)
        try:
            reply = self.client.evalsha(call.script, call.keys, call.arguments)
        except RedisClientError as error:
            raise translated(error, call.script.name) from None
        return split_replies(call.key_counts, reply)

    def reset_now(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        script = load_script(RESET_SCRIPT)
        try:
            deleted = self.client.evalsha(script, keys, [*windows_s, *RESET_SUFFIXES])
        except RedisClientError as error:
            raise translated(error, script.name) from None
        return as_count(deleted, script.name)

    def delete_matching_now(self, pattern: bytes) -> int:
        client = self.client
        cluster = isinstance(client, ClusterClient) or (
            isinstance(client, BlockingRedisPyClient) and client.is_cluster
        )
        try:
            if not cluster or literal_hash_tag(pattern):
                # One server, or one slot's owner (the client routes SCAN by the hash tag).
                return _scan_and_unlink(client.execute, client.execute, pattern, cluster)
            # No one slot holds the matches: walk every primary.
            scanners: list[Execute]
            if isinstance(client, ClusterClient):
                client.connect()  # loads the slot map: the primaries are known
                scanners = [client.node_client(name).execute for name in client.primaries()]
            else:
                assert isinstance(client, BlockingRedisPyClient)
                scanners = client.primary_executors()
            return sum(
                _scan_and_unlink(scan, client.execute, pattern, cluster) for scan in scanners
            )
        except RedisClientError as error:
            raise translated(error) from None

    def announce_reset_now(self) -> None:
        client = self.client
        if not isinstance(client, RedisClient):
            return  # only a single server's limiters remember denials
        try:
            client.execute(*reset_announcement(self.keyspace.prefix))
        except RedisClientError as error:
            announcement_failed(error)

    def connect_now(self) -> None:
        try:
            self.client.connect()
        except RedisClientError as error:
            raise translated(error) from None

    def close_now(self) -> None:
        self.client.close()


def _scan_and_unlink(scan: Execute, unlink: Execute, pattern: bytes, cluster: bool) -> int:
    """SCAN with ``scan`` for ``pattern`` and UNLINK what it finds with ``unlink`` (scan.py)."""
    return run(
        deletion(pattern, cluster),
        lambda command: (scan if command[0] == "SCAN" else unlink)(*command),
    )
