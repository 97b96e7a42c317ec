"""The app the Sentinel switchover tests run as real uvicorn processes.

``uvicorn sentinel_app:app`` with ``MODERATO_TEST_SENTINEL_URL`` and
``MODERATO_TEST_QUOTA`` set: one route, ``GET /quota``, limited to that
quota a day per ``X-Client`` header,
checked on the primary that URL's sentinels name. Every app process started
with the same URL shares the counters.
"""

from __future__ import annotations

import os

from fastapi import FastAPI, Request

from moderato import RateLimiter, install

RATE = f"{int(os.environ['MODERATO_TEST_QUOTA'])}/day"

limiter = RateLimiter(
    os.environ["MODERATO_TEST_SENTINEL_URL"],
    key_prefix="switchover",
    command_timeout_s=0.5,
    connect_timeout_s=0.5,
    breaker_cooldown_s=0.2,
)
app = FastAPI()
install(app, limiter)


def client_of(request: Request) -> str:
    return request.headers["x-client"]


@app.get("/quota")
@limiter.limit(RATE, key=client_of)
async def quota(request: Request) -> dict[str, str]:
    return {"admitted": client_of(request)}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
