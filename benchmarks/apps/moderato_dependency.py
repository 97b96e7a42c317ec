"""moderato through ``Depends(limiter.dependency(...))`` and the headers middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from benchmarks.apps import ALLOWED_RATE, BODY, LIMITED_RATE, algorithm, redis_url
from moderato import RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware

limiter = RateLimiter(redis_url(), key_prefix="bench-e2e-dependency")


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await limiter.connect()
    yield
    await limiter.close()


app = FastAPI(lifespan=lifespan)
app.add_middleware(RateLimitHeadersMiddleware)  # 429 responses and X-RateLimit-* headers


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get(
    "/allowed", dependencies=[Depends(limiter.dependency(ALLOWED_RATE, algorithm=algorithm()))]
)
async def allowed() -> dict[str, Any]:
    return BODY


@app.get(
    "/limited", dependencies=[Depends(limiter.dependency(LIMITED_RATE, algorithm=algorithm()))]
)
async def limited() -> dict[str, Any]:
    return BODY
