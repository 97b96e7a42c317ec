"""The same guarantees over real TCP: uvicorn on a free loopback port, redis-server behind it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from http_helpers import rate_headers
from redis_servers import RedisServer
from uvicorn_helpers import Serve

from moderato import RateLimiter, install
from moderato.integrations import ClientIdentity, RateLimitHeadersMiddleware, RateLimitMiddleware


def seed_app(limiter: RateLimiter, hits: list[str]) -> FastAPI:
    # Seed 000's Basic Example shape: connect in the lifespan, close on shutdown.
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await limiter.connect()
        try:
            yield
        finally:
            await limiter.close()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(
        RateLimitMiddleware,
        limiter=limiter,
        rate="20/10 minutes",
        algorithm="token_bucket",
        exempt_paths=["/healthz"],
        scope="seed-burst",
        api_key_header="X-API-Key",  # seed 004 keys clients by API key; opt-in
    )

    @app.get("/work")
    async def work() -> dict[str, str]:
        hits.append("work")
        return {"done": "yes"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        hits.append("healthz")
        return {"status": "ok"}

    return app


async def test_seed_burst_over_tcp(redis_url: str, serve: Serve) -> None:
    hits: list[str] = []
    # 201 concurrent requests: a busy machine must not turn a late reply into a 503.
    limiter = RateLimiter(redis_url, key_prefix="tcp", command_timeout_s=10)
    base_url = await serve(seed_app(limiter, hits))
    limits = httpx.Limits(max_connections=50)
    # A loaded 2-core machine can take seconds to serve 221 requests through 50 connections.
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as http:
        burst = [http.get("/work", headers={"x-api-key": "burst"}) for _ in range(200)]
        other = http.get("/work", headers={"x-api-key": "bystander"})
        responses = await asyncio.gather(*burst[:100], other, *burst[100:])
        other_response = responses.pop(100)
        health = await asyncio.gather(*(http.get("/healthz") for _ in range(20)))
    statuses = [r.status_code for r in responses]
    assert (statuses.count(200), statuses.count(429)) == (20, 180)
    for response in responses:
        if response.status_code == 429:
            retry_after_s = int(response.headers["retry-after"])
            assert 1 <= retry_after_s <= 30
            assert response.json() == {
                "error": "Rate limit exceeded",
                "retry_after": retry_after_s,
                "limit": 20,
            }
    assert other_response.status_code == 200
    assert [r.status_code for r in health] == [200] * 20
    assert hits.count("work") == 21 and hits.count("healthz") == 20


async def test_paced_client_over_tcp_is_never_limited(redis_url: str, serve: Serve) -> None:
    limiter = RateLimiter(redis_url, key_prefix="tcp")
    app = FastAPI()
    app.add_middleware(
        RateLimitMiddleware, limiter=limiter, rate="20/second", algorithm="token_bucket"
    )

    @app.get("/work")
    async def work() -> dict[str, str]:
        return {}

    base_url = await serve(app)
    interval_s = 1 / 16  # 80% of the rate
    statuses = []
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        started = time.monotonic()
        for n in range(24):
            delay_s = started + n * interval_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            statuses.append((await http.get("/work", headers={"x-api-key": "paced"})).status_code)
    assert statuses == [200] * 24
    await limiter.close()


async def test_decorated_endpoint_and_proxy_identity_over_tcp(redis_url: str, serve: Serve) -> None:
    limiter = RateLimiter(redis_url, key_prefix="tcp", default_algorithm="token_bucket")
    behind_proxy = ClientIdentity(trusted_proxies=["127.0.0.1/32"])
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/api/users")
    @limiter.limit("2/hour")
    async def get_users(request: Request) -> dict[str, list[str]]:
        return {"users": ["Alice", "Bob"]}

    @app.post("/login")
    @limiter.limit("1/hour", key=behind_proxy)
    def login() -> dict[str, str]:
        return {"token": "t"}

    base_url = await serve(app)
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        # Direct clients: a forged X-Forwarded-For does not escape the limit.
        users = [
            await http.get("/api/users", headers={"x-forwarded-for": f"198.51.100.{n}"})
            for n in range(3)
        ]
        # Behind the (trusted) loopback proxy: the forwarded client is the identity.
        logins = [
            await http.post("/login", headers={"x-forwarded-for": forwarded})
            for forwarded in ("203.0.113.1", "203.0.113.2", "9.9.9.9, 203.0.113.1")
        ]
    assert [r.status_code for r in users] == [200, 200, 429]
    assert (users[0].headers["x-ratelimit-limit"], users[0].headers["x-ratelimit-remaining"]) == (
        "2",
        "1",
    )
    assert users[2].json()["limit"] == 2
    assert [r.status_code for r in logins] == [200, 200, 429]
    await limiter.close()


async def test_backend_down_over_tcp(own_redis_server: RedisServer, serve: Serve) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="tcp", connect_timeout_s=0.2)
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/limited")
    @limiter.limit("5/minute")
    async def limited() -> dict[str, str]:
        return {}

    base_url = await serve(app)
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        assert (await http.get("/limited")).status_code == 200
        own_redis_server.stop()
        down = await http.get("/limited")
    assert down.status_code == 503
    assert down.json() == {"error": "Rate limit backend unavailable"}
    assert rate_headers(down) == {}
    await limiter.close()


async def test_install_over_tcp(redis_url: str, serve: Serve) -> None:
    # The one-call set-up under a real server: the lifespan connects and closes the
    # limiter around the app's own, a bare decorator answers 429 with its headers.
    limiter = RateLimiter(redis_url, key_prefix="tcp")
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        events.append("app startup")
        yield
        events.append("app shutdown")

    app = FastAPI(lifespan=lifespan)
    install(app, limiter)

    @app.get("/search")
    @limiter.limit("5/minute")
    async def search(q: str) -> dict[str, str]:
        return {"q": q}

    base_url = await serve(app)
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        responses = [await http.get("/search", params={"q": "x"}) for _ in range(6)]
        heads = [(await http.head("/search", params={"q": "x"})).status_code for _ in range(2)]
    assert events == ["app startup"]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["4", "3", "2", "1", "0", "0"]
    assert responses[5].json() == {
        "error": "Rate limit exceeded",
        "retry_after": int(responses[5].headers["retry-after"]),
        "limit": 5,
    }
    assert heads == [405, 405]  # FastAPI's @app.get has no HEAD; nothing was charged
    usage = await limiter.get_usage("127.0.0.1", "5/minute", scope="GET:/search")
    assert usage["current"] == 5
