"""moderato_decorator.py with the operator's dashboard mounted: benchmarks/dashboard_overhead.py
compares the two (not one of performance.py's contenders)."""

from __future__ import annotations

from benchmarks.apps.moderato_decorator import app, limiter
from moderato.dashboard import Dashboard

app.mount("/ratelimits", Dashboard(limiter, allow_anonymous=True))

__all__ = ["app", "limiter"]
