"""The URL-scheme registry: which backend a ``redis_url`` selects.

The one list of accepted schemes: the limiter builds its backend from it and
an unknown scheme's error lists it, so a scheme added here is accepted and
named in that message at once.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..errors import RateLimitConfigError
from ..redis.url import CLUSTER_SCHEMES, SENTINEL_SCHEMES, mask_url
from .base import Backend, BlockingBackend

BackendFactory = Callable[..., Any]
"""``factory(url, **options)``: a backend (Backend or BlockingBackend) for one URL of its
scheme."""


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


def _blocking(kind: str) -> BackendFactory:
    """The blocking client ``kind`` (RedisClient, ClusterClient, SentinelClient) of a URL."""

    def factory(url: str, **options: Any) -> Any:
        from ..redis import blocking
        from .blocking_redis import BlockingRedisBackend

        return BlockingRedisBackend(getattr(blocking, kind).from_url(url, **options))

    return factory


# The blocking RateLimiter's: the same schemes, blocking clients (memory:// is the same store).
BLOCKING_SCHEMES: dict[str, BackendFactory] = {
    "memory": _memory,
    "redis": _blocking("RedisClient"),
    "rediss": _blocking("RedisClient"),
    "unix": _blocking("RedisClient"),
    **{scheme: _blocking("ClusterClient") for scheme in CLUSTER_SCHEMES},
    **{scheme: _blocking("SentinelClient") for scheme in SENTINEL_SCHEMES},
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
    backend: Optional[Backend] = _over_redis_py(url, blocking=False)
    if backend is None:
        backend = _from_url(url, SCHEMES, "a redis.asyncio.Redis / RedisCluster", options)
    return backend


def make_blocking_backend(url: object, **options: Any) -> BlockingBackend:
    """``make_backend()`` for the blocking RateLimiter: the same URLs, or an application's
    own blocking ``redis.Redis`` or ``redis.cluster.RedisCluster`` client."""
    backend: Optional[BlockingBackend] = _over_redis_py(url, blocking=True)
    if backend is None:
        backend = _from_url(url, BLOCKING_SCHEMES, "a redis.Redis / RedisCluster", options)
    return backend


_OTHER_KIND = (
    "redis_url is a blocking redis-py client ({}); the asyncio RateLimiter takes a "
    "redis.asyncio.Redis / RedisCluster client, and moderato.sync.RateLimiter takes this one",
    "redis_url is an asyncio redis-py client ({}); the blocking RateLimiter takes a "
    "redis.Redis / RedisCluster client, and moderato.RateLimiter takes this one",
)
"""The refusal of the other limiter's kind of redis-py client: given to the asyncio
limiter, then to the blocking one."""


def _over_redis_py(url: object, *, blocking: bool) -> Any:
    """The backend over an application's own redis-py client of the limiter's kind; None
    when ``url`` is no redis-py client; RateLimitConfigError for the other kind."""
    from .redis_py import is_redis_py_client
    from .redis_py_blocking import is_blocking_redis_py_client

    asyncio_client, blocking_client = is_redis_py_client(url), is_blocking_redis_py_client(url)
    if blocking and blocking_client:
        from .blocking_redis import BlockingRedisBackend
        from .redis_py_blocking import BlockingRedisPyClient

        return BlockingRedisBackend(BlockingRedisPyClient(url))
    if asyncio_client and not blocking:
        from .redis import RedisBackend
        from .redis_py import RedisPyClient

        return RedisBackend(RedisPyClient(url))
    if asyncio_client or blocking_client:
        raise RateLimitConfigError(_OTHER_KIND[blocking].format(type(url).__name__))
    return None


def _from_url(url: object, schemes: dict[str, BackendFactory], own: str, options: Any) -> Any:
    if not isinstance(url, str):
        raise RateLimitConfigError(
            f"redis_url must be a URL string or {own} client, "
            f"got {type(url).__name__}; URL schemes: {accepted_schemes()}"
        )
    scheme, sep, _ = url.partition("://")
    factory = schemes.get(scheme.lower()) if sep else None
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
