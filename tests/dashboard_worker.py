"""One process of the dashboard's fleet test: an app with several limits and the dashboard,
served by uvicorn (tests/uvicorn_helpers.py) on a free port, which it prints.

    python tests/dashboard_worker.py redis://127.0.0.1:6390

Each request meets exactly one limit, so the decisions a dashboard counts are the
requests sent. Identities come from the ``X-User`` header (else the address).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from fastapi import Depends, FastAPI, Request
from uvicorn_helpers import running

from moderato import RateLimiter, install
from moderato.dashboard import Dashboard

PREFIX = "fleet-demo"
ITEMS_RATE = "1000/minute"
# Hour-long windows: a test's few seconds of traffic never straddle two of them.
SEARCH_RATE, SEARCH_SCOPE = "40/hour", "search"
EXPORT_RATE = "10/hour"


def user(request: Request) -> str:
    return request.headers.get("x-user") or (request.client.host if request.client else "?")


def export_cost(request: Request) -> int:
    return int(request.query_params.get("cost", "1"))


def create_app(redis_url: str) -> FastAPI:
    limiter = RateLimiter(redis_url, key_prefix=PREFIX, key=user)
    app = FastAPI()
    install(app, limiter)

    @app.get("/api/items")
    @limiter.limit(ITEMS_RATE)
    async def items() -> dict[str, Any]:
        return {"items": []}

    search_limit = limiter.dependency(SEARCH_RATE, scope=SEARCH_SCOPE)

    @app.get("/api/search", dependencies=[Depends(search_limit)])
    async def search() -> dict[str, Any]:
        return {"results": []}

    @app.get("/api/export")
    @limiter.limit(EXPORT_RATE, cost=export_cost, algorithm="token_bucket")
    async def export() -> dict[str, Any]:
        return {"export": "ready"}

    app.mount("/ratelimits", Dashboard(limiter, allow_anonymous=True))
    return app


async def serve(redis_url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    async with running(create_app(redis_url)) as port:
        print(port, flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
