"""The operator's dashboard: ``app.mount("/ratelimits", Dashboard(limiter, auth=...))``.

Live decisions by outcome, every declared limit, the most-limited
identities, the backend's health, the whole fleet's figures on Redis, and
one identity's usage with a reset (docs/dashboard.md). It needs Starlette
only (the ``dashboard`` extra, the same as ``starlette``).
"""

from __future__ import annotations

# First: without Starlette, an ImportError naming the extra to install.
from ..integrations import _starlette  # noqa: F401
from .app import Auth, Dashboard, record
from .recorder import OUTCOMES, DecisionRecorder

__all__ = ["OUTCOMES", "Auth", "Dashboard", "DecisionRecorder", "record"]
