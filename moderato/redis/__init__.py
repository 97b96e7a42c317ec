"""moderato's own minimal asyncio Redis client (RESP2, auto-pipelined, hiredis-framed).

It knows nothing of rate limits; see docs/internals.md for its contract.
"""

from __future__ import annotations

from ._encoding import Arg
from .client import BACKOFF_CAP_S, BACKOFF_START_S, RedisClient, ScriptLike
from .cluster import ClusterClient, ClusterCounters
from .connection import RedisConnection
from .errors import RedisClientError, RedisConnectionError, RedisReplyError
from .sentinel import SentinelClient
from .url import (
    ClusterAddress,
    RedisAddress,
    SentinelAddress,
    is_cluster_url,
    is_sentinel_url,
    mask_url,
    parse_cluster_url,
    parse_sentinel_url,
    parse_url,
)

__all__ = [
    "BACKOFF_CAP_S",
    "BACKOFF_START_S",
    "Arg",
    "ClusterAddress",
    "ClusterClient",
    "ClusterCounters",
    "RedisAddress",
    "RedisClient",
    "RedisClientError",
    "RedisConnection",
    "RedisConnectionError",
    "RedisReplyError",
    "ScriptLike",
    "SentinelAddress",
    "SentinelClient",
    "is_cluster_url",
    "is_sentinel_url",
    "mask_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "parse_url",
]
