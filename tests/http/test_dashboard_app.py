"""moderato.dashboard's ASGI application under uvicorn: auth on every route, CSRF on the
reset, its own requests never limited nor counted, exact usage and reset, and nothing
served that gives away a password, the identity secret or an API key."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import websockets
from example_helpers import clear_of_boundary
from fastapi import APIRouter, Depends, FastAPI, WebSocket
from redis_servers import RedisServer
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from uvicorn_helpers import Serve

from moderato import RateLimitConfigError, RateLimiter, install
from moderato.dashboard import Dashboard
from moderato.dashboard.fleet import FleetKeys
from moderato.errors import BackendError
from moderato.integrations import ClientIdentity, RateLimitMiddleware

ROUTES = [
    ("GET", "/ratelimits/"),
    ("GET", "/ratelimits/api/summary"),
    ("GET", "/ratelimits/api/usage?identity=127.0.0.1"),
    ("POST", "/ratelimits/api/reset"),
    ("GET", "/ratelimits/no/such/page"),
]


def fastapi_app(limiter: RateLimiter, dashboard: Dashboard, app_rate: str = "100/minute") -> Any:
    app = FastAPI()
    install(app, limiter, rate=app_rate, require_backend=False)

    @app.get("/work")
    @limiter.limit("3/minute")
    async def work() -> dict[str, bool]:
        return {"ok": True}

    app.mount("/ratelimits", dashboard)
    return app


def starlette_app(limiter: RateLimiter, dashboard: Dashboard, app_rate: str = "100/minute") -> Any:
    @limiter.limit("3/minute")
    async def work(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/work", work), Mount("/ratelimits", dashboard)])
    install(app, limiter, rate=app_rate, require_backend=False)
    return app


async def csrf_client(base: str) -> tuple[httpx.AsyncClient, dict[str, str]]:
    """A client that has loaded the page: its cookie, and the header the page sends."""
    client = httpx.AsyncClient(base_url=base)
    page = await client.get("/ratelimits/")
    assert page.status_code == 200
    token = client.cookies["moderato_dashboard_csrf"]
    assert f'content="{token}"' in page.text
    return client, {"X-CSRF-Token": token}


# -- safe by default ------------------------------------------------------------------


def test_without_auth_it_refuses_to_be_built() -> None:
    limiter = RateLimiter("memory://", key_prefix="dash-noauth")
    with pytest.raises(RateLimitConfigError, match=r"needs auth=.*allow_anonymous=True"):
        Dashboard(limiter)
    with pytest.raises(RateLimitConfigError, match="both auth= and allow_anonymous"):
        Dashboard(limiter, auth=lambda request: True, allow_anonymous=True)
    with pytest.raises(RateLimitConfigError, match="auth must be a callable"):
        Dashboard(limiter, auth="secret")  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match="takes the RateLimiter"):
        Dashboard("memory://", allow_anonymous=True)  # type: ignore[arg-type]
    assert limiter.recorder is None  # nothing attached by a refused construction


async def refuse(request: Request) -> bool:
    return False


def raise_401(request: Request) -> bool:
    raise HTTPException(401, "log in first", headers={"WWW-Authenticate": "Bearer"})


def broken(request: Request) -> bool:
    raise RuntimeError("the session store is down")


@pytest.mark.parametrize(
    ("auth", "status"),
    [(lambda request: False, 403), (refuse, 403), (lambda request: "", 403),
     (lambda request: 1, 403), (raise_401, 401), (broken, 403)],
    ids=["false", "async-false", "empty-name", "truthy-not-true", "http-401", "raises"],
)  # fmt: skip
async def test_a_failing_auth_answers_every_route_401_or_403(
    serve: Serve, redis_url: str, auth: Any, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="dash-auth")
    # Something to reset, which a refused reset must leave alone.
    assert (await limiter.check_with_info("127.0.0.1", "3/minute", scope="GET:/work")).allowed
    base = await serve(fastapi_app(limiter, Dashboard(limiter, auth=auth)))
    async with httpx.AsyncClient(base_url=base) as client:
        for method, path in ROUTES:
            reply = await client.request(
                method, path, json={"identity": "127.0.0.1"}, headers={"X-CSRF-Token": "x" * 43}
            )
            assert reply.status_code == status, (method, path)
            assert reply.headers["content-type"] == "application/json"
            assert "moderato" not in reply.text.lower()  # nothing of the page or its data
            if status == 401:
                assert reply.headers["www-authenticate"] == "Bearer"
    usage = await limiter.get_usage("127.0.0.1", "3/minute", scope="GET:/work")
    assert usage["current"] == 1
    if auth is broken:
        assert "auth raised" in caplog.text
    await limiter.close()


async def test_auth_sync_or_async_lets_an_operator_in_and_names_them_in_the_log(
    serve: Serve, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="dash-operator")

    async def operator(request: Request) -> str | bool:
        return "alice" if request.headers.get("x-token") == "good" else False

    base = await serve(fastapi_app(limiter, Dashboard(limiter, auth=operator)))
    client = httpx.AsyncClient(base_url=base, headers={"x-token": "good"})
    page = await client.get("/ratelimits/")
    token = client.cookies["moderato_dashboard_csrf"]
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    caplog.set_level(logging.WARNING, logger="moderato.dashboard")
    reset = await client.post(
        "/ratelimits/api/reset", json={"identity": "10.1.1.1"}, headers={"X-CSRF-Token": token}
    )
    assert reset.status_code == 200 and reset.json()["deleted"] == 0
    assert "alice reset the usage of 10.1.1.1" in caplog.text
    wrong = await client.get("/ratelimits/api/summary", headers={"x-token": "bad"})
    assert wrong.status_code == 403
    await client.aclose()
    await limiter.close()


async def test_the_reset_needs_the_pages_token_and_no_foreign_origin(
    serve: Serve, redis_url: str
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="dash-csrf")
    base = await serve(fastapi_app(limiter, Dashboard(limiter, allow_anonymous=True)))
    client, headers = await csrf_client(base)
    body = {"identity": "127.0.0.1"}
    assert (await client.post("/ratelimits/api/reset", json=body)).status_code == 403
    forged = {"X-CSRF-Token": "A" * 43}
    forged_reply = await client.post("/ratelimits/api/reset", json=body, headers=forged)
    assert forged_reply.status_code == 403
    foreign = {**headers, "Origin": "https://evil.example"}
    refused = await client.post("/ratelimits/api/reset", json=body, headers=foreign)
    assert refused.status_code == 403 and "evil.example" in refused.json()["error"]
    # A page of another site cannot read the cookie: without the cookie the header is not enough.
    bare = httpx.AsyncClient(base_url=base)
    assert (await bare.post("/ratelimits/api/reset", json=body, headers=headers)).status_code == 403
    same = {**headers, "Origin": base}
    assert (await client.post("/ratelimits/api/reset", json=body, headers=same)).status_code == 200
    assert (await client.get("/ratelimits/api/reset")).status_code == 405
    bad = await client.post("/ratelimits/api/reset", content=b"[1]", headers=headers)
    assert bad.status_code == 400
    missing = await client.post("/ratelimits/api/reset", json={"identity": " "}, headers=headers)
    assert missing.status_code == 400 and "identity is required" in missing.json()["error"]
    await client.aclose()
    await bare.aclose()
    await limiter.close()


# -- its own requests are never limited nor counted --------------------------------


@pytest.mark.parametrize("make_app", [fastapi_app, starlette_app], ids=["fastapi", "starlette"])
async def test_its_routes_are_exempt_from_the_apps_limits_and_never_counted(
    serve: Serve, redis_url: str, make_app: Any
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="dash-exempt")
    dashboard = Dashboard(limiter, allow_anonymous=True)
    base = await serve(make_app(limiter, dashboard, app_rate="2/minute"))
    async with httpx.AsyncClient(base_url=base) as client:
        for _ in range(8):
            for path in ("/ratelimits/", "/ratelimits/api/summary"):
                assert (await client.get(path)).status_code == 200
        assert (await client.get("/ratelimits")).status_code in (200, 307)
        statuses = [(await client.get("/work")).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]  # the app-wide 2/minute, whole
        assert dashboard.publisher is not None
        await dashboard.publisher.publish_once()
        summary = (await client.get("/ratelimits/api/summary")).json()
    assert summary["totals"] == {
        "allowed": 5,  # 2 requests x (app-wide + route), then the route's fit in the refused one
        "denied": 1,
        "permanent": 0,
        "bypassed": 0,
        "error": 0,
        "shadow_denied": 0,
    }
    by_kind = {row["kind"]: row for row in summary["limits"]}
    assert by_kind["RateLimitMiddleware"]["decisions"] == 3
    assert by_kind["RateLimitMiddleware"]["where"] == ["every request"]
    assert by_kind["@limiter.limit"]["decisions"] == 3
    assert by_kind["@limiter.limit"]["where"] == ["GET /work"]
    assert set(by_kind) == {"RateLimitMiddleware", "@limiter.limit"}
    await limiter.close()


# -- inspect and reset -------------------------------------------------------------


async def test_inspect_reads_exact_usage_and_reset_lets_the_identity_through(
    serve: Serve, redis_url: str
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="dash-usage")
    base = await serve(fastapi_app(limiter, Dashboard(limiter, allow_anonymous=True)))
    client, headers = await csrf_client(base)
    # Every count below is of one minute's fixed windows (once in CI the four requests
    # straddled a minute's end: four 200s).
    await clear_of_boundary(60, margin_s=5.0)
    assert [(await client.get("/work")).status_code for _ in range(4)] == [200, 200, 200, 429]
    await limiter.check_with_info("127.0.0.1", "10/hour", scope="exports", tenant="pro")
    usage = (await client.get("/ratelimits/api/usage", params={"identity": "127.0.0.1"})).json()
    read = {
        row["scope"]: (row["current"], row["remaining"], row["limit"]) for row in usage["limits"]
    }
    # The refused request was charged nowhere: the app-wide limit is decided with the route's.
    assert read == {"app": (3, 97, 100), "GET:/work": (3, 0, 3), "exports": (0, 10, 10)}
    with_tenant = await client.get(
        "/ratelimits/api/usage", params={"identity": "127.0.0.1", "tenant": "pro"}
    )
    rows = {row["scope"]: row for row in with_tenant.json()["limits"]}
    assert (rows["exports"]["current"], rows["exports"]["tenant"]) == (1, "pro")

    reset = await client.post(
        "/ratelimits/api/reset", json={"identity": "127.0.0.1", "tenant": "pro"}, headers=headers
    )
    assert reset.status_code == 200
    assert reset.json()["deleted"] == 3  # the app-wide and route counters, the tenant's one
    assert (await client.get("/work")).status_code == 200
    after = (await client.get("/ratelimits/api/usage", params={"identity": "127.0.0.1"})).json()
    read = {row["scope"]: row["current"] for row in after["limits"]}
    assert read == {"app": 1, "GET:/work": 1, "exports": 0}
    await client.aclose()
    await limiter.close()


async def test_a_reset_the_backend_refuses_is_a_503_that_says_so(
    serve: Serve, own_redis_server: RedisServer
) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="dash-down", connect_timeout_s=0.2)
    base = await serve(fastapi_app(limiter, Dashboard(limiter, allow_anonymous=True)))
    client, headers = await csrf_client(base)
    own_redis_server.stop()
    reply = await client.post("/ratelimits/api/reset", json={"identity": "x"}, headers=headers)
    assert reply.status_code == 503
    assert reply.json()["error"].startswith("Backend")
    summary = await client.get("/ratelimits/api/summary")
    assert summary.status_code == 500 or summary.status_code == 200
    await client.aclose()
    with pytest.raises(BackendError):
        await limiter.check("x", "1/minute")
    await limiter.close()


# -- nothing it serves leaks a secret ----------------------------------------------


async def test_nothing_served_or_published_holds_a_password_secret_or_api_key(
    serve: Serve, own_redis_server: RedisServer
) -> None:
    own_redis_server.command("CONFIG", "SET", "requirepass", "hunter2-pass")
    url = own_redis_server.url.replace("redis://", "redis://:hunter2-pass@")
    secret = b"identity-secret-0123456789abcdef"
    identity = ClientIdentity(api_key_header="X-API-Key")
    limiter = RateLimiter(url, key_prefix="dash-leak", identity_secret=secret, key=identity)
    dashboard = Dashboard(limiter, allow_anonymous=True)
    base = await serve(fastapi_app(limiter, dashboard))
    client, headers = await csrf_client(base)
    raw_key = "sk_live_RAWKEY_51234"
    for _ in range(5):
        await client.get("/work", headers={"X-API-Key": raw_key})
    # An error message naming the URL, as connection errors do.
    plan = limiter._plans.get("3/minute", None)
    dashboard.recorder.failed(plan, "GET:/work", BackendError(f"cannot reach {url}"), False)
    assert dashboard.publisher is not None and await dashboard.publisher.publish_once()
    served = [
        (await client.get("/ratelimits/")).text,
        (await client.get("/ratelimits/api/summary")).text,
        (await client.get("/ratelimits/api/usage", params={"identity": f"apikey:{raw_key}"})).text,
        (
            await client.post(
                "/ratelimits/api/reset", json={"identity": f"apikey:{raw_key}"}, headers=headers
            )
        ).text,
    ]
    redis = limiter.backend.client  # type: ignore[attr-defined]
    for key in await redis.execute("KEYS", f"{FleetKeys('dash-leak').base}:process:*"):
        fields = await redis.execute("HGETALL", key)
        served.append(b" ".join(fields).decode())
    assert len(served) == 5
    forbidden = ["hunter2", raw_key, "RAWKEY", secret.decode(), secret.hex()]
    for text in served:
        for word in forbidden:
            assert word not in text
    summary = (await client.get("/ratelimits/api/summary")).json()
    shown = summary["top_identities"]["rows"][0]["identity"]
    assert shown.startswith("!") and len(shown) == 33  # the keyed hash, as in the Redis keys
    assert summary["health"]["errors"][0]["message"].startswith("cannot reach redis://")
    await client.aclose()
    await limiter.close()


# -- every declared limit, where it applies ---------------------------------------


async def test_every_declared_limit_is_listed_where_it_applies(serve: Serve) -> None:
    """Decorators, dependencies (route and router), RateLimitMiddleware with per-path
    costs (also in a mounted app), websocket handshakes and message limits; each
    with the checks it claims, on memory://, which says it sees this process only."""
    limiter = RateLimiter("memory://", key_prefix="dash-declared")
    app = FastAPI()
    install(app, limiter, rate="100/minute", costs={"/export": 5}, exempt_paths=["/health"])
    router = APIRouter(prefix="/v1", dependencies=[Depends(limiter.dependency("50/minute"))])

    @router.get("/items/{item_id}")
    @limiter.limit("5/minute", algorithm="token_bucket", tenant="pro")
    async def item(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    @app.get("/export")
    async def export() -> dict[str, bool]:
        return {"export": True}

    @app.get("/burst")
    @limiter.limit("1/hour", burst=3, algorithm="token_bucket")
    async def burst() -> dict[str, bool]:
        return {"burst": True}

    messages = limiter.message_limit("3/second")

    @app.websocket("/chat")
    @limiter.limit("2/minute", scope="chat-handshakes")
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        for _ in range(4):
            await websocket.receive_text()
            decision = await messages.check(websocket)
            await websocket.send_text("ok" if decision.allowed else "slow down")
        await websocket.close()

    async def inner(request: Request) -> JSONResponse:
        return JSONResponse({"inner": True})

    child = Starlette(routes=[Route("/ping", inner)])
    child.add_middleware(RateLimitMiddleware, limiter=limiter, rate="7/minute", scope="child")
    app.include_router(router)
    app.mount("/child", child)
    app.mount("/ratelimits", Dashboard(limiter, allow_anonymous=True))
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/v1/items/1")).status_code == 200
        assert (await client.get("/v1/items/2")).status_code == 200
        assert (await client.get("/export")).status_code == 200
        assert (await client.get("/child/ping")).status_code == 200
        assert [(await client.get("/burst")).status_code for _ in range(4)] == [200] * 3 + [429]
        async with websockets.connect(base.replace("http", "ws") + "/chat") as socket:
            replies = []
            for _ in range(4):
                await socket.send("hi")
                replies.append(await socket.recv())
        assert replies == ["ok", "ok", "ok", "slow down"]
        await limiter.check_with_info("manual", "9/hour", scope="reports")
        summary = (await client.get("/ratelimits/api/summary")).json()
        usage = (await client.get("/ratelimits/api/usage", params={"identity": "127.0.0.1"})).json()
    rows = {(row["kind"], row["rate"]): row for row in summary["limits"]}
    bursting = rows["@limiter.limit", "1/hour"]
    assert (bursting["burst"], bursting["decisions"], bursting["counts"]["denied"]) == (3, 4, 1)
    read = {row["scope"]: row for row in usage["limits"]}
    assert (read["GET:/burst"]["burst"], read["GET:/burst"]["current"]) == (3, 3)
    assert read["GET:/burst"]["limit"] == 3  # the bucket holds the burst
    app_wide = [row for row in summary["limits"] if row["kind"] == "RateLimitMiddleware"]
    assert sorted((row["scope"], tuple(row["where"]), row["cost"]) for row in app_wide) == [
        ("app", ("every request",), "1"),
        ("app", ("requests to /export",), "5 on /export"),
        ("child", ("every request",), "1"),
    ]
    assert sum(row["decisions"] for row in app_wide if row["scope"] == "app") == 9
    assert [row["decisions"] for row in app_wide if row["scope"] == "child"] == [1]
    decorated = rows["@limiter.limit", "5/minute"]
    assert (decorated["where"], decorated["algorithm"], decorated["tenant"]) == (
        ["GET /v1/items/{item_id}"], "token_bucket", "pro")  # fmt: skip
    assert decorated["scope"] == "per route: GET:/v1/items/{item_id}"
    assert decorated["decisions"] == 2
    router_wide = rows["limiter.dependency", "50/minute"]
    assert router_wide["where"] == ["GET /v1/items/{item_id}"] and router_wide["decisions"] == 2
    handshake = rows["@limiter.limit", "2/minute"]
    assert (handshake["where"], handshake["scope"], handshake["decisions"]) == (
        ["WS /chat"], "chat-handshakes", 1)  # fmt: skip
    message_rows = rows["limiter.message_limit", "3/second"]
    assert message_rows["where"] == ["websocket messages"]
    assert message_rows["counts"]["allowed"] == 3 and message_rows["counts"]["denied"] == 1
    manual = rows["check()", "9/hour"]
    assert (manual["scope"], manual["decisions"]) == ("reports", 1)
    assert summary["totals"]["allowed"] + summary["totals"]["denied"] == sum(
        row["decisions"] for row in summary["limits"]
    )
    assert summary["processes"] == {
        "count": 1, "fleet": False, "list": summary["processes"]["list"]}  # fmt: skip
    assert summary["backend"]["kind"] == "memory"
    await limiter.close()
