"""moderato's app-wide RateLimitMiddleware; the rate depends on the path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request

from benchmarks.apps import (
    ALLOWED_RATE,
    BODY,
    LIMITED_RATE,
    algorithm,
    denial_cache,
    moderato_url,
    timeouts,
)
from moderato import RateLimiter
from moderato.integrations import RateLimitMiddleware

limiter = RateLimiter(
    moderato_url(), key_prefix="bench-e2e-middleware", **timeouts(), **denial_cache()
)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await limiter.connect()
    yield
    await limiter.close()


def rate_for(request: Request) -> str:
    return LIMITED_RATE if request.scope["path"] == "/limited" else ALLOWED_RATE


app = FastAPI(lifespan=lifespan)
app.add_middleware(
    RateLimitMiddleware,
    limiter=limiter,
    rate=rate_for,
    algorithm=algorithm(),
    exempt_paths=["/health"],
)


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed")
async def allowed() -> dict[str, Any]:
    return BODY


@app.get("/limited")
async def limited() -> dict[str, Any]:
    return BODY
