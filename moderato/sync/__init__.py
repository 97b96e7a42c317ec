"""moderato for synchronous code: ``moderato.sync.RateLimiter``, which blocks instead of awaiting.

The same constructor, methods, results (``moderato.CheckResult``) and
exceptions as ``moderato.RateLimiter``; on the same URL and ``key_prefix``
the two share every quota. docs/sync.md shows it in Flask, Celery and a
plain script.
"""

from __future__ import annotations

from .decorator import ALL_CALLS
from .limiter import RateLimiter

__all__ = ["ALL_CALLS", "RateLimiter"]
