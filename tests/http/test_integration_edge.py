"""Safe defaults at the HTTP edge: identity, HEAD, exempt paths, and what a bare app answers."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from http_helpers import client, rate_headers
from redis_servers import PATIENT_TIMEOUT_S, RedisServer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from moderato import (
    BackendError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimiter,
    RateLimitExceeded,
)
from moderato.integrations import (
    ClientIdentity,
    HTTPRateLimitExceeded,
    RateLimitHeadersMiddleware,
    RateLimitMiddleware,
)


@pytest.fixture
async def limiter(redis_url: str) -> AsyncIterator[RateLimiter]:
    async with RateLimiter(
        redis_url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="edge"
    ) as limiter:
        yield limiter


def starlette_app(hits: list[str], *paths: str, **middleware_options: Any) -> Starlette:
    async def endpoint(request: Any) -> PlainTextResponse:
        hits.append(request.url.path)
        return PlainTextResponse("ok")

    middleware = [Middleware(RateLimitMiddleware, **middleware_options)]
    return Starlette(routes=[Route(path, endpoint) for path in paths], middleware=middleware)


# -- 1. identity: the client address by default ------------------------------------


async def test_middleware_default_identity_ignores_minted_api_keys(limiter: RateLimiter) -> None:
    hits: list[str] = []
    app = starlette_app(hits, "/", limiter=limiter, rate="5/minute")
    async with client(app, ip="192.0.2.10") as http:
        responses = [
            await http.get("/", headers={"X-API-Key": uuid.uuid4().hex}) for _ in range(20)
        ]
    assert [r.status_code for r in responses] == [200] * 5 + [429] * 15
    assert len(hits) == 5
    usage = await limiter.get_usage("192.0.2.10", "5/minute", scope="app")
    assert (usage["current"], usage["remaining"]) == (5, 0)


async def test_api_key_identity_is_opt_in(limiter: RateLimiter) -> None:
    app = starlette_app([], "/", limiter=limiter, rate="2/minute", api_key_header="X-API-Key")
    async with client(app, ip="192.0.2.11") as http:
        statuses = [
            (await http.get("/", headers={"X-API-Key": key})).status_code
            for key in ("a", "a", "a", "b", "b", "b")
        ]
    # Opted in, each key is its own client (so keys must be validated; see the next test).
    assert statuses == [200, 200, 429, 200, 200, 429]
    assert (await limiter.get_usage("apikey:a", "2/minute", scope="app"))["current"] == 2


KNOWN_KEYS = {"key-alice", "key-bob"}
ADDRESS = ClientIdentity()


def client_key(request: Request) -> str:
    # docs/http.md's safe pattern: a known key is an identity, anything else is the address.
    api_key = request.headers.get("x-api-key", "")
    if api_key in KNOWN_KEYS:
        return f"apikey:{api_key}"
    return ADDRESS(request)


async def test_validated_key_callback_falls_back_to_the_address(limiter: RateLimiter) -> None:
    app = starlette_app([], "/", limiter=limiter, rate="3/minute", key=client_key)
    async with client(app, ip="192.0.2.12") as http:
        minted = [
            (await http.get("/", headers={"X-API-Key": uuid.uuid4().hex})).status_code
            for _ in range(6)
        ]
        alice = [
            (await http.get("/", headers={"X-API-Key": "key-alice"})).status_code for _ in range(4)
        ]
    assert minted == [200] * 3 + [429] * 3
    assert alice == [200] * 3 + [429]


# -- 2. HEAD shares GET's quota ------------------------------------------------------


async def alternate(http: Any, path: str, count: int = 10) -> list[tuple[str, int]]:
    results = []
    for n in range(count):
        method = "GET" if n % 2 == 0 else "HEAD"
        results.append((method, (await http.request(method, path)).status_code))
    return results


ALTERNATING_5_OF_10 = [
    ("GET", 200),
    ("HEAD", 200),
    ("GET", 200),
    ("HEAD", 200),
    ("GET", 200),
    ("HEAD", 429),
    ("GET", 429),
    ("HEAD", 429),
    ("GET", 429),
    ("HEAD", 429),
]


async def test_head_shares_get_quota_with_the_decorator(limiter: RateLimiter) -> None:
    hits: list[str] = []

    @limiter.limit("5/minute")
    async def page(request: Any) -> PlainTextResponse:
        hits.append(request.method)
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/page", page)])  # Starlette adds HEAD to GET routes
    app.add_middleware(RateLimitHeadersMiddleware)
    async with client(app) as http:
        assert await alternate(http, "/page") == ALTERNATING_5_OF_10
    assert hits == ["GET", "HEAD", "GET", "HEAD", "GET"]
    usage = await limiter.get_usage("127.0.0.1", "5/minute", scope="GET:/page")
    assert usage["current"] == 5
    assert (await limiter.get_usage("127.0.0.1", "5/minute", scope="HEAD:/page"))["current"] == 0


async def test_head_shares_get_quota_with_the_dependency(limiter: RateLimiter) -> None:
    app = FastAPI()
    hits: list[str] = []

    @app.api_route(
        "/items/{item_id}",
        methods=["GET", "HEAD"],
        dependencies=[Depends(limiter.dependency("5/minute"))],
    )
    async def item(item_id: int, request: Request) -> dict[str, int]:
        hits.append(request.method)
        return {"item": item_id}

    async with client(app) as http:
        assert await alternate(http, "/items/7") == ALTERNATING_5_OF_10
    assert len(hits) == 5
    usage = await limiter.get_usage("127.0.0.1", "5/minute", scope="GET:/items/{item_id}")
    assert usage["current"] == 5


async def test_head_shares_get_quota_with_the_middleware(limiter: RateLimiter) -> None:
    hits: list[str] = []
    app = starlette_app(hits, "/page", limiter=limiter, rate="5/minute")
    async with client(app) as http:
        assert await alternate(http, "/page") == ALTERNATING_5_OF_10
    assert len(hits) == 5


# -- 3. exempt_paths -----------------------------------------------------------------


async def test_exempt_paths_ignore_a_trailing_slash_and_need_a_star_for_prefixes(
    limiter: RateLimiter,
) -> None:
    hits: list[str] = []
    paths = ("/health", "/healthz", "/static/app.js", "/static", "/statics", "/api")
    app = starlette_app(
        hits, *paths, limiter=limiter, rate="1/hour", exempt_paths=["/health", "/static/*"]
    )
    async with client(app) as http:
        exempt = [
            await http.get(path)
            for path in ("/health", "/health/", "/static", "/static/", "/static/app.js") * 3
        ]
        # Redirects (to the slash-less route) and 200s alike: none of them was charged.
        assert {r.status_code for r in exempt} <= {200, 307}
        assert all(rate_headers(r) == {} for r in exempt)
        assert (await limiter.get_usage("127.0.0.1", "1/hour", scope="app"))["current"] == 0
        limited = [(path, (await http.get(path)).status_code) for path in ("/api", "/healthz")]
        limited += [(path, (await http.get(path)).status_code) for path in ("/statics", "/api/")]
    assert limited == [("/api", 200), ("/healthz", 429), ("/statics", 429), ("/api/", 429)]


async def test_exempt_prefix_covers_a_mounted_application(limiter: RateLimiter) -> None:
    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse(request.url.path)

    child = Starlette(routes=[Route("/status", ok), Route("/jobs", ok)])
    parent = Starlette(
        routes=[Mount("/admin", app=child), Route("/", ok)],
        middleware=[
            Middleware(RateLimitMiddleware, limiter=limiter, rate="1/hour", exempt_paths="/admin/*")
        ],
    )
    async with client(parent) as http:
        admin = [(await http.get(p)).status_code for p in ("/admin/status", "/admin/jobs") * 3]
        root = [(await http.get("/")).status_code for _ in range(2)]
    assert admin == [200] * 6
    assert root == [200, 429]


async def test_exempt_paths_on_a_mounted_child_are_its_own_paths(limiter: RateLimiter) -> None:
    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    child = Starlette(
        routes=[Route("/status", ok), Route("/jobs", ok)],
        middleware=[
            Middleware(
                RateLimitMiddleware, limiter=limiter, rate="1/hour", exempt_paths=["/status"]
            )
        ],
    )
    parent = Starlette(routes=[Mount("/admin", app=child)])
    async with client(parent) as http:
        status = [(await http.get("/admin/status/")).status_code for _ in range(3)]
        jobs = [(await http.get("/admin/jobs")).status_code for _ in range(2)]
    assert status == [307] * 3  # the child redirects to "/status"; nothing was charged
    assert jobs == [200, 429]


async def test_costs_ignore_a_trailing_slash(limiter: RateLimiter) -> None:
    app = starlette_app([], "/export", limiter=limiter, rate="100/hour", costs={"/export/": 20})
    async with client(app) as http:
        remaining = [
            (await http.get(path)).headers["x-ratelimit-remaining"]
            for path in ("/export", "/export/")
        ]
    assert remaining == ["80", "60"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("exempt_paths", ["health"], "exempt_paths: 'health' must start with '/'"),
        ("exempt_paths", ["/a/*/b"], r"exempt_paths: '/a/\*/b' may only end in '\*'"),
        ("exempt_paths", ["/a**"], r"exempt_paths: '/a\*\*' may only end in '\*'"),
        ("exempt_paths", [5], "exempt_paths: each path must be a string .* got int"),
        ("exempt_paths", ["/a?x=1"], "must be a bare path, without query"),
        ("exempt_paths", None, "exempt_paths must be a list of paths .* got NoneType"),
        ("costs", {"/x/*": 2}, r"costs: '/x/\*' must be an exact path, without '\*'"),
        ("costs", {"/x": 1, "/x/": 2}, "costs: '/x/' names the same path as '/x'"),
        ("costs", [("/x", 1)], "costs must map paths to values"),
    ],
)
def test_path_options_are_validated(
    limiter: RateLimiter, option: str, value: Any, message: str
) -> None:
    with pytest.raises(RateLimitConfigError, match=message):
        RateLimitMiddleware(Starlette(), limiter=limiter, rate="5/minute", **{option: value})


# -- 4. a bare app answers 429 / 422 / 503, not 500 ----------------------------------


def bare_app(limiter: RateLimiter, **rule: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/decorated")
    @limiter.limit("2/minute", **rule)
    async def decorated() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/depends", dependencies=[Depends(limiter.dependency("2/minute", **rule))])
    async def depends() -> dict[str, str]:
        return {"ok": "yes"}

    return app


@pytest.mark.parametrize("path", ["/decorated", "/depends"])
async def test_bare_fastapi_app_answers_429_with_headers(limiter: RateLimiter, path: str) -> None:
    async with client(bare_app(limiter)) as http:
        responses = [await http.get(path) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].json() == {"ok": "yes"}
    denial = responses[2]
    assert denial.json() == {"detail": "Rate limit exceeded"}
    headers = rate_headers(denial)
    assert set(headers) == {
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
    }
    assert (headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == ("2", "0")
    retry_after_s = int(headers["retry-after"])
    assert 1 <= retry_after_s <= 60
    usage = await limiter.get_usage("127.0.0.1", "2/minute", scope=f"GET:{path}")
    assert int(headers["x-ratelimit-reset"]) == math.ceil(usage["reset_at"])


@pytest.mark.parametrize("path", ["/decorated", "/depends"])
async def test_bare_app_answers_422_without_retry_after(limiter: RateLimiter, path: str) -> None:
    async with client(bare_app(limiter, cost=lambda request: 3)) as http:
        response = await http.get(path)
    assert response.status_code == 422
    assert response.json() == {"detail": "Rate limit exceeded"}
    assert rate_headers(response) == {"x-ratelimit-limit": "2", "x-ratelimit-remaining": "2"}


@pytest.mark.parametrize("path", ["/decorated", "/depends"])
async def test_bare_app_answers_503_for_a_failed_callback(limiter: RateLimiter, path: str) -> None:
    def broken(request: Request) -> str:
        return request.headers["x-missing"]

    async with client(bare_app(limiter, key=broken)) as http:
        response = await http.get(path)
    assert response.status_code == 503
    assert response.json() == {"detail": "Rate limit callback failed"}
    assert rate_headers(response) == {}


async def test_bare_app_answers_503_when_the_backend_is_down(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="edge", connect_timeout_s=0.2)
    own_redis_server.stop()
    async with client(bare_app(limiter)) as http:
        responses = [await http.get(path) for path in ("/decorated", "/depends")]
    for response in responses:
        assert response.status_code == 503
        assert response.json() == {"detail": "Rate limit backend unavailable"}
        assert rate_headers(response) == {}
    await limiter.close()


async def test_bare_starlette_app_answers_429_in_plain_text(limiter: RateLimiter) -> None:
    @limiter.limit("1/minute")
    async def page(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async with client(Starlette(routes=[Route("/", page)])) as http:
        responses = [await http.get("/") for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 429]
    assert responses[1].text == "Rate limit exceeded"
    assert responses[1].headers["x-ratelimit-limit"] == "1"
    assert "retry-after" in responses[1].headers


async def test_application_handlers_still_win(limiter: RateLimiter) -> None:
    app = bare_app(limiter)
    seen: list[type[BaseException]] = []

    @app.exception_handler(RateLimitExceeded)
    async def denied(request: Request, exc: RateLimitExceeded) -> JSONResponse:
        seen.append(type(exc))
        return JSONResponse({"mine": exc.limit, "retry": exc.retry_after}, status_code=429)

    async with client(app) as http:
        responses = [await http.get("/decorated") for _ in range(3)]
    assert responses[2].status_code == 429
    body = responses[2].json()
    assert body["mine"] == 2 and 1 <= body["retry"] <= 60
    assert rate_headers(responses[2]) == {}  # the handler's response is entirely its own
    # The handler sees a RateLimitExceeded (that also is an HTTPException).
    assert seen == [HTTPRateLimitExceeded]


async def test_with_the_middleware_bodies_are_unchanged(limiter: RateLimiter) -> None:
    def broken(request: Request) -> str:
        raise KeyError("x-missing")

    app = bare_app(limiter)
    app.add_middleware(RateLimitHeadersMiddleware)
    broken_app = bare_app(limiter, key=broken)
    broken_app.add_middleware(RateLimitHeadersMiddleware)
    async with client(app) as http:
        responses = [await http.get("/depends") for _ in range(3)]
    async with client(broken_app) as http:
        failed = await http.get("/decorated")
    retry_after_s = int(responses[2].headers["retry-after"])
    assert responses[2].json() == {
        "error": "Rate limit exceeded",
        "retry_after": retry_after_s,
        "limit": 2,
    }
    assert failed.status_code == 503
    assert failed.json() == {"error": "Rate limit callback failed", "callback": "key"}


def test_http_errors_keep_moderato_messages_and_types() -> None:
    from moderato.integrations.http_errors import http_error

    denial = RateLimitExceeded(
        limit=2, remaining=0, retry_after=7, reset_at=1_000.5, window_seconds=60, rate="2/minute"
    )
    converted = http_error(denial, {"type": "http"})
    assert isinstance(converted, HTTPRateLimitExceeded)
    assert str(converted) == "rate limit '2/minute' exceeded: retry after 7 s"
    assert (converted.status_code, converted.retry_after, converted.limit) == (429, 7, 2)
    assert converted.headers == {
        "x-ratelimit-limit": "2",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "1001",
        "retry-after": "7",
    }
    failed = http_error(RateLimitCallbackError("key", KeyError("x")), {"type": "http"})
    assert isinstance(failed, RateLimitCallbackError) and failed.callback == "key"
    down = http_error(BackendError("connection refused"), {"type": "http"})
    assert isinstance(down, BackendError) and str(down) == "connection refused"
    assert (down.status_code, down.headers) == (503, {})  # type: ignore[attr-defined]


async def test_mounted_child_without_its_own_middleware_answers_429(limiter: RateLimiter) -> None:
    # The parent's middleware cannot answer for the child (the child's error
    # middleware would send a 500 first): the child answers the HTTPException form.
    child = bare_app(limiter)
    parent = FastAPI()
    parent.mount("/child", child)
    parent.add_middleware(RateLimitHeadersMiddleware)
    async with client(parent) as http:
        responses = [await http.get("/child/decorated") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[2].json() == {"detail": "Rate limit exceeded"}
    assert rate_headers(responses[2])["x-ratelimit-remaining"] == "0"
    assert "retry-after" in responses[2].headers
    # Admissions get their quota headers from the parent's middleware as before.
    assert rate_headers(responses[0])["x-ratelimit-remaining"] == "1"
