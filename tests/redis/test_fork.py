"""fork() with a limiter in use (moderato/redis/forks.py), on a real redis-server.

The parent has an open event loop and a live connection when it forks. The
child closes its inherited loop, checks on a loop of its own and closes the
limiter; it must never touch the parent's socket. Both go on deciding, with
exact counts, and the parent keeps the very connection it had.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from fork_helpers import in_child_of_loop as in_child
from redis_servers import RedisServer

from moderato import RateLimiter
from moderato.backends.denial_cache import DenialCachingBackend
from moderato.redis import RedisClient

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")

RATE = "10/hour"


@pytest.fixture
def parent_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop the parent keeps open (not running) across the fork, as an app server's."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def client_of(limiter: RateLimiter) -> RedisClient:
    client = getattr(limiter.backend, "client", None)
    assert isinstance(client, RedisClient)
    return client


async def remaining_after(limiter: RateLimiter, identity: str, checks: int) -> list[int]:
    results = [await limiter.check_with_info(identity, RATE) for _ in range(checks)]
    assert all(result.allowed for result in results)
    return [result.remaining for result in results]


def test_a_child_that_closes_its_inherited_loop_leaves_the_parent_connection_alone(
    redis_server: RedisServer, redis_url: str, parent_loop: asyncio.AbstractEventLoop
) -> None:
    run = parent_loop.run_until_complete
    limiter = RateLimiter(redis_url, key_prefix="fork", default_algorithm="token_bucket")
    assert run(remaining_after(limiter, "parent", 3)) == [9, 8, 7]
    client = client_of(limiter)

    async def parent_connections() -> list[Any]:
        return list(client.connections())

    (connection,) = run(parent_connections())

    async def child() -> list[int]:
        remaining = await remaining_after(limiter, "child", 4)
        await limiter.close()  # sweeps the closed inherited loop's pool too
        return remaining

    assert in_child(child, close_inherited=parent_loop) == [9, 8, 7, 6]
    # The parent's next checks succeed, on the connection it had before the fork.
    assert run(remaining_after(limiter, "parent", 3)) == [6, 5, 4]
    assert run(parent_connections()) == [connection]
    assert connection.pid == os.getpid()
    run(limiter.close())


def test_a_child_reconnects_on_first_use_and_both_decide_exactly(
    redis_server: RedisServer, redis_url: str, parent_loop: asyncio.AbstractEventLoop
) -> None:
    """The child opens a connection of its own (a new client id on the server)."""
    run = parent_loop.run_until_complete
    limiter = RateLimiter(redis_url, key_prefix="fork2")
    run(limiter.check_with_info("parent", RATE))

    async def parent_client_id() -> int:
        reply: int = await client_of(limiter).execute("CLIENT", "ID")
        return reply

    parent_id = run(parent_client_id())

    async def child() -> list[int]:
        child_id: int = await client_of(limiter).execute("CLIENT", "ID")
        remaining = await remaining_after(limiter, "shared", 5)
        await limiter.close()
        return [child_id, *remaining]

    child_id, *child_remaining = in_child(child, close_inherited=parent_loop)
    assert child_id != parent_id
    assert child_remaining == [9, 8, 7, 6, 5]
    assert run(parent_client_id()) == parent_id
    assert run(remaining_after(limiter, "shared", 5)) == [4, 3, 2, 1, 0]
    assert not run(limiter.check_with_info("shared", RATE)).allowed
    run(limiter.close())


def test_the_parent_denial_cache_keeps_its_subscription_across_a_fork(
    redis_server: RedisServer, redis_url: str, parent_loop: asyncio.AbstractEventLoop
) -> None:
    """The child drops the inherited subscription untouched and subscribes on its own;
    a reset after the child is gone still reaches the parent's cache."""
    run = parent_loop.run_until_complete
    limiter = RateLimiter(redis_url, key_prefix="fork3", denial_cache_size=100)
    backend = limiter.backend
    assert isinstance(backend, DenialCachingBackend)
    cache = backend.cache

    async def denied_until_remembered(identity: str) -> None:
        for _ in range(3):
            await limiter.check_with_info(identity, "1/hour")
        await until(lambda: cache.subscribed)
        assert not (await limiter.check_with_info(identity, "1/hour")).allowed
        assert len(cache) == 1

    run(denied_until_remembered("parent"))

    async def child() -> list[int]:
        assert not cache.subscribed and len(cache) == 0
        await denied_until_remembered("child")
        await limiter.close()
        return [len(cache)]

    assert in_child(child, close_inherited=parent_loop) == [0]
    assert cache.subscribed and len(cache) == 1

    async def reset_elsewhere() -> None:
        async with RateLimiter(redis_url, key_prefix="fork3") as other:
            await other.reset("parent")
        await until(lambda: len(cache) == 0)
        assert (await limiter.check_with_info("parent", "1/hour")).allowed

    run(reset_elsewhere())
    run(limiter.close())


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)
