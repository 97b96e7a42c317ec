"""A user's own blocking redis-py client (``redis.Redis`` or ``redis.cluster.RedisCluster``)
as the blocking RateLimiter's connection.

The blocking twin of redis_py.py (which tells why): the same commands and
scripts through the user's client, its exceptions turned into moderato's.
redis-py is imported only when such a client is given.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Callable

from ..redis import Arg, ScriptLike
from ..redis.errors import RedisReplyError
from .redis_py import ErrorMap, _label, _NoScript, _word, scan_node, scan_reply

__all__ = ["BlockingRedisPyClient", "is_blocking_redis_py_client"]


def is_blocking_redis_py_client(candidate: object) -> bool:
    """Whether ``candidate`` is a blocking redis-py ``Redis`` or ``RedisCluster`` client.

    Looks at the type's module first, so nothing imports redis-py for a URL.
    """
    if not type(candidate).__module__.startswith("redis."):
        return False
    import redis
    import redis.cluster

    return isinstance(candidate, (redis.Redis, redis.cluster.RedisCluster))


class BlockingRedisPyClient:
    """Runs moderato's commands and scripts through a user's blocking redis-py client.

    The client stays the user's: its pool, timeouts, retries and TLS settings
    apply, and ``close()`` leaves it open (whoever made it closes it).
    """

    def __init__(self, client: Any) -> None:
        if not is_blocking_redis_py_client(client):
            raise TypeError(
                f"expected a redis.Redis or redis.cluster.RedisCluster, got {type(client).__name__}"
            )
        import redis.cluster

        self.client = client
        self.is_cluster = isinstance(client, redis.cluster.RedisCluster)
        self._label = _label(client, self.is_cluster)
        self._errors = ErrorMap(self._label)

    def __repr__(self) -> str:
        return f"<BlockingRedisPyClient {self._label}>"

    def execute(self, *args: Arg) -> Any:
        """Run one command; replies as the user's client decodes them."""
        if self.is_cluster and _word(args[0]) == "SCAN":
            return self._scan_on(self._scan_node(args), *args)
        return self._guard(lambda: self.client.execute_command(*args))

    def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """EVALSHA; after NOSCRIPT, SCRIPT LOAD and the call again; after a second, EVAL."""
        run = self.client.execute_command
        for _ in range(2):
            try:
                return self._guard(
                    lambda: run("EVALSHA", script.sha, len(keys), *keys, *args), no_script=True
                )
            except _NoScript:
                try:
                    self._guard(lambda: run("SCRIPT", "LOAD", script.source))
                except RedisReplyError:
                    break  # refused (an ACL without script|load): the source it is
        return self._guard(lambda: run("EVAL", script.source, len(keys), *keys, *args))

    def connect(self) -> None:
        """Check that the client reaches Redis (PING)."""
        self._guard(lambda: self.client.execute_command("PING"))

    def close(self) -> None:
        """Nothing: the client belongs to the caller, who closes it."""

    def primary_executors(self) -> list[Callable[..., Any]]:
        """One ``execute`` per primary of the cluster, for a SCAN no hash tag confines."""
        return [functools.partial(self._scan_on, node) for node in self.client.get_primaries()]

    def _guard(self, call: Callable[[], Any], no_script: bool = False) -> Any:
        try:
            return call()
        except self._errors.known as error:
            raise self._errors.translated(error, no_script) from None

    def _scan_on(self, node: Any, *args: Arg) -> Any:
        return scan_reply(
            self._guard(lambda: self.client.execute_command(*args, target_nodes=node))
        )

    def _scan_node(self, args: Sequence[Arg]) -> Any:
        return scan_node(self.client, args)
