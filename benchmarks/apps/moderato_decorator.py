"""moderato as documented for endpoints: ``@limiter.limit`` + RateLimitHeadersMiddleware."""

from __future__ import annotations

from typing import Any

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
    moderato_url(), key_prefix="bench-e2e-decorator", **timeouts(), **denial_cache()
)
app = endpoint_app(limiter)


@app.get("/allowed")
@limiter.limit(ALLOWED_RATE, algorithm=algorithm())
async def allowed() -> dict[str, Any]:
    return BODY


@app.get("/limited")
@limiter.limit(LIMITED_RATE, algorithm=algorithm())
async def limited() -> dict[str, Any]:
    return BODY
