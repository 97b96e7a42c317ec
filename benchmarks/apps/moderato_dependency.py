"""moderato through ``Depends(limiter.dependency(...))`` and the headers middleware."""

from __future__ import annotations

from typing import Any

from fastapi import Depends

from benchmarks.apps import (
    ALLOWED_RATE,
    BODY,
    LIMITED_RATE,
    algorithm,
    denial_cache,
    moderato_url,
    timeouts,
)
from benchmarks.apps._moderato import endpoint_app
from moderato import RateLimiter

limiter = RateLimiter(
    moderato_url(), key_prefix="bench-e2e-dependency", **timeouts(), **denial_cache()
)
app = endpoint_app(limiter)
allowed_limit = limiter.dependency(ALLOWED_RATE, algorithm=algorithm())
limited_limit = limiter.dependency(LIMITED_RATE, algorithm=algorithm())


@app.get("/allowed", dependencies=[Depends(allowed_limit)])
async def allowed() -> dict[str, Any]:
    return BODY


@app.get("/limited", dependencies=[Depends(limited_limit)])
async def limited() -> dict[str, Any]:
    return BODY
