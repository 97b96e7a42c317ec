"""moderato's blocking Redis clients, for threads: the same wire, replies and rules as the
asyncio ones (moderato.redis), over a bounded pool of connections per server.

They know nothing of rate limits; see client.py for the pool's contract.
"""

from __future__ import annotations

from .client import DEFAULT_MAX_CONNECTIONS, BlockingOptions, RedisClient
from .cluster import ClusterClient
from .connection import BlockingConnection
from .sentinel import SentinelClient

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "BlockingConnection",
    "BlockingOptions",
    "ClusterClient",
    "RedisClient",
    "SentinelClient",
]
