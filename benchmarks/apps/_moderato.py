"""The lifespan, headers middleware and /health of the apps limiting per endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from benchmarks.apps import BODY
from moderato import RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware


def endpoint_app(limiter: RateLimiter) -> FastAPI:
    """An app whose lifespan connects and closes ``limiter``; its routes are the caller's."""

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

    return app
