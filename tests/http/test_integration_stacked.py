"""Several limits on one request: middleware, app/router/route dependencies, decorators.

Every limit that applies to a request is decided with the others, atomically:
the request is admitted only if every limit admits it, each limit counts on
its own counter, and a request one limit refuses is charged by none. Each
shape runs on memory:// (clock frozen) and on a real redis-server, over httpx
in process or a real uvicorn, and asserts exact counts and headers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Optional

import httpx
import pytest
import websockets
from cluster import RedisCluster
from example_helpers import clear_of_boundary
from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from http_helpers import client
from redis_servers import PATIENT_TIMEOUT_S, RedisServer
from starlette.applications import Starlette
from starlette.endpoints import HTTPEndpoint
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from uvicorn_helpers import running
from websockets.exceptions import InvalidStatus

from moderato import RateLimitConfigError, RateLimiter, install
from moderato.integrations import RateLimitMiddleware
from moderato.integrations.combinations import check_routes

FROZEN_MS = 1_800_000_030_000  # mid-minute: no window of a minute or more rolls over
IP = "127.0.0.1"


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    """A fixed-window limiter on memory:// (frozen clock) or on the session's redis-server."""
    if request.param == "memory":
        url = "memory://"
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        server.command("FLUSHALL")
        url = server.url
        await clear_of_boundary(60, margin_s=15.0)
    limiter = RateLimiter(url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="st")
    if request.param == "memory":
        limiter.backend.clock = lambda: FROZEN_MS  # type: ignore[attr-defined]
    async with limiter:
        yield limiter


async def get_all(app: Any, path: str, count: int, **options: Any) -> list[httpx.Response]:
    async with client(app, **options) as http:
        return [await http.get(path) for _ in range(count)]


