"""@limiter.limit and limiter.dependency through the HTTP boundary, on a real redis-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, Optional

import pytest
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from http_helpers import QUOTA_HEADERS, client, next_utc_midnight, rate_headers
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from redis_servers import RedisServer
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from moderato import RateLimitConfigError, RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware


def fastapi_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)
    return app


async def test_basic_example_headers_then_429(redis_url: str) -> None:
    # Seed "Basic Example", fixed window: exact limit, remaining, reset and Retry-After.
    limiter = RateLimiter(redis_url, key_prefix="it")
    app = fastapi_app()

    @app.get("/api/users")
    @limiter.limit("3/day")
    async def get_users(request: Request) -> dict[str, list[str]]:
        return {"users": ["Alice", "Bob"]}

    before_s = time.time()
    async with client(app) as http:
        responses = [await http.get("/api/users") for _ in range(4)]
    after_s = time.time()
    midnight = next_utc_midnight(before_s)
    assert midnight == next_utc_midnight(after_s), "crossed UTC midnight; rerun"

    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert responses[0].json() == {"users": ["Alice", "Bob"]}
    for response, remaining in zip(responses, ("2", "1", "0", "0")):
        assert response.headers["x-ratelimit-limit"] == "3"
        assert response.headers["x-ratelimit-remaining"] == remaining
        assert response.headers["x-ratelimit-reset"] == str(midnight)
    assert "retry-after" not in responses[0].headers
    denied = responses[3]
    retry_after_s = int(denied.headers["retry-after"])
    assert denied.json() == {
        "error": "Rate limit exceeded",
        "retry_after": retry_after_s,
        "limit": 3,
    }
    # Retry-After is the wait until the window's end, rounded up.
    assert midnight - after_s - 1 <= retry_after_s <= midnight - before_s + 1
    assert denied.headers["content-type"] == "application/json"
    await limiter.close()


class Item(BaseModel):
    name: str
    price_cents: int


def token(x_token: Annotated[str, Query()] = "none") -> str:
    # Module level: string annotations (PEP 563) resolve in module globals.
    return f"token:{x_token}"


async def test_fastapi_endpoint_shapes(limiter: RateLimiter) -> None:
    app = fastapi_app()
    calls: list[str] = []

    @app.get("/async-with-request/{item_id}")
    @limiter.limit("2/hour")
    async def async_with_request(item_id: int, request: Request) -> dict[str, Any]:
        calls.append("async_with_request")
        return {"item_id": item_id, "path": request.url.path}

    @app.get("/async-without-request/{item_id}")
    @limiter.limit("2/hour")
    async def async_without_request(item_id: int, q: Optional[str] = None) -> dict[str, Any]:
        calls.append("async_without_request")
        return {"item_id": item_id, "q": q}

    @app.get("/sync-without-request")
    @limiter.limit("2/hour")
    def sync_without_request(tok: Annotated[str, Depends(token)]) -> dict[str, Any]:
        calls.append("sync_without_request")
        return {"tok": tok}

    @app.post("/sync-with-renamed-request")
    @limiter.limit("2/hour")
    def sync_with_renamed_request(item: Item, req: Request) -> dict[str, Any]:
        calls.append("sync_with_renamed_request")
        return {"item": item.model_dump(), "method": req.method}

    @app.post("/async-body/{item_id}")
    @limiter.limit("2/hour")
    async def async_body(item_id: int, note: Annotated[str, Body(embed=True)]) -> dict[str, Any]:
        calls.append("async_body")
        return {"item_id": item_id, "note": note}

    async with client(app) as http:
        first = [
            await http.get("/async-with-request/7"),
            await http.get("/async-without-request/8?q=hi"),
            await http.get("/sync-without-request?x_token=abc"),
            await http.post("/sync-with-renamed-request", json={"name": "pen", "price_cents": 150}),
            await http.post("/async-body/9", json={"note": "n"}),
        ]
        assert [r.json() for r in first] == [
            {"item_id": 7, "path": "/async-with-request/7"},
            {"item_id": 8, "q": "hi"},
            {"tok": "token:abc"},
            {"item": {"name": "pen", "price_cents": 150}, "method": "POST"},
            {"item_id": 9, "note": "n"},
        ]
        assert all(r.headers["x-ratelimit-remaining"] == "1" for r in first)
        second = [
            await http.get("/async-with-request/70"),
            await http.get("/async-without-request/80"),
            await http.get("/sync-without-request"),
            await http.post("/sync-with-renamed-request", json={"name": "ink", "price_cents": 9}),
            await http.post("/async-body/90", json={"note": "m"}),
        ]
        assert [r.status_code for r in second] == [200] * 5
        third = [
            await http.get("/async-with-request/700"),
            await http.get("/async-without-request/800"),
            await http.get("/sync-without-request"),
            await http.post("/sync-with-renamed-request", json={"name": "x", "price_cents": 1}),
            await http.post("/async-body/900", json={"note": "o"}),
        ]
        assert [r.status_code for r in third] == [429] * 5
        assert all(r.json()["limit"] == 2 for r in third)
    # Denied requests never ran the endpoint.
    assert len(calls) == 10


async def test_fastapi_request_validation_422_is_untouched_and_uncharged(
    limiter: RateLimiter,
) -> None:
    app = fastapi_app()

    @app.get("/items/{item_id}")
    @limiter.limit("1/hour")
    async def get_item(item_id: int) -> dict[str, int]:
        return {"item_id": item_id}

    async with client(app) as http:
        invalid = await http.get("/items/not-a-number")
        assert invalid.status_code == 422
        assert invalid.json()["detail"][0]["loc"] == ["path", "item_id"]
        assert rate_headers(invalid) == {}
        # Validation runs before the wrapper: the quota is still whole.
        assert (await http.get("/items/1")).status_code == 200
        assert (await http.get("/items/1")).status_code == 429


def build_openapi_app(limiter: Optional[RateLimiter]) -> FastAPI:
    def limited(func: Any) -> Any:
        return limiter.limit("5/minute")(func) if limiter is not None else func

    app = FastAPI(title="shop", version="1")
    router = APIRouter(prefix="/v1", tags=["items"])

    @router.get("/items/{item_id}", response_model=Item)
    @limited
    async def read_item(item_id: int, q: Optional[str] = None) -> Item:
        return Item(name=str(item_id), price_cents=1)

    @router.post("/items", status_code=201)
    @limited
    def create_item(item: Item, request: Request, dry_run: bool = False) -> Item:
        return item

    @app.get("/health")
    @limited
    async def health() -> dict[str, str]:
        return {"ok": "yes"}

    app.include_router(router)
    return app


async def test_openapi_schema_is_unchanged(limiter: RateLimiter) -> None:
    plain = build_openapi_app(None).openapi()
    decorated = build_openapi_app(limiter).openapi()
    assert decorated == plain
    assert "moderato_request" not in str(decorated)


async def test_starlette_endpoint_shapes(limiter: RateLimiter) -> None:
    @limiter.limit("2/hour")
    async def async_endpoint(request: Any) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    @limiter.limit("2/hour")
    def sync_endpoint(request: Any) -> PlainTextResponse:
        return PlainTextResponse("sync")

    class Items(HTTPEndpoint):
        @limiter.limit("2/hour")
        async def get(self, request: Any) -> PlainTextResponse:
            return PlainTextResponse("class get")

        @limiter.limit("1/hour")
        def post(self, request: Any) -> PlainTextResponse:
            return PlainTextResponse("class post")

    app = Starlette(
        routes=[
            Route("/async", async_endpoint),
            Route("/sync", sync_endpoint),
            Route("/items", Items),
        ]
    )
    app.add_middleware(RateLimitHeadersMiddleware)
    async with client(app) as http:
        for path, body in (
            ("/async", '{"path":"/async"}'),
            ("/sync", "sync"),
            ("/items", "class get"),
        ):
            statuses = []
            for _ in range(3):
                response = await http.get(path)
                statuses.append(response.status_code)
                if response.status_code == 200:
                    assert response.text == body
            assert statuses == [200, 200, 429], path
        # The two methods of one HTTPEndpoint are two scopes ("GET:/items", "POST:/items").
        assert [(await http.post("/items")).status_code for _ in range(2)] == [200, 429]
    usage = await limiter.get_usage("127.0.0.1", "1/hour", scope="POST:/items")
    assert usage["current"] == 1


async def test_stacked_minute_and_day_decide_together(limiter: RateLimiter) -> None:
    # Seed 002: the daily limit rejects a request the minute limit admits; the two are
    # decided as one, so the rejected request is charged to neither.
    app = fastapi_app()

    @app.get("/chat")
    @limiter.limit("5/minute")
    @limiter.limit("3/day")
    async def chat() -> dict[str, str]:
        return {"reply": "hi"}

    async with client(app) as http:
        responses = [await http.get("/chat") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    # Admitted: the tighter of the two decisions is reported (3/day has fewer left).
    assert [r.headers["x-ratelimit-limit"] for r in responses] == ["3", "3", "3", "3"]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert responses[3].json()["limit"] == 3
    minute = await limiter.get_usage("127.0.0.1", "5/minute", scope="GET:/chat")
    day = await limiter.get_usage("127.0.0.1", "3/day", scope="GET:/chat")
    assert (minute["current"], day["current"]) == (3, 3)


async def test_one_decorator_with_two_policies_charges_nothing_on_rejection(
    limiter: RateLimiter,
) -> None:
    app = fastapi_app()

    @app.get("/chat")
    @limiter.limit("5/minute;3/day")
    async def chat() -> dict[str, str]:
        return {"reply": "hi"}

    async with client(app) as http:
        responses = [await http.get("/chat") for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["2", "1", "0", "0", "0"]
    usage = await limiter.get_usage("127.0.0.1", "5/minute;3/day", scope="GET:/chat")
    # Atomic: the minute policy was charged only for the three admitted requests.
    assert [p["current"] for p in usage["policies"]] == [3, 3]


@pytest.mark.parametrize("failing", ["key", "tenant", "cost", "rate"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_callback_failure_is_503_naming_it(
    limiter: RateLimiter, failing: str, flavour: str
) -> None:
    def broken_sync(request: Request) -> Any:
        raise LookupError("no such user")

    async def broken_async(request: Request) -> Any:
        await asyncio.sleep(0)
        raise LookupError("no such user")

    broken = broken_sync if flavour == "sync" else broken_async
    options: dict[str, Any] = {failing: broken}
    rate = options.pop("rate", "5/minute")
    app = fastapi_app()
    ran: list[int] = []

    @app.get("/guarded")
    @limiter.limit(rate, **options)
    async def guarded() -> dict[str, str]:
        ran.append(1)
        return {}

    async with client(app) as http:
        response = await http.get("/guarded")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": failing}
    assert rate_headers(response) == {}
    assert ran == []


@pytest.mark.parametrize(
    ("failing", "value"),
    [
        ("key", None),
        ("tenant", 5),
        ("cost", 2.5),
        ("cost", 0),
        ("cost", True),
        ("rate", "5/fortnight"),
    ],
)
async def test_callback_returning_an_unusable_value_is_503(
    limiter: RateLimiter, failing: str, value: Any
) -> None:
    options: dict[str, Any] = {failing: lambda request: value}
    rate = options.pop("rate", "5/minute")
    app = fastapi_app()

    @app.get("/guarded")
    @limiter.limit(rate, **options)
    async def guarded() -> dict[str, str]:
        return {}

    async with client(app) as http:
        response = await http.get("/guarded")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": failing}


async def test_oversized_callback_cost_is_a_permanent_422(limiter: RateLimiter) -> None:
    app = fastapi_app()

    @app.post("/api/ml/inference")
    @limiter.limit("5/hour", cost=lambda request: int(request.query_params["units"]))
    async def inference() -> dict[str, str]:
        return {"prediction": "..."}

    async with client(app) as http:
        oversized = await http.post("/api/ml/inference?units=6")
        assert oversized.status_code == 422
        assert oversized.json() == {"error": "Rate limit exceeded", "retry_after": None, "limit": 5}
        assert rate_headers(oversized) == {"x-ratelimit-limit": "5", "x-ratelimit-remaining": "5"}
        assert oversized.headers["content-type"] == "application/json"
        # Nothing was charged: a smaller request still uses the whole quota.
        fitting = await http.post("/api/ml/inference?units=2")
        assert fitting.status_code == 200
        assert fitting.headers["x-ratelimit-remaining"] == "3"
        # Temporary exhaustion stays a 429 with retry hints.
        temporary = await http.post("/api/ml/inference?units=4")
        assert temporary.status_code == 429
        assert int(temporary.headers["retry-after"]) >= 1
        assert "x-ratelimit-reset" in temporary.headers


async def test_static_configuration_errors_raise_at_decoration(limiter: RateLimiter) -> None:
    with pytest.raises(RateLimitConfigError, match="cost 6 exceeds capacity 5"):
        limiter.limit("5/minute", cost=6)
    with pytest.raises(RateLimitConfigError, match="cost 11 exceeds capacity 10"):
        limiter.limit("10/second;1000/day", cost=11)
    with pytest.raises(RateLimitConfigError, match="cost 6 exceeds capacity 5"):
        limiter.dependency("5/minute", cost=6)
    for bad_cost in (0, -1, True, 1.5, "2"):
        with pytest.raises(RateLimitConfigError):
            limiter.limit("5/minute", cost=bad_cost)  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError):
        limiter.limit("5/fortnight")
    with pytest.raises(RateLimitConfigError):
        limiter.limit("5/minute", algorithm="no_such_algorithm")
    with pytest.raises(RateLimitConfigError):
        limiter.limit("5/minute", scope=5)  # type: ignore[arg-type]
    # A cost equal to the capacity is admissible.
    assert callable(limiter.limit("5/minute", cost=5))


async def test_stacked_limits_that_would_share_a_counter_are_refused(
    limiter: RateLimiter,
) -> None:
    async def endpoint() -> None:
        return None

    per_minute = limiter.limit("5/minute")(endpoint)
    # A common window on the route's scope: each counts under its own (route#rate) scope.
    limiter.limit("100/minute;1000/day")(per_minute)
    # The same rate twice, or one explicit scope and a common window: one counter.
    with pytest.raises(RateLimitConfigError, match="would count in one counter"):
        limiter.limit("5/minute")(per_minute)
    searched = limiter.limit("5/minute", scope="search")(endpoint)
    with pytest.raises(RateLimitConfigError, match="would count in one counter"):
        limiter.limit("100/minute", scope="search")(searched)
    # Distinct windows, scopes, static identities or algorithms are distinct counters.
    limiter.limit("100/hour", scope="search")(searched)
    limiter.limit("100/minute", scope="global-search")(searched)
    limiter.limit("100/minute", scope="search", algorithm="sliding_window")(searched)
    keyed = limiter.limit("5/minute", scope="search", key="a")(endpoint)
    limiter.limit("100/minute", scope="search", key="b")(keyed)
    # Two limiters cannot decide one request atomically.
    other = RateLimiter("memory://")
    with pytest.raises(RateLimitConfigError, match="two RateLimiter objects"):
        other.limit("100/hour")(per_minute)


async def test_rate_callback_gives_per_tier_limits(limiter: RateLimiter) -> None:
    tiers = {"free": "2/hour", "premium": "4/hour"}
    app = fastapi_app()

    @app.get("/api/data")
    @limiter.limit(
        lambda request: tiers[request.headers.get("x-tier", "free")],
        key=lambda request: request.headers["x-api-key"],
        tenant=lambda request: request.headers.get("x-tier", "free"),
    )
    async def data() -> dict[str, str]:
        return {"data": "..."}

    async with client(app) as http:
        free = [await http.get("/api/data", headers={"x-api-key": "k1"}) for _ in range(3)]
        premium = [
            await http.get("/api/data", headers={"x-api-key": "k2", "x-tier": "premium"})
            for _ in range(5)
        ]
    assert [r.status_code for r in free] == [200, 200, 429]
    assert [r.status_code for r in premium] == [200, 200, 200, 200, 429]
    assert premium[0].headers["x-ratelimit-limit"] == "4"
    usage = await limiter.get_usage("k2", "4/hour", tenant_type="premium", scope="GET:/api/data")
    assert usage["current"] == 4


async def test_async_key_and_cost_callbacks(limiter: RateLimiter) -> None:
    async def user(request: Request) -> str:
        await asyncio.sleep(0)
        return f"user:{request.path_params['user_id']}"

    async def weight(request: Request) -> int:
        return 3 if request.method == "POST" else 1

    app = fastapi_app()

    @app.api_route("/api/user/{user_id}", methods=["GET", "POST"])
    @limiter.limit("10/hour", key=user, cost=weight, scope="user-api")
    async def user_data(user_id: str) -> dict[str, str]:
        return {"user_id": user_id}

    async with client(app) as http:
        assert (await http.post("/api/user/7")).headers["x-ratelimit-remaining"] == "7"
        assert (await http.get("/api/user/7")).headers["x-ratelimit-remaining"] == "6"
        assert (await http.get("/api/user/8")).headers["x-ratelimit-remaining"] == "9"
    usage = await limiter.get_usage("user:7", "10/hour", scope="user-api")
    assert usage["current"] == 4


async def test_tenants_are_isolated(limiter: RateLimiter) -> None:
    app = fastapi_app()

    @app.get("/report")
    @limiter.limit("1/hour", key="shared-key", tenant=lambda request: request.headers["x-org"])
    async def report() -> dict[str, str]:
        return {}

    async with client(app) as http:
        statuses = [
            (await http.get("/report", headers={"x-org": org})).status_code
            for org in ("acme", "acme", "globex", "globex")
        ]
    assert statuses == [200, 429, 200, 429]


async def test_dependency_on_a_route_and_on_a_router(limiter: RateLimiter) -> None:
    app = fastapi_app()

    @app.get("/single", dependencies=[Depends(limiter.dependency("2/hour"))])
    async def single() -> dict[str, str]:
        return {"route": "single"}

    @app.get("/value")
    async def value(decision: Any = Depends(limiter.dependency("3/hour"))) -> dict[str, Any]:  # noqa: B008
        return {"remaining": decision.remaining, "limit": decision.limit}

    router = APIRouter(prefix="/admin", dependencies=[Depends(limiter.dependency("1/hour"))])

    @router.get("/users")
    def admin_users() -> list[str]:
        return ["root"]

    @router.get("/users/{user_id}")
    async def admin_user(user_id: int) -> dict[str, int]:
        return {"user_id": user_id}

    app.include_router(router, prefix="/api")

    async with client(app) as http:
        single = [await http.get("/single") for _ in range(3)]
        assert [r.status_code for r in single] == [200, 200, 429]
        assert single[0].headers["x-ratelimit-limit"] == "2"
        assert single[2].json() == {
            "error": "Rate limit exceeded",
            "retry_after": int(single[2].headers["retry-after"]),
            "limit": 2,
        }
        assert (await http.get("/value")).json() == {"remaining": 2, "limit": 3}
        # One quota per route of the router, each under its own template.
        assert (await http.get("/api/admin/users")).status_code == 200
        assert (await http.get("/api/admin/users/1")).status_code == 200
        assert (await http.get("/api/admin/users/2")).status_code == 429
        assert (await http.get("/api/admin/users")).status_code == 429
    for scope in ("GET:/api/admin/users", "GET:/api/admin/users/{user_id}"):
        assert (await limiter.get_usage("127.0.0.1", "1/hour", scope=scope))["current"] == 1


async def test_a_bypass_omits_quota_headers(own_redis_server: RedisServer) -> None:
    # Seed: quota headers are left out when a stacked limit bypassed, whatever the order.
    # Stacked limits are decided in one call, so a backend that cannot decide it
    # bypasses every one of them.
    failing_open = RateLimiter(
        own_redis_server.url,
        key_prefix="it",
        fail_open=True,
        metrics_registry=CollectorRegistry(),
        connect_timeout_s=0.2,
    )
    own_redis_server.stop()
    app = fastapi_app()

    @app.get("/stacked")
    @failing_open.limit("5/minute")
    @failing_open.limit("10/hour")
    async def stacked() -> dict[str, str]:
        return {}

    @app.get("/with-dependency", dependencies=[Depends(failing_open.dependency("2/minute"))])
    @failing_open.limit("5/minute")
    async def with_dependency() -> dict[str, str]:
        return {}

    async with client(app) as http:
        for path in ("/stacked", "/with-dependency"):
            response = await http.get(path)
            assert response.status_code == 200
            assert not set(QUOTA_HEADERS) & set(response.headers), path
    await failing_open.close()


def _fastapi_streams_generators() -> bool:
    # JSON Lines streaming of generator endpoints arrived in newer FastAPI
    # releases; the ones installable on Python 3.9 reject such endpoints.
    probe = fastapi_app()
    try:

        @probe.get("/probe")
        async def probe_endpoint() -> AsyncIterator[dict[str, int]]:
            yield {"index": 0}

    except Exception:
        return False
    return True


@pytest.mark.skipif(
    not _fastapi_streams_generators(),
    reason="this FastAPI release does not stream generator endpoints",
)
async def test_generator_endpoints_are_checked_before_the_stream_starts(
    limiter: RateLimiter,
) -> None:
    # FastAPI streams generator endpoints (JSON Lines); the check must precede the headers.
    app = fastapi_app()
    produced: list[str] = []

    @app.get("/events")
    @limiter.limit("10/day")
    @limiter.limit("2/hour")
    async def events(n: int = 2) -> AsyncIterator[dict[str, int]]:
        for index in range(n):
            produced.append("async")
            yield {"index": index}

    @app.get("/lines")
    @limiter.limit("1/hour")
    def lines() -> Iterator[dict[str, str]]:
        produced.append("sync")
        yield {"line": "one"}

    async with client(app) as http:
        streamed = [await http.get("/events?n=3") for _ in range(3)]
        sync_streamed = [await http.get("/lines") for _ in range(2)]
    assert [r.status_code for r in streamed] == [200, 200, 429]
    assert streamed[0].text == '{"index":0}\n{"index":1}\n{"index":2}\n'
    assert streamed[0].headers["x-ratelimit-limit"] == "2"
    assert streamed[2].json()["limit"] == 2
    assert [r.status_code for r in sync_streamed] == [200, 429]
    assert sync_streamed[0].text == '{"line":"one"}\n'
    assert produced == ["async"] * 6 + ["sync"]
    # Both decorators decide together: the refused third request charged neither.
    outer = await limiter.get_usage("127.0.0.1", "10/day", scope="GET:/events")
    assert outer["current"] == 2
    assert "moderato" not in str(app.openapi())
