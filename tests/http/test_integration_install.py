"""install(app, limiter): one call wires a limiter in; a misplaced @limiter.limit is an error."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastapi import FastAPI
from http_helpers import client, rate_headers
from redis_servers import RedisServer
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

import moderato
from moderato import BackendError, RateLimitConfigError, RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, RateLimitMiddleware, install


class RecordingLimiter(RateLimiter):
    """A real limiter that also notes when it connects and closes."""

    def __init__(self, url: str, events: list[str], **options: Any) -> None:
        super().__init__(url, key_prefix="install", **options)
        self.events = events

    async def connect(self) -> None:
        self.events.append("limiter connect")
        await super().connect()

    async def close(self) -> None:
        self.events.append("limiter close")
        await super().close()


def misplaced_app(limiter: RateLimiter) -> FastAPI:
    app = FastAPI()

    @limiter.limit("2/minute")  # above the route decorator: registered unlimited
    @app.get("/wrong")
    async def wrong() -> dict[str, str]:
        return {}

    @app.get("/right")
    @limiter.limit("2/minute")
    async def right() -> dict[str, str]:
        return {}

    return app


def test_install_is_exported_from_moderato() -> None:
    assert moderato.install is install
    assert "install" in moderato.__all__


async def test_install_composes_with_the_app_lifespan(redis_url: str) -> None:
    events: list[str] = []
    limiter = RecordingLimiter(redis_url, events)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        events.append("app startup")
        yield {"greeting": "hello"}
        events.append("app shutdown")

    app = FastAPI(lifespan=lifespan)
    install(app, limiter)

    @app.get("/limited")
    @limiter.limit("3/minute")
    async def limited() -> dict[str, str]:
        return {"ok": "yes"}

    async with app.router.lifespan_context(app) as state:
        assert state == {"greeting": "hello"}
        assert events == ["limiter connect", "app startup"]
        async with client(app) as http:
            responses = [await http.get("/limited") for _ in range(4)]
    assert events == ["limiter connect", "app startup", "app shutdown", "limiter close"]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["2", "1", "0", "0"]
    retry_after_s = int(responses[3].headers["retry-after"])
    # The middleware answers: the body the seed spec gives, not FastAPI's {"detail": ...}.
    assert responses[3].json() == {
        "error": "Rate limit exceeded",
        "retry_after": retry_after_s,
        "limit": 3,
    }
    assert app.state.moderato_limiter is limiter


async def test_install_with_an_app_wide_rate(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="install")
    app = Starlette(
        routes=[
            Route("/", lambda request: PlainTextResponse("ok")),
            Route("/health", lambda r: PlainTextResponse("up")),
        ]
    )
    install(app, limiter, rate="2/minute", exempt_paths=["/health"], headers="ietf")
    async with app.router.lifespan_context(app), client(app) as http:
        statuses = [(await http.get("/")).status_code for _ in range(3)]
        health = [(await http.get("/health/")).status_code for _ in range(3)]
        last = await http.get("/")
    assert statuses == [200, 200, 429]
    assert set(health) == {307}  # redirected to /health, never charged
    assert last.headers["ratelimit-policy"] == '"2-per-60s";q=2;w=60'
    assert "x-ratelimit-limit" not in last.headers


def test_install_refuses_bad_calls(redis_url: str) -> None:
    limiter = RateLimiter(redis_url)
    with pytest.raises(RateLimitConfigError, match="takes a FastAPI or Starlette application"):
        install(object(), limiter)  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match="exempt_paths configure an app-wide limit"):
        install(FastAPI(), limiter, exempt_paths=["/health"])
    with pytest.raises(RateLimitConfigError, match="'health' must start with '/'"):
        install(FastAPI(), limiter, rate="5/minute", exempt_paths=["health"])
    with pytest.raises(RateLimitConfigError, match="headers must be"):
        install(FastAPI(), limiter, headers="fancy")  # type: ignore[arg-type]
    app = FastAPI()
    install(app, limiter)
    with pytest.raises(RateLimitConfigError, match="already called for this application"):
        install(app, limiter)


async def test_install_fails_startup_without_the_backend_unless_told_not_to(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    own_redis_server.stop()
    strict = RateLimiter(own_redis_server.url, connect_timeout_s=0.2)
    app = FastAPI()
    install(app, strict)
    with pytest.raises(BackendError):
        async with app.router.lifespan_context(app):
            pass
    lenient = RateLimiter(own_redis_server.url, connect_timeout_s=0.2)
    app = FastAPI()
    install(app, lenient, require_backend=False)

    @app.get("/limited")
    @lenient.limit("5/minute")
    async def limited() -> dict[str, str]:
        return {}

    with caplog.at_level(logging.WARNING, logger="moderato"):
        async with app.router.lifespan_context(app), client(app) as http:
            down = await http.get("/limited")
    assert down.status_code == 503
    assert down.json() == {"error": "Rate limit backend unavailable"}
    assert any("starting without its backend" in r.getMessage() for r in caplog.records)


# -- the decorator order ---------------------------------------------------------------


async def test_install_refuses_to_start_with_a_misplaced_limit(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="install")
    app = misplaced_app(limiter)
    install(app, limiter)
    with pytest.raises(RateLimitConfigError) as raised:
        async with app.router.lifespan_context(app):
            pass
    message = str(raised.value)
    assert message.startswith(
        "route /wrong (test_integration_install.misplaced_app.<locals>.wrong) is not rate "
        "limited: @limiter.limit('2/minute') is written above the route decorator"
    )
    assert "/right" not in message
    await limiter.close()


async def test_middleware_logs_a_misplaced_limit_on_the_first_request(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="install")
    app = misplaced_app(limiter)
    app.add_middleware(RateLimitHeadersMiddleware)
    with caplog.at_level(logging.ERROR, logger="moderato"):
        async with client(app) as http:
            wrong = [await http.get("/wrong") for _ in range(3)]
            right = [await http.get("/right") for _ in range(3)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once, on the first request
    assert errors[0].startswith("moderato: route /wrong (test_integration_install.")
    # Still unlimited (the check reports, it does not guess a limit), but no longer silent.
    assert [r.status_code for r in wrong] == [200, 200, 200]
    assert rate_headers(wrong[0]) == {}
    assert [r.status_code for r in right] == [200, 200, 429]
    await limiter.close()


async def test_misplaced_limits_are_found_in_mounts_and_stacks(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="install")

    @limiter.limit("1/second")
    @limiter.limit("10/minute")
    async def inner(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    @limiter.limit("5/second")
    async def whole(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    half = inner.__wrapped__  # as if the route decorator sat between the two limits
    child = Starlette(routes=[Route("/half", half), Route("/whole", whole)])
    app = Starlette(routes=[Mount("/v1", app=child)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="100/minute")
    with caplog.at_level(logging.ERROR, logger="moderato"):
        async with client(app) as http:
            assert (await http.get("/v1/whole")).status_code == 200
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith("moderato: route /v1/half (")
    assert "@limiter.limit('1/second')" in errors[0]
    await limiter.close()


async def test_a_function_routed_both_bare_and_limited_is_not_misplaced(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="install")

    async def report(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route("/open", report), Route("/limited", limiter.limit("1/minute")(report))]
    )
    install(app, limiter)
    with caplog.at_level(logging.ERROR, logger="moderato"):
        async with app.router.lifespan_context(app), client(app) as http:
            opened = [(await http.get("/open")).status_code for _ in range(2)]
            limited = [(await http.get("/limited")).status_code for _ in range(2)]
    assert (opened, limited) == ([200, 200], [200, 429])
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
