"""The floor, with moderato's own client: the bare app plus one EVALSHA per request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from benchmarks.apps import BODY, redis_url, timeouts
from benchmarks.apps._floor import SCRIPT_ARGS, SCRIPT_KEY, SCRIPT_SHA, SCRIPT_SOURCE
from moderato.redis import RedisClient
from moderato.scripts import Script

client = RedisClient.from_url(redis_url(), **timeouts())
script = Script(name="floor", source=SCRIPT_SOURCE, sha=SCRIPT_SHA)
keys = (SCRIPT_KEY,)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await client.connect()
    await client.execute("SCRIPT", "LOAD", SCRIPT_SOURCE)
    yield
    await client.close()


app = FastAPI(lifespan=lifespan)


@app.get("/health")
async def health() -> dict[str, Any]:
    return BODY


@app.get("/allowed")
async def allowed() -> dict[str, Any]:
    await client.evalsha(script, keys, SCRIPT_ARGS)
    return BODY
