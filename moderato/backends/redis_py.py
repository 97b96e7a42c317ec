"""A user's own redis-py client (``redis.asyncio.Redis`` or ``RedisCluster``) as moderato's.

For applications whose connection set-up (Sentinel, IAM tokens, custom pools,
retries) already lives in redis-py: the RateLimiter runs the same Lua scripts
through that client. redis-py is an optional extra (``moderato[redis-py]``);
this module imports it only when given such a client, so moderato imports
without it.

The adapter offers what RedisBackend calls (execute, evalsha, connect, close)
and turns redis-py's exceptions into moderato's: an error reply becomes
RedisReplyError (so a script's MODERATO_ARG refusal still reads as a
configuration error), anything that kept the command from being answered
(connection, timeout, cluster down) RedisConnectionError.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Sequence
from typing import Any, Callable

from ..redis import Arg, ScriptLike
from ..redis.errors import RedisConnectionError, RedisReplyError

__all__ = ["RedisPyClient", "is_redis_py_client"]


def is_redis_py_client(candidate: object) -> bool:
    """Whether ``candidate`` is a ``redis.asyncio`` Redis or RedisCluster client.

    Looks at the type's module first, so nothing imports redis-py for a URL.
    """
    if not type(candidate).__module__.startswith("redis."):
        return False
    import redis.asyncio
    import redis.asyncio.cluster

    return isinstance(candidate, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster))


class RedisPyClient:
    """Runs moderato's commands and scripts through a user's redis-py asyncio client.

    The client stays the user's: its timeouts, retries and TLS settings apply,
    and ``close()`` leaves it open (whoever made it closes it).
    """

    def __init__(self, client: Any) -> None:
        if not is_redis_py_client(client):
            raise TypeError(
                "expected a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster, "
                f"got {type(client).__name__}"
            )
        import redis.asyncio.cluster
        import redis.exceptions

        self.client = client
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._label = _label(client, self._cluster)
        self._errors = ErrorMap(self._label, asyncio.TimeoutError)

    def __repr__(self) -> str:
        return f"<RedisPyClient {self._label}>"

    async def execute(self, *args: Arg) -> Any:
        """Run one command; replies as the user's client decodes them."""
        if self._cluster and _word(args[0]) == "SCAN":
            return await self._scan_on(self._scan_node(args), *args)
        return await self._guard(lambda: self.client.execute_command(*args))

    async def evalsha(self, script: ScriptLike, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        """EVALSHA; after NOSCRIPT (a flush, a restart, a failover) EVAL, which caches it."""
        client = self.client
        try:
            return await self._guard(
                lambda: client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args),
                no_script=True,
            )
        except _NoScript:
            return await self._guard(
                lambda: client.execute_command("EVAL", script.source, len(keys), *keys, *args)
            )

    async def connect(self) -> None:
        """Check that the client reaches Redis (redis-py connects on first use)."""
        if self._cluster:
            await self._guard(self.client.initialize)
        await self._guard(lambda: self.client.execute_command("PING"))

    async def close(self) -> None:
        """Nothing: the client belongs to the caller, who closes it."""

    async def _guard(self, call: Callable[[], Awaitable[Any]], no_script: bool = False) -> Any:
        try:
            return await call()
        except self._errors.known as error:
            raise self._errors.translated(error, no_script) from None

    @property
    def is_cluster(self) -> bool:
        return self._cluster

    async def primary_executors(self) -> list[Callable[..., Awaitable[Any]]]:
        """One ``execute`` per primary of the cluster, for a SCAN no hash tag confines."""
        await self._guard(self.client.initialize)
        return [functools.partial(self._scan_on, node) for node in self.client.get_primaries()]

    async def _scan_on(self, node: Any, *args: Arg) -> Any:
        reply = await self._guard(lambda: self.client.execute_command(*args, target_nodes=node))
        return scan_reply(reply)

    def _scan_node(self, args: Sequence[Arg]) -> Any:
        return scan_node(self.client, args)


def scan_node(client: Any, args: Sequence[Arg]) -> Any:
    """The node of a redis-py cluster a SCAN goes to: the owner of its MATCH pattern's
    hash tag."""
    names = [_word(arg) for arg in args]
    if "MATCH" not in names:
        raise RedisConnectionError(
            "SCAN on a Redis Cluster needs a MATCH pattern with a {hash tag}"
        )
    return client.get_node_from_key(args[names.index("MATCH") + 1])


def scan_reply(reply: Any) -> list[Any]:
    """``[cursor, keys]`` of a SCAN sent to one node of a redis-py cluster."""
    cursor, found = reply
    if isinstance(cursor, dict):  # redis-py keys a cluster SCAN's cursor by node
        (cursor,) = cursor.values()
    return [cursor, found]


class ErrorMap:
    """redis-py's exceptions as moderato's, for the asyncio and the blocking adapter: an
    error reply is a RedisReplyError (or _NoScript), a failure a RedisConnectionError."""

    def __init__(self, label: str, *failures: type[BaseException]) -> None:
        import redis.exceptions

        self.label = label
        self.reply_errors = (redis.exceptions.ResponseError,)
        self.no_script = redis.exceptions.NoScriptError
        self.known: tuple[type[BaseException], ...] = (
            *self.reply_errors,
            redis.exceptions.RedisError,
            OSError,
            *failures,
        )
        """What ``translated`` takes (the client's own failures: ``failures``)."""

    def translated(self, error: BaseException, no_script: bool) -> Exception:
        if isinstance(error, self.reply_errors):
            if no_script and isinstance(error, self.no_script):
                return _NoScript()
            return RedisReplyError(_message(error))
        reason = str(error) or type(error).__name__
        return RedisConnectionError(f"{self.label}: {reason}")


class _NoScript(Exception):
    """The EVALSHA was answered NOSCRIPT: send the script's source."""


def _label(client: Any, cluster: bool) -> str:
    """``redis-py Redis at host:port`` for messages (the client's repr is a page long)."""
    kind = "RedisCluster" if cluster else "Redis"
    if cluster:
        nodes = getattr(client, "startup_nodes", None) or []
        where = ",".join(getattr(node, "name", "?") for node in nodes)
    else:
        settings = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
        where = settings.get("path") or f"{settings.get('host')}:{settings.get('port')}"
    return f"redis-py {kind} client at {where}"


def _word(arg: Arg) -> str:
    text = bytes(arg).decode("latin-1") if isinstance(arg, (bytes, bytearray)) else str(arg)
    return text.upper()


def _message(error: BaseException) -> str:
    text = str(error)
    # redis-py drops the reply's error code from some subclasses' text; put it back.
    code = getattr(type(error), "__name__", "")
    if code == "NoScriptError" and not text.startswith("NOSCRIPT"):
        return f"NOSCRIPT {text}"
    if code == "ReadOnlyError" and not text.startswith("READONLY"):
        return f"READONLY {text}"
    return text
