"""moderato's own minimal asyncio Redis client (RESP2, auto-pipelined, hiredis-framed).

It knows nothing of rate limits; see docs/internals.md for its contract.
"""

from __future__ import annotations

from ._encoding import Arg
from .client import BACKOFF_CAP_S, BACKOFF_START_S, RedisClient, ScriptLike
from .connection import RedisConnection
from .url import RedisAddress, mask_url, parse_url

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_START_S",
    "Arg",
    "RedisAddress",
    "RedisClient",
    "RedisConnection",
    "ScriptLike",
    "mask_url",
    "parse_url",
]
