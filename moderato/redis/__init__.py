"""moderato's own minimal asyncio Redis client (RESP2, auto-pipelined, hiredis-framed).

It knows nothing of rate limits; see docs/internals.md for its contract.
"""

from __future__ import annotations

from . import url
from ._encoding import Arg
from .client import BACKOFF_CAP_S, BACKOFF_START_S, RedisClient, ScriptLike
from .cluster import ClusterClient, ClusterCounters
from .connection import RedisConnection
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .sentinel import SentinelClient
from .url import *  # noqa: F403 (url.__all__, which __all__ below takes in)

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_START_S",
    "Arg",
    "ClusterClient",
    "ClusterCounters",
    "RedisClient",
    "RedisClientError",
    "RedisConnection",
    "RedisConnectionError",
    "RedisReplyError",
    "ScriptLike",
    "SentinelClient",
]
__all__ += url.__all__  # the addresses and their parsers
