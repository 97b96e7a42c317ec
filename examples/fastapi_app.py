"""The moderato demo app: every algorithm, a cost, a shared scope, usage, reset and a live page.

    make demo                                   # the algorithm comparison, then this app on :8000
    uvicorn examples.fastapi_app:app            # this app alone (after `make demo-env`)
    MODERATO_REDIS_URL=memory:// uvicorn examples.fastapi_app:app

The backend: MODERATO_REDIS_URL when set, else the Redis on localhost:6379
when one answers there, else memory:// (examples/backend_choice.py); the
first log line says which.

Open http://127.0.0.1:8000/ for the live page. What the app shows:

- ``GET /api/algorithms/<name>``: one route per algorithm in
  ``moderato.algorithms.ALGORITHMS``, each limited to ``5/10 seconds`` per client;
- ``GET /api/export``: a cost of 5 against ``20/minute`` (four exports a minute);
- ``GET /api/search`` and ``GET /api/search/suggestions``: one explicit scope,
  ``search``, so both routes draw on one bucket of ``10/minute``;
- ``GET /api/items/{item_id}``: ``3/second;30/minute`` as a FastAPI dependency,
  decided atomically, with the default scope (every item id shares it);
- ``GET /api/ping``: only the app-wide ``300/minute`` of ``RateLimitMiddleware``,
  which every other limited ``/api`` route is also under;
- ``GET /api/usage`` and ``POST /api/reset``: the caller's quotas, read and cleared;
- ``GET /api/status`` (health: ``redis_connected``) and ``GET /metrics``
  (Prometheus), both exempt from limits;
- ``/ratelimits/``: the operator's dashboard (moderato.dashboard): live decisions,
  every limit above, the most-limited clients, the backend's health, and one
  client's usage with a reset. Open to anyone who can reach the app
  (``allow_anonymous=True``): ``make demo`` serves on 127.0.0.1 only. A real app
  passes ``auth=`` instead (docs/dashboard.md).

Clients are told apart by the ``X-API-Key`` header when they send one, else
by their address; no proxy header is believed. That suits a demo whose page
plays several clients; in a real app an unvalidated key lets a client mint a
fresh quota per request: validate keys in the key callback and fall back to
the address (docs/http.md, "Identity").
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from moderato import BackendError, RateLimiter, install
from moderato.algorithms import ALGORITHMS
from moderato.dashboard import Dashboard
from moderato.integrations import ClientIdentity

try:  # `uvicorn examples.fastapi_app:app`, from the repository's root
    from examples.backend_choice import backend_url
except ModuleNotFoundError:  # `python examples/<name>.py`: its own folder is on the path
    from backend_choice import backend_url

logger = logging.getLogger("moderato.demo")

PAGE = Path(__file__).with_name("demo_page.html")

ALGORITHM_RATE = "5/10 seconds"
EXPORT_RATE, EXPORT_COST = "20/minute", 5
SEARCH_RATE, SEARCH_SCOPE = "10/minute", "search"
ITEMS_RATE = "3/second;30/minute"
APP_RATE, APP_SCOPE = "300/minute", "app"
DASHBOARD_PATH = "/ratelimits"
UNLIMITED_PATHS = ["/", "/favicon.ico", "/api/status", "/api/routes", "/api/usage", "/metrics"]

IDENTITY = ClientIdentity(api_key_header="X-API-Key")


@dataclass(frozen=True)
class DemoRoute:
    """One limited route, as the page lists it and as usage and reset find its bucket."""

    id: str
    label: str
    url: str
    """What the page requests (a concrete path for a templated route)."""
    rate: str
    algorithm: str
    scope: str
    cost: int = 1


def demo_routes(default_algorithm: str) -> list[DemoRoute]:
    routes = [
        DemoRoute(
            id=name,
            label=f"{name.replace('_', ' ')} ({ALGORITHM_RATE})",
            url=f"/api/algorithms/{name}",
            rate=ALGORITHM_RATE,
            algorithm=name,
            scope=f"algorithm:{name}",
        )
        for name in ALGORITHMS
    ]
    routes.append(
        DemoRoute(
            id="export",
            label=f"export, cost {EXPORT_COST} ({EXPORT_RATE})",
            url="/api/export",
            rate=EXPORT_RATE,
            algorithm=default_algorithm,
            scope="export",
            cost=EXPORT_COST,
        )
    )
    for route_id, url in (("search", "/api/search"), ("suggestions", "/api/search/suggestions")):
        routes.append(
            DemoRoute(
                id=route_id,
                label=f"{route_id}, scope '{SEARCH_SCOPE}' shared ({SEARCH_RATE})",
                url=url,
                rate=SEARCH_RATE,
                algorithm=default_algorithm,
                scope=SEARCH_SCOPE,
            )
        )
    routes.append(
        DemoRoute(
            id="items",
            label=f"items/{{item_id}}, dependency ({ITEMS_RATE})",
            url="/api/items/42",
            rate=ITEMS_RATE,
            algorithm=default_algorithm,
            # The default scope: method, root path and route template (filled in per request).
            scope="GET:{root_path}/api/items/{{item_id}}",
        )
    )
    routes.append(
        DemoRoute(
            id="ping",
            label=f"ping, app-wide limit only ({APP_RATE})",
            url="/api/ping",
            rate=APP_RATE,
            algorithm=default_algorithm,
            scope=APP_SCOPE,
        )
    )
    return routes


def create_app(redis_url: Optional[str] = None) -> FastAPI:
    """The demo app on ``redis_url`` (default: as examples/backend_choice.py chooses)."""
    url = redis_url or backend_url("fastapi_app")
    limiter = RateLimiter(url, key_prefix="moderato-demo", enable_metrics=True)
    routes = demo_routes(limiter.default_algorithm)

    app = FastAPI(title="moderato demo")
    app.state.limiter = limiter
    # One call: the app-wide limit (decided before routing, and the headers and
    # 429/422/503 answers of the decorated routes), connect/close with the app,
    # the decorator-order check. The demo starts even without its backend:
    # checks connect by themselves once it is back, and /api/status reports the
    # outage to the health check meanwhile.
    install(
        app,
        limiter,
        rate=APP_RATE,
        key=IDENTITY,
        scope=APP_SCOPE,
        exempt_paths=UNLIMITED_PATHS,
        require_backend=False,
    )

    for name in ALGORITHMS:
        app.add_api_route(
            f"/api/algorithms/{name}", algorithm_endpoint(limiter, name), methods=["GET"]
        )

    @app.get("/api/export")
    @limiter.limit(EXPORT_RATE, key=IDENTITY, cost=EXPORT_COST, scope="export")
    async def export() -> dict[str, Any]:
        return {"export": "ready", "cost": EXPORT_COST}

    @app.get("/api/search")
    @limiter.limit(SEARCH_RATE, key=IDENTITY, scope=SEARCH_SCOPE)
    async def search(q: str = "") -> dict[str, Any]:
        return {"query": q, "results": []}

    @app.get("/api/search/suggestions")
    @limiter.limit(SEARCH_RATE, key=IDENTITY, scope=SEARCH_SCOPE)
    async def suggestions(q: str = "") -> dict[str, Any]:
        return {"query": q, "suggestions": []}

    items_limit = limiter.dependency(ITEMS_RATE, key=IDENTITY)

    @app.get("/api/items/{item_id}", dependencies=[Depends(items_limit)])
    async def item(item_id: int) -> dict[str, Any]:
        return {"item_id": item_id}

    @app.get("/api/ping")
    async def ping() -> dict[str, str]:
        return {"ping": "pong"}

    @app.get("/api/routes")
    async def list_routes(request: Request) -> list[dict[str, Any]]:
        return [{**asdict(route), "scope": bucket_scope(route, request)} for route in routes]

    @app.get("/api/usage")
    async def usage(request: Request) -> dict[str, Any]:
        """The caller's quota on every demo route: a read-only snapshot, nothing is charged."""
        identity = IDENTITY(request)
        report = {}
        for route in routes:
            snapshot = await limiter.get_usage(
                identity,
                route.rate,
                scope=bucket_scope(route, request),
                algorithm=route.algorithm,
            )
            report[route.id] = {
                key: snapshot[key]
                for key in ("limit", "current", "remaining", "reset_at", "window_seconds")
            }
        return {"identity": identity, "routes": report}

    @app.post("/api/reset")
    async def reset(request: Request) -> dict[str, Any]:
        """Forget the caller's usage on every demo route (and the app-wide limit)."""
        identity = IDENTITY(request)
        deleted = 0
        for route in routes:
            deleted += await limiter.reset(
                identity,
                rate=route.rate,
                scope=bucket_scope(route, request),
                algorithm=route.algorithm,
            )
        return {"identity": identity, "deleted": deleted}

    @app.get("/api/status")
    async def status() -> JSONResponse:
        backend = "memory" if url.startswith("memory://") else "redis"
        try:
            # A read-only peek: one round trip to the backend, nothing charged.
            await limiter.get_usage("status-probe", "1/second", scope="status")
            backend_ok = True
        except BackendError:
            backend_ok = False
        body = {
            "status": "ok" if backend_ok else "unavailable",
            "backend": backend,
            "redis_connected": backend == "redis" and backend_ok,
        }
        return JSONResponse(body, status_code=200 if backend_ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    # The operator's view of all of the above; its own requests are never limited.
    app.mount(DASHBOARD_PATH, Dashboard(limiter, allow_anonymous=True, title="moderato demo"))
    return app


def algorithm_endpoint(limiter: RateLimiter, name: str) -> Any:
    @limiter.limit(ALGORITHM_RATE, key=IDENTITY, algorithm=name, scope=f"algorithm:{name}")
    async def endpoint() -> dict[str, Any]:
        return {"algorithm": name, "admitted": True}

    endpoint.__name__ = f"algorithm_{name}"
    return endpoint


def bucket_scope(route: DemoRoute, request: Request) -> str:
    return route.scope.format(root_path=request.scope.get("root_path", ""))


app = create_app()
