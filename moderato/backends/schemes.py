"""The URL-scheme registry: which backend a ``redis_url`` selects.

The one list of accepted schemes: the limiter builds its backend from it and
an unknown scheme's error lists it, so a scheme added here is accepted and
named in that message at once.
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import RateLimitConfigError
from ..redis.url import CLUSTER_SCHEMES, SENTINEL_SCHEMES, mask_url
from .base import Backend

BackendFactory = Callable[..., Backend]
"""``factory(url, **options)``: a backend for one URL of its scheme."""


def _memory(url: str, **options: Any) -> Backend:
    from .memory import MemoryBackend

    return MemoryBackend.from_url(url)  # in process: no connection options apply


def _redis(url: str, **options: Any) -> Backend:
    from ..redis import RedisClient
    from .redis import RedisBackend

    return RedisBackend(RedisClient.from_url(url, **options))


def _cluster(url: str, **options: Any) -> Backend:
    from ..redis import ClusterClient
    from .redis import RedisBackend

    return RedisBackend(ClusterClient.from_url(url, **options))


def _sentinel(url: str, **options: Any) -> Backend:
    from ..redis import SentinelClient
    from .redis import RedisBackend

    # The primary the sentinels name, followed across failovers.
    return RedisBackend(SentinelClient.from_url(url, **options))


SCHEMES: dict[str, BackendFactory] = {
    "memory": _memory,
    "redis": _redis,
    "rediss": _redis,
    "unix": _redis,
    **{scheme: _cluster for scheme in CLUSTER_SCHEMES},
    **{scheme: _sentinel for scheme in SENTINEL_SCHEMES},
}


def accepted_schemes() -> str:
    """Every accepted scheme, for error messages: ``memory://, redis://, ...``."""
    return ", ".join(f"{scheme}://" for scheme in SCHEMES)


def make_backend(url: object, **options: Any) -> Backend:
    """The backend ``url`` selects; any problem is a RateLimitConfigError naming it.

    Instead of a URL, ``url`` may be an application's own ``redis.asyncio``
    Redis or RedisCluster client: its own settings rule, and ``options``
    (moderato's timeouts, TLS, client name) are not used.
    """
    from .redis_py import is_redis_py_client

    if is_redis_py_client(url):
        from .redis import RedisBackend
        from .redis_py import RedisPyClient

        return RedisBackend(RedisPyClient(url))
    if not isinstance(url, str):
        raise RateLimitConfigError(
            "redis_url must be a URL string or a redis.asyncio.Redis / RedisCluster client, "
            f"got {type(url).__name__}; URL schemes: {accepted_schemes()}"
        )
    scheme, sep, _ = url.partition("://")
    factory = SCHEMES.get(scheme.lower()) if sep else None
    if factory is None:
        shown = f"{scheme}://" if sep and scheme else "(none)"
        raise RateLimitConfigError(
            f"unsupported scheme {shown} in redis_url {mask_url(url)!r}; "
            f"expected one of {accepted_schemes()}"
        )
    try:
        return factory(url, **options)
    except (TypeError, ValueError) as error:  # a bad URL, or an option of the wrong type
        if isinstance(error, RateLimitConfigError):
            raise
        raise RateLimitConfigError(str(error)) from None
