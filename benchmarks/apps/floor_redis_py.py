"""The floor, with redis-py's asyncio client: the bare app plus one EVALSHA per request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI

from benchmarks.apps import BODY, redis_url
from benchmarks.apps._floor import SCRIPT_ARGS, SCRIPT_KEY, SCRIPT_SHA, SCRIPT_SOURCE

client = aioredis.from_url(redis_url())


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await client.script_load(SCRIPT_SOURCE)
    yield
    await client.aclose()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed")
async def allowed() -> dict[str, Any]:
    await client.evalsha(SCRIPT_SHA, 1, SCRIPT_KEY, *SCRIPT_ARGS)
    return BODY
