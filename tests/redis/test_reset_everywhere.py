"""reset(identity) without a scope or rate: every scope, rate and algorithm of that identity.

On one Redis, on a Redis Cluster (every primary) and on memory://; through
HTTP for a decorated route that answered 429.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio.cluster
from cluster import RedisCluster
from fastapi import FastAPI, Request
from http_helpers import client
from redis_servers import PATIENT_TIMEOUT_S, running

from moderato import RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.integrations import RateLimitHeadersMiddleware
from moderato.keys import KeySpace, narrowed
from moderato.policy import policy_for


@pytest.fixture(params=["redis", "memory"])
async def limiter(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[RateLimiter]:
    url = redis_url if request.param == "redis" else "memory://"
    async with RateLimiter(url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="rs") as made:
        yield made


async def used(limiter: RateLimiter, key: str, rate: str, **where: str) -> int:
    usage = await limiter.get_usage(key, rate, **where)
    current: int = usage["current"]
    return current


async def test_a_429_route_admits_again_after_reset_of_the_ip(
    limiter: RateLimiter,
) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/items")
    @limiter.limit("2/minute")
    async def items(request: Request) -> dict[str, bool]:
        return {"ok": True}

    @app.post("/orders")
    @limiter.limit("2/minute;10/hour", algorithm="token_bucket")
    async def orders(request: Request) -> dict[str, bool]:
        return {"ok": True}

    async with client(app, ip="10.0.0.7") as http, client(app, ip="10.0.0.8") as other:
        assert [(await http.get("/items")).status_code for _ in range(3)] == [200, 200, 429]
        assert [(await http.post("/orders")).status_code for _ in range(3)] == [200, 200, 429]
        assert (await other.get("/items")).status_code == 200
        # One fixed-window counter, two token buckets (one per policy).
        assert await limiter.reset("10.0.0.7") == 3
        assert [(await http.get("/items")).status_code for _ in range(3)] == [200, 200, 429]
        assert [(await http.post("/orders")).status_code for _ in range(3)] == [200, 200, 429]
        # The other client kept its usage.
        assert [(await other.get("/items")).status_code for _ in range(2)] == [200, 429]
        assert await limiter.reset("10.0.0.7") == 3
        assert await limiter.reset("10.0.0.7") == 0


async def test_every_scope_and_algorithm_but_only_the_no_tenant_keys(
    limiter: RateLimiter,
) -> None:
    for algorithm in ALGORITHMS:
        for scope in ("global", "GET:/a", "POST:/b/{id}"):
            await limiter.check("user", "5/minute;50/day", scope=scope, algorithm=algorithm)
    await limiter.check("user", "5/minute", scope="api", tenant_type="gold")
    await limiter.check("user", "5/minute", scope="api", tenant_type="silver")
    await limiter.check("user2", "5/minute", scope="api")
    # Two policies in three scopes for each algorithm; the tenants' keys stay.
    assert await limiter.reset("user") == 2 * 3 * len(ALGORITHMS)
    for algorithm in ALGORITHMS:
        for scope in ("global", "GET:/a"):
            usage = await used(limiter, "user", "5/minute;50/day", scope=scope, algorithm=algorithm)
            assert usage == 0
    assert await used(limiter, "user", "5/minute", scope="api", tenant_type="gold") == 1
    assert await used(limiter, "user2", "5/minute", scope="api") == 1
    # With a tenant: that tenant's keys only, in every scope.
    assert await limiter.reset("user", tenant_type="gold") == 1
    assert await used(limiter, "user", "5/minute", scope="api", tenant_type="gold") == 0
    assert await used(limiter, "user", "5/minute", scope="api", tenant_type="silver") == 1


async def test_rate_and_algorithm_narrow_a_reset_of_every_scope(limiter: RateLimiter) -> None:
    for scope in ("a", "b"):
        await limiter.check("user", "5/minute", scope=scope)
        await limiter.check("user", "5/minute", scope=scope, algorithm="token_bucket")
        await limiter.check("user", "5/hour", scope=scope)
        await limiter.check("user", "5/10minutes", scope=scope)
    # Only the 60 s window (not 600 s, whose digits start alike), fixed window only.
    assert await limiter.reset("user", rate="5/minute", algorithm="fixed_window") == 2
    assert await used(limiter, "user", "5/minute", scope="a") == 0
    assert await used(limiter, "user", "5/minute", scope="b", algorithm="token_bucket") == 1
    assert await used(limiter, "user", "5/10minutes", scope="a") == 1
    assert await limiter.reset("user", rate="5/minute") == 2
    assert await limiter.reset("user", algorithm="fixed_window") == 4
    assert await limiter.reset("user") == 0


@pytest.mark.parametrize(
    ("target", "bystanders"),
    [
        ("a*", ["a", "ab", "a%2A"]),
        ("*", ["a", "b"]),
        ("[ab]", ["a", "b"]),
        ("a?", ["ab"]),
        ("a\\b", ["ab"]),
        ("x" * 200, ["x" * 199, "x" * 201]),  # hashed components
        ("a:b}", ["a", "b"]),
    ],
)
async def test_glob_characters_and_long_identities_reach_only_themselves(
    limiter: RateLimiter, target: str, bystanders: list[str]
) -> None:
    for identity in (target, *bystanders):
        await limiter.check(identity, "5/minute", scope="s1")
        await limiter.check(identity, "5/minute", scope="s2")
    assert await limiter.reset(target) == 2
    for identity in bystanders:
        assert await used(limiter, identity, "5/minute", scope="s1") == 1
        assert await used(limiter, identity, "5/minute", scope="s2") == 1
    assert await used(limiter, target, "5/minute", scope="s1") == 0


async def test_a_longer_prefix_is_out_of_reach(redis_url: str) -> None:
    async with (
        RateLimiter(redis_url, key_prefix="app") as short,
        RateLimiter(redis_url, key_prefix="app:x") as longer,
    ):
        await short.check("user", "10/minute", scope="s")
        await longer.check("user", "10/minute", scope="s")
        assert await short.reset("user") == 1
        assert await used(longer, "user", "10/minute", scope="s") == 1


async def test_an_identity_secret_resets_the_hashed_identity(redis_url: str) -> None:
    secret = b"0123456789abcdef"
    async with RateLimiter(redis_url, key_prefix="sec", identity_secret=secret) as limiter:
        await limiter.check("1.2.3.4", "5/minute", scope="a")
        await limiter.check("1.2.3.4", "5/minute", scope="b")
        await limiter.check("1.2.3.5", "5/minute", scope="a")
        assert await limiter.reset("1.2.3.4") == 2
        assert await used(limiter, "1.2.3.5", "5/minute", scope="a") == 1


def test_reset_patterns_splice_scope_tag_and_windows() -> None:
    pattern = b"p:??:{t::id}:*"
    assert narrowed(pattern, 1, every_scope=True, key_tag=None, windows_s=None) == [
        b"p:??:{t:*:id}:*"
    ]
    assert narrowed(pattern, 1, every_scope=True, key_tag="tb", windows_s=(60, 3600)) == [
        b"p:tb:{t:*:id}:60",
        b"p:tb:{t:*:id}:60:*",
        b"p:tb:{t:*:id}:3600",
        b"p:tb:{t:*:id}:3600:*",
    ]


def test_the_keyspace_gives_a_reset_its_keys_and_patterns() -> None:
    space = KeySpace("p", None, "fw")
    assert space.reset_patterns("id", "t", None, key_tag="tb", windows_s=(60,)) == [
        b"p:tb:{t:*:id}:60",
        b"p:tb:{t:*:id}:60:*",
    ]
    assert space.reset_patterns("id", None, "api", key_tag=None, windows_s=None) == [
        b"p:??:{:api:id}:*"
    ]
    assert space.reset_keys(["fw", "tb"], policy_for("1/minute;2/hour"), "id", None, "api") == [
        b"p:fw:{:api:id}:60",
        b"p:fw:{:api:id}:3600",
        b"p:tb:{:api:id}:60",
        b"p:tb:{:api:id}:3600",
    ]


# -- Redis Cluster: one identity's scopes lie in many slots, on every shard ----------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    yield from running(RedisCluster(replicas=0))


@pytest.mark.slow
@pytest.mark.parametrize("client", ["moderato", "redis-py"])
async def test_reset_of_every_scope_walks_every_primary(cluster: RedisCluster, client: str) -> None:
    scopes = [f"GET:/route/{n}" for n in range(30)]
    seed = cluster.shards()[0].primary
    redis_py = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=seed)
    target: Any = cluster.url if client == "moderato" else redis_py
    cluster.flushall()
    try:
        async with RateLimiter(target, key_prefix="rsc") as limiter:
            for scope in scopes:
                await limiter.check("10.1.1.1", "5/minute", scope=scope)
                await limiter.check("10.1.1.1", "5/minute", scope=scope, algorithm="gcra")
                await limiter.check("10.1.1.2", "5/minute", scope=scope)
            shards_used = {cluster.owner(slot) for slot in _slots("10.1.1.1", scopes)}
            assert len(shards_used) == len(cluster.shards())  # the keys really are spread
            assert await limiter.reset("10.1.1.1") == 2 * len(scopes)
            for scope in scopes:
                assert await used(limiter, "10.1.1.1", "5/minute", scope=scope) == 0
                assert await used(limiter, "10.1.1.2", "5/minute", scope=scope) == 1
            # Within one scope the hash tag is literal: one node, as before.
            assert await limiter.reset("10.1.1.2", scope=scopes[0]) == 1
            assert await limiter.reset("10.1.1.2") == len(scopes) - 1
            assert sum(cluster.dbsize().values()) == 0
    finally:
        await redis_py.aclose()


def _slots(identity: str, scopes: list[str]) -> set[int]:
    return {
        _accel.key_slot(_accel.build_keys("rsc", "fw", "", scope, identity, (60,))[0])
        for scope in scopes
    }
