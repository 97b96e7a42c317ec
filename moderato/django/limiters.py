"""One limiter per process, of each kind, made when first needed and closed cleanly.

Views running in a thread (every sync view; every view under WSGI) check
with the blocking ``moderato.sync.RateLimiter``; async views under ASGI with
the asyncio ``moderato.RateLimiter``. Both are built from ``MODERATO``, with
the same URL and key prefix, so they share every quota: the same keys, the
same Lua scripts, one decision per check in Redis.

Neither connects before its first check (Redis may be down at start-up).
Each is made once per process: a worker forked by gunicorn makes its own
connections on first use (the clients are fork-aware). ``close()`` closes
both (registered with ``atexit`` for the blocking one); a changed
``MODERATO`` (``override_settings`` in tests) closes them and the next
check builds them from the new settings.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any, Optional

from django.core.signals import setting_changed

from ..errors import RateLimitConfigError
from ..limiter import RateLimiter
from ..sync import RateLimiter as BlockingRateLimiter
from .conf import SETTING, Settings, read_settings
from .errors import ModeratoImproperlyConfigured

__all__ = ["aclose", "close", "get_async_limiter", "get_limiter", "get_settings"]


class _Process:
    """The process's settings and limiters (replaced together when MODERATO changes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settings: Optional[Settings] = None
        self.blocking: Optional[BlockingRateLimiter] = None
        self.asyncio: Optional[RateLimiter] = None


_process = _Process()


def get_settings() -> Settings:
    """``MODERATO``, checked once (ImproperlyConfigured naming the first bad key)."""
    settings = _process.settings
    if settings is None:
        with _process.lock:
            if _process.settings is None:
                _process.settings = read_settings()
            settings = _process.settings
    return settings


def get_limiter() -> BlockingRateLimiter:
    """The process's blocking limiter (sync views, WSGI, DRF throttles, manual checks)."""
    limiter = _process.blocking
    return limiter if limiter is not None else _made("blocking", BlockingRateLimiter)


def get_async_limiter() -> RateLimiter:
    """The process's asyncio limiter (async views under ASGI, manual checks with await).

    On ``memory://`` it has a store of its own: the decorators, the middleware
    and the throttles then decide every view with ``get_limiter()``'s store.
    """
    limiter = _process.asyncio
    return limiter if limiter is not None else _made("asyncio", RateLimiter)


def _made(slot: str, kind: Any) -> Any:
    """The limiter in ``_process.<slot>``, built from the settings by the first thread
    that needs it."""
    settings = get_settings()  # before the lock, which get_settings() takes
    with _process.lock:
        if getattr(_process, slot) is None:
            try:
                limiter = kind(**settings.limiter_options(blocking=slot == "blocking"))
            except RateLimitConfigError as error:  # what no single key's check could see
                raise ModeratoImproperlyConfigured(f"{SETTING}: {error}") from None
            setattr(_process, slot, limiter)
        return getattr(_process, slot)


def close() -> None:
    """Close both limiters' connections and forget them (the next check makes new ones).

    From a thread with no running event loop (a shutdown hook, a management
    command, a test); in async code, ``await aclose()``.
    """
    blocking, asynchronous = _forget()
    if blocking is not None:
        blocking.close()
    if asynchronous is not None:
        # Its connections belong to the loops that made them: close() releases them
        # there (or drops those of loops already closed), from a loop of its own.
        asyncio.run(asynchronous.close())


async def aclose() -> None:
    """``close()`` from async code."""
    blocking, asynchronous = _forget()
    if blocking is not None:
        blocking.close()
    if asynchronous is not None:
        await asynchronous.close()


def _forget() -> tuple[Optional[BlockingRateLimiter], Optional[RateLimiter]]:
    with _process.lock:
        blocking, asynchronous = _process.blocking, _process.asyncio
        _process.settings = _process.blocking = _process.asyncio = None
    return blocking, asynchronous


def _settings_changed(*, setting: str, **_: Any) -> None:
    if setting != SETTING:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        close()
        return
    # A settings override inside async code: the blocking limiter closes now, the
    # asyncio one is dropped (its pools close with their loops).
    blocking, _asynchronous = _forget()
    if blocking is not None:
        blocking.close()


def _close_at_exit() -> None:
    blocking, _asynchronous = _forget()
    if blocking is not None:
        blocking.close()


setting_changed.connect(_settings_changed, dispatch_uid="moderato.django.settings_changed")
atexit.register(_close_at_exit)
