"""fastapi-limiter (0.2: a FastAPI dependency over pyrate-limiter) on Redis.

Its README's Limiter(Rate(...)) keeps counts in process memory; the Redis
setup is a pyrate-limiter RedisBucket (a sorted-set log: the sliding-window
log). A bucket has one Redis key, so each route gets its own bucket (one
quota per route shared by every client; with one load generator that is the
same as per client). The buckets need an async SCRIPT LOAD, so they are
attached in the lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import Depends, FastAPI
from fastapi_limiter.depends import RateLimiter
from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

from benchmarks.apps import BODY, redis_url

# The same rates as apps.ALLOWED_RATE and apps.LIMITED_RATE, in pyrate's terms.
ALLOWED = RateLimiter(limiter=None)  # type: ignore[arg-type]  # attached in lifespan
LIMITED = RateLimiter(limiter=None)  # type: ignore[arg-type]


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    client = aioredis.from_url(redis_url())
    for dependency, rate, key in (
        (ALLOWED, Rate(1_000_000, Duration.MINUTE), "bench-e2e-fl:allowed"),
        (LIMITED, Rate(1, Duration.HOUR), "bench-e2e-fl:limited"),
    ):
        dependency.limiter = Limiter(await RedisBucket.init([rate], client, key))
    yield
    await client.aclose()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed", dependencies=[Depends(ALLOWED)])
async def allowed() -> dict[str, Any]:
    return BODY


@app.get("/limited", dependencies=[Depends(LIMITED)])
async def limited() -> dict[str, Any]:
    return BODY
