"""The HTTP integration needs Starlette: say which extra installs it, not just what is missing."""

from __future__ import annotations

import importlib.util

MISSING_STARLETTE = (
    "moderato's HTTP integration (RateLimitMiddleware, RateLimitHeadersMiddleware, "
    "ClientIdentity, limiter.limit() and limiter.dependency()) needs Starlette, which is "
    "not installed: pip install 'moderato[starlette]' (or 'moderato[fastapi]' for FastAPI)"
)


def require_starlette() -> None:
    """Raise ImportError naming the extra to install if Starlette cannot be imported."""
    try:
        found = importlib.util.find_spec("starlette") is not None
    except (ImportError, ValueError):  # a broken or stubbed-out entry in sys.modules
        found = False
    if not found:
        raise ImportError(MISSING_STARLETTE, name="starlette")


# Imported first by the package: the modules after it import Starlette at once.
require_starlette()
