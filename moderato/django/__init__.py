"""moderato for Django: ``limit()`` on views, ``RateLimitMiddleware``, REST framework throttles.

``pip install 'moderato[django]'``; configuration in ``settings.MODERATO``
(conf.py), checked at start-up when ``"moderato.django"`` is in
``INSTALLED_APPS``. Sync views (and every view under WSGI) are decided by the
blocking ``moderato.sync.RateLimiter``, async views under ASGI by the asyncio
``moderato.RateLimiter``; both share every quota. The REST framework
throttles are in ``moderato.django.throttling``. docs/django.md is the guide.
"""

from __future__ import annotations

# First: without Django, an ImportError naming the extra to install.
from . import _django  # noqa: F401
from .decorator import limit
from .errors import ModeratoImproperlyConfigured
from .identity import client_ip
from .limiters import aclose, close, get_async_limiter, get_limiter, get_settings
from .middleware import RateLimitMiddleware
from .rule import ALL, UNSAFE

__all__ = [
    "ALL",
    "UNSAFE",
    "ModeratoImproperlyConfigured",
    "RateLimitMiddleware",
    "aclose",
    "client_ip",
    "close",
    "get_async_limiter",
    "get_limiter",
    "get_settings",
    "limit",
]
