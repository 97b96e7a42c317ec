"""The floor, with moderato's own client: the bare app plus one EVALSHA per request."""

from __future__ import annotations

from typing import Any

from benchmarks.apps import redis_url, timeouts
from benchmarks.apps._floor import SCRIPT_ARGS, SCRIPT_KEY, SCRIPT_SHA, SCRIPT_SOURCE, floor_app
from moderato.redis import RedisClient
from moderato.scripts import Script

client = RedisClient.from_url(redis_url(), **timeouts())
script = Script(name="floor", source=SCRIPT_SOURCE, sha=SCRIPT_SHA)
keys = (SCRIPT_KEY,)


async def start() -> None:
    await client.connect()
    await client.execute("SCRIPT", "LOAD", SCRIPT_SOURCE)


def round_trip() -> Any:
    return client.evalsha(script, keys, SCRIPT_ARGS)


app = floor_app(start, client.close, round_trip)
