"""Default scopes discovered from FastAPI and Starlette routing trees, through HTTP."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI, Request
from http_helpers import client
from same_name import alpha, beta
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Host, Mount, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from moderato import RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, route_scope
from moderato.integrations import scope as scope_module


def child_app(limiter: RateLimiter) -> FastAPI:
    # Middleware on the child: its own error middleware would answer 500 first.
    child = FastAPI()
    child.add_middleware(RateLimitHeadersMiddleware)

    @child.get("/items/{item_id}")
    @limiter.limit("2/hour")
    async def get_item(item_id: int, request: Request) -> dict[str, Any]:
        return {"scope": route_scope(request.scope)}

    return child


async def test_path_parameter_values_share_one_quota(limiter: RateLimiter) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/users/{user_id}/posts/{post_id}")
    @limiter.limit("2/hour")
    async def post(user_id: int, post_id: int, request: Request) -> dict[str, str]:
        return {"scope": route_scope(request.scope)}

    async with client(app) as http:
        first = await http.get("/users/1/posts/2")
        assert first.json() == {"scope": "GET:/users/{user_id}/posts/{post_id}"}
        assert (await http.get("/users/3/posts/4")).status_code == 200
        assert (await http.get("/users/5/posts/6")).status_code == 429
    usage = await limiter.get_usage(
        "127.0.0.1", "2/hour", scope="GET:/users/{user_id}/posts/{post_id}"
    )
    assert usage["current"] == 2


async def test_templated_mounts_share_values_and_isolate_templates(limiter: RateLimiter) -> None:
    child = child_app(limiter)
    app = FastAPI()
    app.mount("/tenants/{tenant}", child)
    app.mount("/orgs/{org}", child)

    async with client(app) as http:
        acme = await http.get("/tenants/acme/items/1")
        assert acme.json() == {"scope": "GET:/tenants/{tenant}/items/{item_id}"}
        assert (await http.get("/tenants/globex/items/2")).status_code == 200
        assert (await http.get("/tenants/initech/items/3")).status_code == 429
        # The same sub-app under another mount template has its own quota.
        org = await http.get("/orgs/acme/items/1")
        assert org.json() == {"scope": "GET:/orgs/{org}/items/{item_id}"}
        assert (await http.get("/orgs/b/items/1")).status_code == 200
        assert (await http.get("/orgs/c/items/1")).status_code == 429


async def test_starlette_mounts_hosts_and_nested_routers(limiter: RateLimiter) -> None:
    @limiter.limit("1/hour")
    async def endpoint(request: Any) -> JSONResponse:
        return JSONResponse({"scope": route_scope(request.scope)})

    wrapped = Starlette(routes=[Route("/deep/{leaf}", endpoint)])
    app = Starlette(
        routes=[
            Mount(
                "/regions/{region}",
                routes=[Mount("/zones/{zone:int}", routes=[Route("/racks/{rack}", endpoint)])],
            ),
            Host("{tenant}.example.org", app=Router(routes=[Route("/home", endpoint)])),
            # A mount whose app is wrapped in middleware: the tree is found through .app.
            Mount("/wrapped", app=RateLimitHeadersMiddleware(wrapped)),
            Route("/plain", endpoint, methods=["GET", "POST"]),
        ],
        middleware=[Middleware(RateLimitHeadersMiddleware)],
    )
    async with client(app) as http:
        rack = await http.get("/regions/eu/zones/3/racks/r1")
        assert rack.json() == {"scope": "GET:/regions/{region}/zones/{zone:int}/racks/{rack}"}
        assert (await http.get("/regions/us/zones/9/racks/r2")).status_code == 429
        home = await http.get("http://acme.example.org/home")
        assert home.json() == {"scope": "GET://{tenant}.example.org/home"}
        assert (await http.get("http://globex.example.org/home")).status_code == 429
        deep = await http.get("/wrapped/deep/x")
        assert deep.json() == {"scope": "GET:/wrapped/deep/{leaf}"}
        assert (await http.get("/plain")).json() == {"scope": "GET:/plain"}
        # Methods are part of the scope.
        assert (await http.post("/plain")).json() == {"scope": "POST:/plain"}
        assert (await http.get("/plain")).status_code == 429


async def test_router_prefixes_and_repeated_inclusion(limiter: RateLimiter) -> None:
    users = APIRouter(prefix="/users")

    @users.get("/{user_id}")
    @limiter.limit("1/hour")
    async def get_user(user_id: int, request: Request) -> dict[str, str]:
        return {"scope": route_scope(request.scope)}

    v1 = APIRouter(prefix="/v1")
    v1.include_router(users)
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)
    app.include_router(v1, prefix="/api")
    app.include_router(users, prefix="/legacy")

    async with client(app) as http:
        nested = await http.get("/api/v1/users/1")
        assert nested.json() == {"scope": "GET:/api/v1/users/{user_id}"}
        assert (await http.get("/api/v1/users/2")).status_code == 429
        # The same route object included again under another prefix: another bucket.
        legacy = await http.get("/legacy/users/1")
        assert legacy.json() == {"scope": "GET:/legacy/users/{user_id}"}
        assert (await http.get("/legacy/users/2")).status_code == 429


async def test_same_named_endpoints_in_two_modules_never_share(limiter: RateLimiter) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)
    app.include_router(alpha.build(limiter))
    app.include_router(beta.build(limiter))
    async with client(app) as http:
        assert [(await http.get("/alpha/items")).status_code for _ in range(3)] == [200, 200, 429]
        beta_response = await http.get("/beta/items")
        assert beta_response.json() == {"module": "beta"}
        assert beta_response.headers["x-ratelimit-remaining"] == "1"


async def test_explicit_scope_shares_one_bucket_across_routes_and_mounts(
    limiter: RateLimiter,
) -> None:
    child = FastAPI()
    child.add_middleware(RateLimitHeadersMiddleware)

    @child.get("/search")
    @limiter.limit("3/hour", scope="search-api")
    async def child_search() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/search")
    @limiter.limit("3/hour", scope="search-api")
    async def search() -> dict[str, str]:
        return {}

    @app.get("/v2/find")
    @limiter.limit("3/hour", scope="search-api")
    def find() -> dict[str, str]:
        return {}

    app.mount("/shop/{shop}", child)
    async with client(app) as http:
        statuses = [
            (await http.get(path)).status_code
            for path in ("/search", "/v2/find", "/shop/a/search", "/shop/b/search")
        ]
    assert statuses == [200, 200, 200, 429]
    assert (await limiter.get_usage("127.0.0.1", "3/hour", scope="search-api"))["current"] == 3


async def test_root_path_is_part_of_the_scope(limiter: RateLimiter) -> None:
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/items/{item_id}")
    @limiter.limit("1/hour")
    async def get_item(item_id: int, request: Request) -> dict[str, str]:
        return {"scope": route_scope(request.scope)}

    async with client(app, root_path="/gateway") as http:
        first = await http.get("/gateway/items/1")
        assert first.json() == {"scope": "GET:/gateway/items/{item_id}"}
        assert (await http.get("/gateway/items/2")).status_code == 429


class OpaqueRouter:
    """A hand-written ASGI dispatcher: nothing in it shows a routing tree."""

    def __init__(self, target: ASGIApp) -> None:
        self._target = target

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._target(scope, receive, send)


async def test_opaque_mount_falls_back_and_warns_once(
    limiter: RateLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    inner = FastAPI()
    inner.add_middleware(RateLimitHeadersMiddleware)

    @inner.get("/things/{thing_id}")
    @limiter.limit("2/hour")
    async def opaque_thing(thing_id: int, request: Request) -> dict[str, str]:
        return {"scope": route_scope(request.scope)}

    app = Starlette(routes=[Mount("/opaque/{site}", app=OpaqueRouter(inner))])
    fallback = (
        f"GET:fallback:{__name__}.test_opaque_mount_falls_back_and_warns_once.<locals>.opaque_thing"
    )
    with caplog.at_level(logging.WARNING, logger="moderato"):
        async with client(app) as http:
            first = await http.get("/opaque/a/things/1")
            assert first.json() == {"scope": fallback}
            # Never skipped: the fallback scope still limits, across parameter values.
            assert (await http.get("/opaque/b/things/2")).status_code == 200
            assert (await http.get("/opaque/c/things/3")).status_code == 429
    warnings = [r for r in caplog.records if "could not discover the route template" in r.message]
    assert len(warnings) == 1
    assert (await limiter.get_usage("127.0.0.1", "2/hour", scope=fallback))["current"] == 2


async def test_discovery_walks_the_tree_once_and_sees_late_routes(
    limiter: RateLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[int] = []
    original_walk = scope_module._walk

    def counting_walk(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("depth") == 0:
            walks.append(1)
        original_walk(*args, **kwargs)

    monkeypatch.setattr(scope_module, "_walk", counting_walk)
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/early/{n}")
    @limiter.limit("100/hour")
    async def early(n: int, request: Request) -> dict[str, str]:
        return {"scope": route_scope(request.scope)}

    async with client(app) as http:
        for n in range(5):
            assert (await http.get(f"/early/{n}")).status_code == 200
        assert len(walks) == 1

        @app.get("/late/{n}")
        @limiter.limit("100/hour")
        async def late(n: int, request: Request) -> dict[str, str]:
            return {"scope": route_scope(request.scope)}

        assert (await http.get("/late/1")).json() == {"scope": "GET:/late/{n}"}
        assert (await http.get("/late/2")).status_code == 200
        assert len(walks) == 2
