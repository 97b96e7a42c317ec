"""slowapi as its documentation sets it up: the ``@limiter.limit`` decorator.

slowapi drives ``limits``' synchronous strategies, so ``redis://`` means the
blocking redis-py client, called on the event loop (slowapi has no async
storage path). Its default strategy is the fixed window, as moderato's.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from slowapi import Limiter, _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.util import get_remote_address
from starlette.requests import Request

from benchmarks.apps import ALLOWED_RATE, BODY, LIMITED_RATE, redis_url

limiter = Limiter(key_func=get_remote_address, storage_uri=redis_url())

app = FastAPI()
app.state.limiter = limiter
app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed")
@limiter.limit(ALLOWED_RATE)
async def allowed(request: Request) -> dict[str, Any]:
    return BODY


@app.get("/limited")
@limiter.limit(LIMITED_RATE)
async def limited(request: Request) -> dict[str, Any]:
    return BODY
