"""The floor, with redis-py's asyncio client: the bare app plus one EVALSHA per request."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from benchmarks.apps import redis_url
from benchmarks.apps._floor import SCRIPT_ARGS, SCRIPT_KEY, SCRIPT_SHA, SCRIPT_SOURCE, floor_app

client = aioredis.from_url(redis_url())


async def start() -> None:
    await client.script_load(SCRIPT_SOURCE)


def round_trip() -> Any:
    return client.evalsha(SCRIPT_SHA, 1, SCRIPT_KEY, *SCRIPT_ARGS)


app = floor_app(start, client.aclose, round_trip)