async def get_over_tcp(port: int, path: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        return [await http.get(path) for _ in range(count)]


def statuses(responses: list[httpx.Response]) -> list[int]:
    return [response.status_code for response in responses]


def header(responses: list[httpx.Response], name: str) -> list[Optional[str]]:
    return [response.headers.get(name) for response in responses]


async def used(limiter: RateLimiter, rate: str, scope: str, key: str = IP) -> int:
    usage = await limiter.get_usage(key, rate, scope=scope)
    current: int = usage["current"]
    return current


# -- the shapes of the report -------------------------------------------------------------


async def test_app_dependency_and_decorator_admit_the_tighter_limit(limiter: RateLimiter) -> None:
    # Before: they shared the route's counter and both charged it, so 2 of 4 got through.
    app = FastAPI(dependencies=[Depends(limiter.dependency("10/minute"))])
    install(app, limiter)

    @app.get("/x")
    @limiter.limit("4/minute")
    async def x() -> dict[str, str]:
        return {}

    @app.get("/y")
    async def y() -> dict[str, str]:
        return {}

    responses = await get_all(app, "/x", 6)
    assert statuses(responses) == [200] * 4 + [429] * 2
    assert header(responses, "x-ratelimit-limit") == ["4"] * 6
    assert header(responses, "x-ratelimit-remaining") == ["3", "2", "1", "0", "0", "0"]
    assert header(responses, "retry-after")[:4] == [None] * 4
    assert 1 <= int(responses[4].headers["retry-after"]) <= 60
    assert responses[4].json()["limit"] == 4
    # Each limit counts on its own counter: the route's scope and its rate.
    assert await used(limiter, "10/minute", "GET:/x#10/minute") == 4
    assert await used(limiter, "4/minute", "GET:/x#4/minute") == 4
    # Alone on a route, the dependency keeps the route's own scope.
    assert statuses(await get_all(app, "/y", 11)) == [200] * 10 + [429]
    assert await used(limiter, "10/minute", "GET:/y") == 10


async def test_router_and_route_dependencies_admit_the_tighter_limit(
    limiter: RateLimiter,
) -> None:
    # Before: 1 of 3.
    router = APIRouter(dependencies=[Depends(limiter.dependency("100/minute"))])

    @router.get("/y", dependencies=[Depends(limiter.dependency("3/minute"))])
    async def y() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.include_router(router)
    install(app, limiter)
    responses = await get_all(app, "/y", 5)
    assert statuses(responses) == [200, 200, 200, 429, 429]
    assert header(responses, "x-ratelimit-limit") == ["3"] * 5
    assert header(responses, "x-ratelimit-remaining") == ["2", "1", "0", "0", "0"]
    assert await used(limiter, "100/minute", "GET:/y#100/minute") == 3
    assert await used(limiter, "3/minute", "GET:/y#3/minute") == 3


async def test_middleware_and_decorator_charge_nothing_for_a_refused_request(
    limiter: RateLimiter,
) -> None:
    # Before: the two requests the decorator refused still counted app-wide, so /other
    # got 1 of its 3.
    app = FastAPI()
    install(app, limiter, rate="5/minute")

    @app.get("/z")
    @limiter.limit("2/minute")
    async def z() -> dict[str, str]:
        return {}

    @app.get("/other")
    async def other() -> dict[str, str]:
        return {}

    on_z = await get_all(app, "/z", 4)
    assert statuses(on_z) == [200, 200, 429, 429]
    # The route's limit has fewer left than the app's: it speaks for the response.
    assert header(on_z, "x-ratelimit-limit") == ["2"] * 4
    assert header(on_z, "x-ratelimit-remaining") == ["1", "0", "0", "0"]
    assert on_z[2].json()["limit"] == 2
    assert await used(limiter, "5/minute", "app") == 2
    on_other = await get_all(app, "/other", 5)
    assert statuses(on_other) == [200, 200, 200, 429, 429]
    assert header(on_other, "x-ratelimit-limit") == ["5"] * 5
    assert header(on_other, "x-ratelimit-remaining") == ["2", "1", "0", "0", "0"]
    assert await used(limiter, "5/minute", "app") == 5
    assert await used(limiter, "2/minute", "GET:/z") == 2


async def test_a_refusal_by_the_middleware_charges_no_route_limit(limiter: RateLimiter) -> None:
    app = FastAPI()
    install(app, limiter, rate="2/hour")

    @app.get("/z", dependencies=[Depends(limiter.dependency("4/hour"))])
    @limiter.limit("5/hour")
    async def z() -> dict[str, str]:
        return {}

    responses = await get_all(app, "/z", 4)
    assert statuses(responses) == [200, 200, 429, 429]
    # The app-wide limit refused: its quota is the one reported.
    assert header(responses, "x-ratelimit-limit") == ["2"] * 4
    assert header(responses, "x-ratelimit-remaining") == ["1", "0", "0", "0"]
    assert responses[2].json()["limit"] == 2
    assert await used(limiter, "4/hour", "GET:/z#4/hour") == 2
    assert await used(limiter, "5/hour", "GET:/z#5/hour") == 2


async def test_a_refusal_by_one_route_limit_charges_no_other(limiter: RateLimiter) -> None:
    app = FastAPI(dependencies=[Depends(limiter.dependency("2/hour"))])
    install(app, limiter)

    @app.get("/z")
    @limiter.limit("3/hour")
    @limiter.limit("10/day")
    async def z() -> dict[str, str]:
        return {}

    responses = await get_all(app, "/z", 4)
    assert statuses(responses) == [200, 200, 429, 429]
    assert header(responses, "x-ratelimit-limit") == ["2"] * 4
    assert await used(limiter, "2/hour", "GET:/z#2/hour") == 2
    assert await used(limiter, "3/hour", "GET:/z#3/hour") == 2
    # No window in common with the others: it keeps the route's scope.
    assert await used(limiter, "10/day", "GET:/z") == 2


async def test_different_costs_and_algorithms_are_decided_as_one(limiter: RateLimiter) -> None:
    app = FastAPI()
    install(app, limiter, rate="10/hour")

    @app.get("/export")
    @limiter.limit("6/hour", cost=2, algorithm="sliding_log")
    async def export() -> dict[str, str]:
        return {}

    @app.get("/page")
    async def page() -> dict[str, str]:
        return {}

    exports = await get_all(app, "/export", 5)
    assert statuses(exports) == [200, 200, 200, 429, 429]
    assert header(exports, "x-ratelimit-limit") == ["6"] * 5
    assert header(exports, "x-ratelimit-remaining") == ["4", "2", "0", "0", "0"]
    assert await used(limiter, "10/hour", "app") == 3
    pages = await get_all(app, "/page", 8)
    assert statuses(pages) == [200] * 7 + [429]
    assert await used(limiter, "10/hour", "app") == 10
    usage = await limiter.get_usage(IP, "6/hour", scope="GET:/export", algorithm="sliding_log")
    assert usage["current"] == 6


async def test_two_middlewares_and_a_route_limit(limiter: RateLimiter) -> None:
    app = FastAPI()

    @app.get("/z")
    @limiter.limit("3/hour")
    async def z() -> dict[str, str]:
        return {}

    @app.get("/other")
    async def other() -> dict[str, str]:
        return {}

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="4/hour", scope="inner")
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="10/hour", scope="outer")
    assert statuses(await get_all(app, "/z", 4)) == [200, 200, 200, 429]
    assert statuses(await get_all(app, "/other", 3)) == [200, 429, 429]
    assert await used(limiter, "10/hour", "outer") == 4
    assert await used(limiter, "4/hour", "inner") == 4
    assert await used(limiter, "3/hour", "GET:/z") == 3


