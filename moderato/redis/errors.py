"""The client's own errors: it knows nothing of rate limits.

A backend built on the client translates them (moderato.backends.redis maps
an error reply from a script to RateLimitConfigError or BackendError, and
everything else to BackendError).
"""

from __future__ import annotations


class RedisClientError(Exception):
    """Base class of every error the client raises."""


class RedisConnectionError(RedisClientError):
    """No reply: the server could not be reached, did not answer in time, the
    connection was lost, or what it sent could not be read."""


class RedisReplyError(RedisClientError):
    """Redis answered with an error reply; ``message`` is Redis's own text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class RedisBatchRefusedError(RedisReplyError):
    """A cluster node refused a check's batched call whole, before running any of it
    (``reply``: what it said, ``MOVED`` or ``ASK`` say; grouping.py lists which replies
    mean that): the check was not decided. The cluster client sends it again alone, so
    this never reaches its caller."""

    def __init__(self, reply: RedisReplyError) -> None:
        super().__init__(reply.message)
        self.reply = reply


class RedisClusterDownError(RedisReplyError):
    """Every attempt until the command timeout was answered ``CLUSTERDOWN``.

    The cluster as a whole refuses to serve (a slot without a primary while
    ``cluster-require-full-coverage`` is yes, or a node cut off from the
    majority): a state of the cluster, not a failure of the node that
    answered, which is reachable and replying.
    """
