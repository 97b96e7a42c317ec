"""The HTTP integration needs Starlette: say which extra installs it, not just what is missing."""

from __future__ import annotations

from ..extras import require

MISSING_STARLETTE = (
    "moderato's HTTP integration (RateLimitMiddleware, RateLimitHeadersMiddleware, "
    "ClientIdentity, limiter.limit() and limiter.dependency()) needs Starlette, which is "
    "not installed: pip install 'moderato[starlette]' (or 'moderato[fastapi]' for FastAPI)"
)

# Imported first by the package: the modules after it import Starlette at once.
require("starlette", MISSING_STARLETTE)