async def test_exempt_when_leaves_one_limit_out(limiter: RateLimiter) -> None:
    def internal(request: Request) -> bool:
        return request.headers.get("x-internal") == "yes"

    app = FastAPI(dependencies=[Depends(limiter.dependency("2/hour", exempt_when=internal))])
    install(app, limiter)

    @app.get("/z")
    @limiter.limit("3/hour")
    async def z() -> dict[str, str]:
        return {}

    internal_calls = await get_all(app, "/z", 4, headers={"x-internal": "yes"})
    assert statuses(internal_calls) == [200, 200, 200, 429]
    assert await used(limiter, "2/hour", "GET:/z#2/hour") == 0
    assert await used(limiter, "3/hour", "GET:/z#3/hour") == 3


async def test_ietf_headers_list_every_limit_of_the_request(limiter: RateLimiter) -> None:
    app = FastAPI(dependencies=[Depends(limiter.dependency("10/hour"))])
    install(app, limiter, rate="100/day", headers="ietf")

    @app.get("/z")
    @limiter.limit("4/minute")
    async def z() -> dict[str, str]:
        return {}

    response = (await get_all(app, "/z", 1))[0]
    assert response.status_code == 200
    assert response.headers["ratelimit-policy"] == (
        '"100-per-86400s";q=100;w=86400, "10-per-3600s";q=10;w=3600, "4-per-60s";q=4;w=60'
    )
    assert response.headers["ratelimit"].startswith('"4-per-60s";r=3;t=')


async def test_a_mounted_application_is_routed_by_the_parent_middleware(
    limiter: RateLimiter,
) -> None:
    child = FastAPI()

    @child.get("/items/{item_id}")
    @limiter.limit("2/hour")
    async def item(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    parent = FastAPI()
    parent.mount("/api", child)
    install(parent, limiter, rate="5/hour")

    async with client(parent) as http:
        responses = [await http.get(f"/api/items/{n}") for n in range(4)]
        others = [await http.get("/missing") for _ in range(4)]
    assert statuses(responses) == [200, 200, 429, 429]
    assert statuses(others) == [404, 404, 404, 429]
    assert await used(limiter, "2/hour", "GET:/api/items/{item_id}") == 2
    assert await used(limiter, "5/hour", "app") == 5


async def test_app_wide_limits_of_a_parent_and_a_mounted_child(limiter: RateLimiter) -> None:
    child = FastAPI()
    install(child, limiter, rate="3/hour", scope="child")

    @child.get("/items")
    @limiter.limit("2/hour")
    async def items() -> dict[str, str]:
        return {}

    @child.get("/other")
    async def other() -> dict[str, str]:
        return {}

    parent = FastAPI()
    parent.mount("/api", child)
    install(parent, limiter, rate="5/hour")

    @parent.get("/top")
    async def top() -> dict[str, str]:
        return {}

    assert statuses(await get_all(parent, "/api/items", 4)) == [200, 200, 429, 429]
    assert statuses(await get_all(parent, "/api/other", 3)) == [200, 429, 429]
    assert statuses(await get_all(parent, "/top", 3)) == [200, 200, 429]
    assert await used(limiter, "2/hour", "GET:/api/items") == 2
    assert await used(limiter, "3/hour", "child") == 3
    assert await used(limiter, "5/hour", "app") == 5


async def test_an_http_endpoint_class_with_decorated_methods(limiter: RateLimiter) -> None:
    class Items(HTTPEndpoint):
        @limiter.limit("2/hour")
        async def get(self, request: Request) -> JSONResponse:
            return JSONResponse({})

        async def post(self, request: Request) -> JSONResponse:
            return JSONResponse({})

    app = Starlette(routes=[Route("/items", Items)])
    install(app, limiter, rate="5/hour")
    assert statuses(await get_all(app, "/items", 3)) == [200, 200, 429]
    async with client(app) as http:
        posts = [(await http.post("/items")).status_code for _ in range(4)]
    assert posts == [200, 200, 200, 429]
    assert await used(limiter, "5/hour", "app") == 5


async def test_dependency_overrides_take_a_limit_out(limiter: RateLimiter) -> None:
    per_route = limiter.dependency("1/hour")
    app = FastAPI(dependencies=[Depends(per_route)])
    install(app, limiter, rate="5/hour")

    @app.get("/z")
    @limiter.limit("3/hour")
    async def z() -> dict[str, str]:
        return {}

    app.dependency_overrides[per_route] = lambda: None
    assert statuses(await get_all(app, "/z", 4)) == [200, 200, 200, 429]
    assert await used(limiter, "1/hour", "GET:/z#1/hour") == 0
    assert await used(limiter, "3/hour", "GET:/z") == 3
    assert await used(limiter, "5/hour", "app") == 3


async def test_include_router_dependencies_stack_with_the_route_limit(
    limiter: RateLimiter,
) -> None:
    router = APIRouter()

    @router.get("/items")
    @limiter.limit("2/hour")
    async def items() -> dict[str, str]:
        return {}

    app = FastAPI(dependencies=[Depends(limiter.dependency("3/hour"))])
    everyone = limiter.dependency("20/hour", key="everyone")
    app.include_router(router, prefix="/v1", dependencies=[Depends(everyone)])
    install(app, limiter, rate="10/hour")
    assert statuses(await get_all(app, "/v1/items", 3)) == [200, 200, 429]
    assert await used(limiter, "3/hour", "GET:/v1/items#3/hour") == 2
    assert await used(limiter, "2/hour", "GET:/v1/items#2/hour") == 2
    assert await used(limiter, "20/hour", "GET:/v1/items#20/hour", key="everyone") == 2
    assert await used(limiter, "10/hour", "app") == 2


# -- websocket handshakes ------------------------------------------------------------------


async def handshake(port: int, path: str) -> Any:
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}{path}") as ws:
            return await ws.recv()
    except InvalidStatus as refused:
        response = refused.response
        return (response.status_code, json.loads(bytes(response.body or b"{}")))


