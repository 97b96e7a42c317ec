"""A reset's announcement: the channel every denial cache under a key prefix listens on.

A reset deletes keys in Redis; a limiter that remembers denials of those
keys (denial_cache.py) must forget them. So every limiter on a single server,
asyncio or blocking, cache or not, publishes one message after each reset,
and every denial cache subscribes to the channel and empties itself on any
message.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("moderato")

RESET_MESSAGE = b"reset"
"""What a reset publishes on the channel (any message empties every cache)."""


def channel_for(key_prefix: str) -> bytes:
    """The pub/sub channel on which resets under ``key_prefix`` are announced."""
    return key_prefix.encode() + b":denial-cache"


def reset_announcement(key_prefix: str) -> tuple[str, bytes, bytes]:
    """The command that tells every limiter under ``key_prefix`` of a reset (PUBLISH)."""
    return ("PUBLISH", channel_for(key_prefix), RESET_MESSAGE)


def announcement_failed(error: Exception) -> None:
    """A reset deleted its keys but could not announce it: said, not raised."""
    # A limiter that misses the message holds its entries no longer than the
    # denial cache's MAX_HOLD_S.
    logger.warning("moderato: reset done, but announcing it failed: %s", error)
