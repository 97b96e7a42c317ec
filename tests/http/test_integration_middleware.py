"""RateLimitMiddleware and RateLimitHeadersMiddleware through the HTTP boundary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from http_helpers import QUOTA_HEADERS, client, rate_headers
from redis_servers import RedisServer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import Message, Receive, Scope, Send

from moderato import BackendError, RateLimitConfigError, RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, RateLimitMiddleware


def counting_app(hits: list[str], **middleware_options: Any) -> Starlette:
    async def endpoint(request: Any) -> PlainTextResponse:
        hits.append(request.url.path)
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/", endpoint),
            Route("/search", endpoint),
            Route("/export", endpoint),
            Route("/healthz", endpoint),
            Route("/readyz", endpoint),
            Route("/internal/metrics", endpoint),
        ],
        middleware=[Middleware(RateLimitMiddleware, **middleware_options)],
    )


async def test_seed_burst_exactly_20_admitted_and_other_keys_unaffected(redis_url: str) -> None:
    # Seed 004: 200 requests from one key against a burst of 20 -> 20 x 200, 180 x 429.
    # Keys are opt-in identities (by default one address is one client).
    hits: list[str] = []
    # 201 requests at once in one process: a loaded machine can hold their replies
    # past the default 0.5 s command timeout, and this test checks exactness.
    async with RateLimiter(
        redis_url, key_prefix="it", default_algorithm="token_bucket", command_timeout_s=10
    ) as limiter:
        app = counting_app(
            hits,
            limiter=limiter,
            rate="20/10 minutes",
            algorithm="token_bucket",
            api_key_header="X-API-Key",
        )
        async with client(app) as http:
            burst = [http.get("/", headers={"x-api-key": "key-a"}) for _ in range(200)]
            other = http.get("/", headers={"x-api-key": "key-b"})
            responses = await asyncio.gather(*burst[:100], other, *burst[100:])
    other_response = responses.pop(100)
    statuses = [r.status_code for r in responses]
    assert (statuses.count(200), statuses.count(429)) == (20, 180)
    rejected = [r for r in responses if r.status_code == 429]
    for response in rejected:
        retry_after_s = int(response.headers["retry-after"])
        assert 1 <= retry_after_s <= 30  # one token per 30 s
        assert response.json() == {
            "error": "Rate limit exceeded",
            "retry_after": retry_after_s,
            "limit": 20,
        }
        assert response.headers["x-ratelimit-remaining"] == "0"
    assert other_response.status_code == 200
    assert other_response.headers["x-ratelimit-remaining"] == "19"
    # Rejected requests never reached the application.
    assert len(hits) == 21


async def test_paced_client_at_80_percent_of_the_rate_is_never_limited(
    limiter: RateLimiter,
) -> None:
    hits: list[str] = []
    app = counting_app(hits, limiter=limiter, rate="20/second", algorithm="token_bucket")
    interval_s = 1 / 16  # 80% of 20/second
    async with client(app) as http:
        started = time.monotonic()
        statuses = []
        for n in range(32):
            delay_s = started + n * interval_s - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            statuses.append((await http.get("/", headers={"x-api-key": "paced"})).status_code)
    assert statuses == [200] * 32


async def test_health_checks_are_exempt_under_load(limiter: RateLimiter) -> None:
    hits: list[str] = []

    def internal(request: Request) -> bool:
        return request.url.path.startswith("/internal/")

    app = counting_app(
        hits,
        limiter=limiter,
        rate="5/hour",
        exempt_paths=["/healthz", "/ready*"],
        exempt=[internal],
    )
    async with client(app) as http:
        load = await asyncio.gather(*(http.get("/") for _ in range(30)))
        assert [r.status_code for r in load].count(200) == 5
        checks = await asyncio.gather(
            *(http.get(path) for path in ("/healthz", "/readyz", "/internal/metrics") * 10)
        )
    assert [r.status_code for r in checks] == [200] * 30
    assert all(rate_headers(r) == {} for r in checks)
    usage = await limiter.get_usage("127.0.0.1", "5/hour", scope="app")
    assert usage["current"] == 5


async def test_per_path_costs_charge_one_bucket(limiter: RateLimiter) -> None:
    app = counting_app([], limiter=limiter, rate="100/hour", costs={"/export": 20, "/search": 5})
    async with client(app, headers={"x-api-key": "costly"}) as http:
        remaining = [
            (await http.get(path)).headers["x-ratelimit-remaining"]
            for path in ("/export", "/search", "/", "/export")
        ]
    assert remaining == ["80", "75", "74", "54"]
    with pytest.raises(RateLimitConfigError, match="cost 101 exceeds capacity 100"):
        RateLimitMiddleware(app, limiter=limiter, rate="100/hour", costs={"/bulk": 101})


async def test_header_styles(limiter: RateLimiter) -> None:
    def styled(style: Any) -> Starlette:
        return counting_app(
            [], limiter=limiter, rate="2/hour;100/day", headers=style, scope=f"style-{style}"
        )

    async with client(styled("ietf")) as http:
        admitted = await http.get("/")
        await http.get("/")
        denied = await http.get("/")
    policy = '"2-per-3600s";q=2;w=3600, "100-per-86400s";q=100;w=86400'
    assert admitted.headers["ratelimit-policy"] == policy
    state, reset = admitted.headers["ratelimit"].rsplit(";t=", 1)
    assert state == '"2-per-3600s";r=1'
    assert 0 <= int(reset) <= 3600
    assert "x-ratelimit-limit" not in admitted.headers
    assert denied.status_code == 429
    assert denied.headers["ratelimit"].startswith('"2-per-3600s";r=0;t=')
    assert int(denied.headers["retry-after"]) >= 1

    async with client(styled("both")) as http:
        both = await http.get("/")
    assert set(rate_headers(both)) == set(QUOTA_HEADERS)
    assert (both.headers["x-ratelimit-limit"], both.headers["x-ratelimit-remaining"]) == ("2", "1")

    async with client(styled(None)) as http:
        quiet = [await http.get("/") for _ in range(3)]
    assert [rate_headers(r) for r in quiet[:2]] == [{}, {}]
    # Retry-After belongs to the 429 itself, whatever the quota-header style.
    assert set(rate_headers(quiet[2])) == {"retry-after"}

    with pytest.raises(RateLimitConfigError, match="headers must be"):
        RateLimitHeadersMiddleware(styled("ietf"), headers="draft")  # type: ignore[arg-type]


async def test_backend_down_is_503_without_quota_headers(own_redis_server: RedisServer) -> None:
    down = RateLimiter(own_redis_server.url, key_prefix="it", connect_timeout_s=0.2)
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/decorated")
    @down.limit("5/minute")
    async def decorated() -> dict[str, str]:
        return {}

    @app.get("/usage")
    async def usage() -> dict[str, Any]:
        return await down.get_usage("someone", "5/minute")

    @app.post("/reset")
    async def reset() -> dict[str, int]:
        return {"deleted": await down.reset("someone", rate="5/minute")}

    app.mount(
        "/wide",
        counting_app([], limiter=down, rate="5/minute"),
    )
    async with client(app) as http:
        assert (await http.get("/decorated")).headers["x-ratelimit-remaining"] == "4"
        own_redis_server.stop()
        responses = [
            await http.get("/decorated"),
            await http.get("/usage"),
            await http.post("/reset"),
            await http.get("/wide/"),
        ]
    for response in responses:
        assert response.status_code == 503
        assert response.json() == {"error": "Rate limit backend unavailable"}
        assert rate_headers(response) == {}
    await down.close()


async def test_downstream_manual_denials_and_callback_errors_are_translated(
    limiter: RateLimiter,
) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/manual")
    async def manual() -> dict[str, str]:
        await limiter.check("manual-user", "1/hour", scope="manual")
        return {}

    async with client(app) as http:
        assert (await http.get("/manual")).status_code == 200
        denied = await http.get("/manual")
    assert denied.status_code == 429
    retry_after_s = int(denied.headers["retry-after"])
    assert denied.json() == {
        "error": "Rate limit exceeded",
        "retry_after": retry_after_s,
        "limit": 1,
    }
    assert (denied.headers["x-ratelimit-limit"], denied.headers["x-ratelimit-remaining"]) == (
        "1",
        "0",
    )

    hits: list[str] = []

    def broken_key(request: Request) -> str:
        raise RuntimeError("no key")

    async def broken_exempt(request: Request) -> bool:
        raise RuntimeError("no verdict")

    for name, options in (("key", {"key": broken_key}), ("exempt", {"exempt": [broken_exempt]})):
        wide = counting_app(hits, limiter=limiter, rate="5/hour", **options)
        async with client(wide) as http:
            response = await http.get("/")
        assert response.status_code == 503
        assert response.json() == {"error": "Rate limit callback failed", "callback": name}
    assert hits == []


async def test_app_wide_and_decorated_decisions_report_the_tightest(limiter: RateLimiter) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="10/hour")

    @app.get("/tight")
    @limiter.limit("3/hour")
    async def tight() -> dict[str, str]:
        return {}

    @app.get("/loose")
    async def loose() -> dict[str, str]:
        return {}

    async with client(app) as http:
        tight_response = await http.get("/tight")
        loose_response = await http.get("/loose")
    # Reported once each, by the innermost middleware, for the most restrictive policy.
    assert tight_response.headers.get_list("x-ratelimit-limit") == ["3"]
    assert tight_response.headers.get_list("x-ratelimit-remaining") == ["2"]
    assert loose_response.headers.get_list("x-ratelimit-limit") == ["10"]
    assert loose_response.headers.get_list("x-ratelimit-remaining") == ["8"]


async def test_middleware_on_a_mounted_child_app(limiter: RateLimiter) -> None:
    @limiter.limit("1/hour")
    async def child_endpoint(request: Any) -> JSONResponse:
        return JSONResponse({"child": True})

    hits: list[str] = []
    child = Starlette(
        routes=[Route("/thing", child_endpoint)],
        middleware=[Middleware(RateLimitHeadersMiddleware, headers="both")],
    )
    wide_child = counting_app(hits, limiter=limiter, rate="1/hour", exempt_paths=["/healthz"])
    parent = Starlette(
        routes=[Mount("/child/{tenant}", app=child), Mount("/wide", app=wide_child)],
        middleware=[Middleware(RateLimitHeadersMiddleware)],
    )
    async with client(parent) as http:
        first = await http.get("/child/a/thing")
        denied = await http.get("/child/b/thing")
        wide = [await http.get("/wide/") for _ in range(2)]
        health = [await http.get("/wide/healthz") for _ in range(3)]
    assert first.status_code == 200
    # The child's middleware answered; the parent's added nothing more.
    assert first.headers.get_list("x-ratelimit-remaining") == ["0"]
    assert first.headers["ratelimit"].startswith('"1-per-3600s";r=0')
    assert denied.status_code == 429
    assert denied.json()["limit"] == 1
    assert denied.headers.get_list("retry-after") == [denied.headers["retry-after"]]
    assert [r.status_code for r in wide] == [200, 429]
    assert [r.status_code for r in health] == [200, 200, 200]
    assert hits == ["/wide/", "/wide/healthz", "/wide/healthz", "/wide/healthz"]


class Recorder:
    """Collects the ASGI messages an app sends."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def starts(self) -> list[Message]:
        return [m for m in self.messages if m["type"] == "http.response.start"]