async def test_handshakes_are_decided_with_the_app_wide_limit(limiter: RateLimiter) -> None:
    app = FastAPI()
    install(app, limiter, rate="3/hour")

    @app.websocket("/chat", dependencies=[Depends(limiter.dependency("4/hour"))])
    @limiter.limit("2/hour")
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    @app.get("/page")
    async def page() -> dict[str, str]:
        return {}

    async with running(app) as port:
        chats = [await handshake(port, "/chat") for _ in range(3)]
        pages = statuses(await get_over_tcp(port, "/page", 2))
    assert chats[:2] == ["hello", "hello"]
    status, body = chats[2]
    assert (status, body["limit"]) == (429, 2)
    # The refused handshake charged nothing: the app-wide limit has one request left.
    assert pages == [200, 429]
    assert await used(limiter, "3/hour", "app") == 3
    assert await used(limiter, "4/hour", "WS:/chat#4/hour") == 2
    assert await used(limiter, "2/hour", "WS:/chat#2/hour") == 2


# -- real uvicorn ------------------------------------------------------------------------------


async def test_every_kind_of_limit_on_real_uvicorn(limiter: RateLimiter) -> None:
    router = APIRouter(dependencies=[Depends(limiter.dependency("100/minute"))])

    @router.get("/x", dependencies=[Depends(limiter.dependency("5/minute"))])
    @limiter.limit("4/minute")
    async def x() -> dict[str, str]:
        return {}

    app = FastAPI(dependencies=[Depends(limiter.dependency("10/minute"))])
    app.include_router(router)
    install(app, limiter, rate="6/minute")

    @app.get("/other")
    async def other() -> dict[str, str]:
        return {}

    async with running(app) as port:
        on_x = await get_over_tcp(port, "/x", 6)
        on_other = await get_over_tcp(port, "/other", 4)
    assert statuses(on_x) == [200] * 4 + [429] * 2
    assert header(on_x, "x-ratelimit-limit") == ["4"] * 6
    assert header(on_x, "x-ratelimit-remaining") == ["3", "2", "1", "0", "0", "0"]
    assert statuses(on_other) == [200, 200, 429, 429]
    for rate in ("100/minute", "10/minute", "5/minute", "4/minute"):
        assert await used(limiter, rate, f"GET:/x#{rate}") == 4, rate
    assert await used(limiter, "6/minute", "app") == 6


# -- what cannot be decided as one is refused at start-up ----------------------------------


async def start(app: Any) -> None:
    """Run the app's startup (install()'s checks), as a server would."""
    async with app.router.lifespan_context(app):
        pass


