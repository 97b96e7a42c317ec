"""What the one-call checks' tests over Redis share (tests/redis/test_fast_redis.py,
the blocking limiter's; tests/redis/test_fast_aredis.py, the asyncio limiter's):
counting the checks the Python path sends, the state a limiter left in Redis, and
a result without what moves with the clock."""

from __future__ import annotations

from typing import Any

from redis_servers import RedisServer


class Counted:
    """Counts a client's evalsha() calls (either client): the checks the Python path sent."""

    def __init__(self, client: Any) -> None:
        self.calls = 0
        evalsha = client.evalsha

        def counted(*args: Any) -> Any:
            self.calls += 1
            return evalsha(*args)

        client.evalsha = counted


def redis_state(server: RedisServer, prefix: str) -> dict[bytes, Any]:
    """Every key under ``prefix`` (the prefix cut off) with its type and value."""
    import redis

    connection = redis.Redis(port=server.port)
    try:
        state: dict[bytes, Any] = {}
        for key in connection.scan_iter(match=f"{prefix}:*".encode()):
            kind = connection.type(key)
            if kind == b"string":
                value: Any = connection.get(key)
            elif kind == b"hash":
                value = sorted(connection.hgetall(key).items())
            elif kind == b"zset":
                value = connection.zcard(key)
            else:
                value = kind
            state[key[len(prefix) :]] = (kind, value)
        return state
    finally:
        connection.close()


def comparable(result: Any) -> Any:
    """A result without what moves with the clock between two checks (an error's
    (type, message) as it is)."""
    if isinstance(result, tuple):
        return result
    return (
        result.allowed,
        result.limit,
        result.remaining,
        result.rate,
        result.algorithm,
        result.window_seconds,
        result.bypassed,
        result.shadow_denied,
        [(p.limit, p.remaining, p.window_seconds, p.refill) for p in result.policies],
    )


def twin_cases(algorithm: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Checks of ``algorithm`` for a limiter and its Python twin: those the one-call
    path takes (a scope, two policies, shadow mode, the defaults spelled out) and
    those it leaves to the Python method (a tenant, a cost of 2, a key it refuses)."""
    return [
        (("u1", "3/minute"), {"algorithm": algorithm}),
        (("u1", "3/minute"), {"algorithm": algorithm, "scope": "GET /a"}),
        (("u2", "3/minute;5/hour"), {"algorithm": algorithm}),
        (("u3", "2/minute"), {"algorithm": algorithm, "shadow": True}),
        (("u4", "2/minute"), {"algorithm": algorithm, "cost": 1, "tenant": None}),
        (("u5", "4/minute"), {"algorithm": algorithm, "tenant": "t"}),
        (("u6", "4/minute"), {"algorithm": algorithm, "cost": 2}),
        (("bad key", "3/minute"), {"algorithm": algorithm}),
    ]
