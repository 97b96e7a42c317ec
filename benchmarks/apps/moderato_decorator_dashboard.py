"""moderato_decorator.py with the operator's dashboard mounted: benchmarks/dashboard_overhead.py
compares the two (not one of performance.py's contenders)."""

from __future__ import annotations

import os

from benchmarks.apps.moderato_decorator import app, limiter
from moderato.dashboard import Dashboard

dashboard = Dashboard(limiter, allow_anonymous=True)
app.mount("/ratelimits", dashboard)
if os.environ.get("MODERATO_BENCH_DASHBOARD_PUBLISHER") == "off":
    # The check path's cost alone (dashboard_overhead.py, under callgrind): no publications.
    dashboard.recorder.on_second = None

__all__ = ["app", "limiter"]