async def test_install_refuses_limits_of_two_limiters_on_one_route() -> None:
    first, second = RateLimiter("memory://"), RateLimiter("memory://")
    app = FastAPI()
    install(app, first, rate="100/minute")

    @app.get("/x")
    @second.limit("4/minute")
    async def x() -> dict[str, str]:
        return {}

    with pytest.raises(RateLimitConfigError) as refused:
        await start(app)
    message = str(refused.value)
    assert message.startswith("route GET /x: RateLimitMiddleware('100/minute') and ")
    assert "@limiter.limit('4/minute')" in message
    assert "use one RateLimiter for every limit of a request" in message


async def test_install_refuses_the_same_rate_twice_on_one_route() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI(dependencies=[Depends(limiter.dependency("10/minute"))])
    install(app, limiter)

    @app.get("/x")
    @limiter.limit("10/minute")
    async def x() -> dict[str, str]:
        return {}

    with pytest.raises(RateLimitConfigError) as refused:
        await start(app)
    assert str(refused.value) == (
        "route GET /x: limiter.dependency('10/minute') and @limiter.limit('10/minute') apply "
        "to one request, but they would count in one counter (the same scope, algorithm and "
        "window): give one of them its own scope=, or remove one"
    )


async def test_install_refuses_cross_slot_limits_on_a_cluster() -> None:
    # Checked before anything connects: no cluster is needed to refuse.
    limiter = RateLimiter("redis+cluster://127.0.0.1:1")
    app = FastAPI()
    install(app, limiter, rate="100/minute")

    @app.get("/x")
    @limiter.limit("4/minute")
    async def x() -> dict[str, str]:
        return {}

    with pytest.raises(RateLimitConfigError, match="different Redis Cluster hash slots"):
        await start(app)
    # Different windows on one route share its scope, so its slot: accepted.
    ok = FastAPI()
    install(ok, limiter)

    @ok.get("/y", dependencies=[Depends(limiter.dependency("100/hour"))])
    @limiter.limit("4/minute")
    async def y() -> dict[str, str]:
        return {}

    with pytest.raises(RateLimitConfigError, match="hash slots"):
        limiter.limit("10/minute")(y)
    check_routes(ok, [])


async def test_a_middleware_without_install_refuses_at_the_first_request() -> None:
    first, second = RateLimiter("memory://"), RateLimiter("memory://")
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=first, rate="100/minute")

    @app.get("/x")
    @second.limit("4/minute")
    async def x() -> dict[str, str]:
        return {}

    with pytest.raises(RateLimitConfigError, match="two RateLimiter objects"):
        await get_all(app, "/x", 1)


async def test_a_limit_the_middleware_could_not_see_is_refused() -> None:
    limiter = RateLimiter("memory://")
    inner = Starlette()

    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse({})

    inner.add_route("/items", limiter.limit("2/hour")(endpoint))

    async def opaque(scope: Any, receive: Any, send: Any) -> None:
        await inner(scope, receive, send)

    app = Starlette(routes=[Mount("/api", app=opaque)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="5/hour")
    with pytest.raises(RateLimitConfigError) as refused:
        await get_all(app, "/api/items", 1)
    message = str(refused.value)
    assert "@limiter.limit('2/hour') runs after this request was decided by" in message
    assert "cannot see the routes of the application mounted at /api" in message
    await limiter.close()


async def test_limits_of_one_slot_are_decided_as_one_on_a_cluster() -> None:
    # Different windows on the route's own scope: every key in one slot. Different
    # algorithms and costs: one composite call on the node that owns it.
    cluster = RedisCluster(replicas=0).start()
    try:
        limiter = RateLimiter(cluster.url, key_prefix="st")
        app = FastAPI(dependencies=[Depends(limiter.dependency("100/hour"))])
        install(app, limiter)

        @app.get(
            "/x", dependencies=[Depends(limiter.dependency("10/day", cost=2, algorithm="gcra"))]
        )
        @limiter.limit("4/minute")
        async def x() -> dict[str, str]:
            return {}

        await clear_of_boundary(60, margin_s=15.0)
        await start(app)
        async with limiter:
            responses = await get_all(app, "/x", 6)
            assert statuses(responses) == [200] * 4 + [429] * 2
            assert header(responses, "x-ratelimit-limit") == ["4"] * 6
            assert await used(limiter, "100/hour", "GET:/x") == 4
            assert await used(limiter, "4/minute", "GET:/x") == 4
            gcra = await limiter.get_usage(IP, "10/day", scope="GET:/x", algorithm="gcra")
            assert gcra["current"] == 8
    finally:
        cluster.close()