def empty_body() -> Receive:
    """An empty request body, then a client that stays connected (receive never returns)."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


def http_scope(path: str) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
    }


async def test_no_second_response_once_headers_were_sent(limiter: RateLimiter) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first chunk"
        raise BackendError("connection lost mid-stream")

    async def stream(request: Any) -> StreamingResponse:
        return StreamingResponse(chunks())

    async def failing_early(scope: Scope, receive: Receive, send: Send) -> None:
        raise BackendError("connection lost before any response")

    for middleware in (
        RateLimitHeadersMiddleware(Starlette(routes=[Route("/stream", stream)])),
        RateLimitMiddleware(
            Starlette(routes=[Route("/stream", stream)]), limiter=limiter, rate="5/hour"
        ),
    ):
        recorder = Recorder()
        with pytest.raises(BackendError, match="mid-stream"):
            await middleware(http_scope("/stream"), empty_body(), recorder.send)
        assert len(recorder.starts) == 1
        assert recorder.starts[0]["status"] == 200

    recorder = Recorder()
    await RateLimitHeadersMiddleware(failing_early)(http_scope("/"), empty_body(), recorder.send)
    assert [m["status"] for m in recorder.starts] == [503]


async def test_other_exceptions_and_scopes_pass_through(limiter: RateLimiter) -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])
        if scope["type"] == "http":
            raise KeyError("not ours")

    for middleware in (
        RateLimitHeadersMiddleware(app),
        RateLimitMiddleware(app, limiter=limiter, rate="5/hour"),
    ):
        await middleware({"type": "lifespan"}, empty_body(), Recorder().send)
        await middleware({"type": "websocket", "path": "/ws"}, empty_body(), Recorder().send)
        recorder = Recorder()
        with pytest.raises(KeyError):
            await middleware(http_scope("/"), empty_body(), recorder.send)
        assert recorder.starts == []
    assert seen == ["lifespan", "websocket", "http"] * 2


async def test_user_exception_handler_keeps_its_response_and_gains_headers(
    limiter: RateLimiter,
) -> None:
    # An app may answer RateLimitExceeded itself (README, errors).
    from moderato import RateLimitExceeded

    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.exception_handler(RateLimitExceeded)
    async def handler(request: Request, exc: RateLimitExceeded) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content={"error": "slow down", "retry_after": exc.retry_after, "limit": exc.limit},
            headers={"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {},
        )

    @app.get("/limited")
    @limiter.limit("1/hour")
    async def limited() -> dict[str, str]:
        return {}

    async with client(app) as http:
        await http.get("/limited")
        denied = await http.get("/limited")
    assert denied.status_code == 429
    assert denied.json()["error"] == "slow down"
    assert denied.headers.get_list("retry-after") == [str(denied.json()["retry_after"])]
    assert (denied.headers["x-ratelimit-limit"], denied.headers["x-ratelimit-remaining"]) == (
        "1",
        "0",
    )


def test_construction_errors(limiter: RateLimiter) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        return None

    with pytest.raises(RateLimitConfigError):
        RateLimitMiddleware(app, limiter=limiter, rate="5/fortnight")
    with pytest.raises(RateLimitConfigError):
        RateLimitMiddleware(app, limiter=limiter, rate="5/hour", cost=6)
    with pytest.raises(RateLimitConfigError):
        RateLimitMiddleware(app, limiter=limiter, rate="5/hour", scope="")
    with pytest.raises(RateLimitConfigError):
        RateLimitMiddleware(app, limiter=limiter, rate="5/hour", exempt=["/healthz"])  # type: ignore[list-item]
    with pytest.raises(RateLimitConfigError):
        RateLimitMiddleware(app, limiter=limiter, rate="5/hour", trusted_proxies=["nope"])


async def test_requests_from_httpx_clients_see_json_content_type(limiter: RateLimiter) -> None:
    app = counting_app([], limiter=limiter, rate="1/hour")
    async with client(app) as http:
        await http.get("/")
        denied: httpx.Response = await http.get("/")
    assert denied.headers["content-type"] == "application/json"
    assert denied.headers["content-length"] == str(len(denied.content))
