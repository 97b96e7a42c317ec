"""The dashboard's JSON: the figures of every process it sees, merged, and the limits."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from .limits import DeclaredLimit, limit_rows
from .recorder import OUTCOME_COUNT, OUTCOMES, DecisionRecorder
from .sketches import percentile_s
from .snapshot import Merged, ProcessView, merge, process_snapshot, read_snapshot

if TYPE_CHECKING:
    from ..limiter import RateLimiter

WINDOW_S = 900
"""The chart's span: the last 15 minutes, one point per second."""
RATE_SPAN_S = 10
"""Decisions per second "now" are the average of this many closed seconds."""
TOP_SHOWN = 10


def local_views(
    recorder: DecisionRecorder, limiter: RateLimiter, secrets: list[str]
) -> list[ProcessView]:
    """This process alone, read through the same snapshot a published one would be."""
    view = read_snapshot(process_snapshot(recorder, limiter, time.time(), secrets))
    return [] if view is None else [view]


def local_series(recorder: DecisionRecorder, last_second: int) -> dict[int, list[int]]:
    series: dict[int, list[int]] = {}
    for second in range(last_second - WINDOW_S + 1, last_second + 1):
        counts = recorder.counts_at(second)
        if any(counts):
            series[second] = counts
    return series


def summary(
    *,
    now_s: float,
    fleet: bool,
    processes: list[ProcessView],
    series: dict[int, list[int]],
    limits: list[DeclaredLimit],
    secret: Optional[bytes],
    backend: dict[str, str],
    redis: list[dict[str, Any]],
    notice: str = "",
) -> dict[str, Any]:
    """Everything the page shows, as one JSON object (``notice``: what it could not read)."""
    merged = merge(processes, top_count=TOP_SHOWN)
    last_second = int(now_s)
    first_second = last_second - WINDOW_S + 1
    columns: list[list[int]] = [[0] * WINDOW_S for _ in OUTCOMES]
    totals = [0] * OUTCOME_COUNT
    for second, counts in series.items():
        if first_second <= second <= last_second:
            for outcome, count in enumerate(counts):
                columns[outcome][second - first_second] += count
                totals[outcome] += count
    recent = range(WINDOW_S - 1 - RATE_SPAN_S, WINDOW_S - 1)  # closed seconds only
    return {
        "generated_s": now_s,
        "notice": notice,
        "backend": backend,
        "processes": {
            "count": len(processes),
            "fleet": fleet,
            "list": [_process(view) for view in processes],
        },
        "outcomes": list(OUTCOMES),
        "series": {
            "first_second": first_second,
            "step_s": 1,
            "by_outcome": dict(zip(OUTCOMES, columns)),
        },
        "totals": dict(zip(OUTCOMES, totals)),
        "per_second": {
            name: sum(columns[index][i] for i in recent) / RATE_SPAN_S
            for index, name in enumerate(OUTCOMES)
        },
        "limits": [row.as_json() for row in limit_rows(limits, merged.limits, secret)],
        "top_identities": {
            "rows": [{"identity": shown, "denials": count} for shown, count in merged.top],
            "error_bound": merged.top_error_bound,
        },
        "health": _health(merged, processes, totals, redis),
    }


def _process(view: ProcessView) -> dict[str, Any]:
    meta = view.meta
    host = str(meta.get("id", "")).partition(":")[0]
    return {
        "id": meta.get("id"),
        "host": host,
        "pid": meta.get("pid"),
        "started_s": meta.get("started_s"),
        "updated_s": meta.get("updated_s"),
        "decisions": sum(view.totals),
        "breaker": view.breaker.get("state", "unknown"),
    }


def _health(
    merged: Merged, processes: list[ProcessView], totals: list[int], redis: list[dict[str, Any]]
) -> dict[str, Any]:
    p50, p99 = percentile_s(merged.latency, 0.50), percentile_s(merged.latency, 0.99)
    breakers = []
    for view in processes:
        nodes = view.breaker.get("nodes") or {}
        breakers.append(
            {
                "process": view.meta.get("id"),
                "state": view.breaker.get("state", "unknown"),
                "nodes": nodes,
            }
        )
    return {
        "latency_ms": {
            "p50": None if p50 is None else p50 * 1000,
            "p99": None if p99 is None else p99 * 1000,
            "count": sum(merged.latency.values()),
        },
        "breakers": breakers,
        "bypassed": totals[OUTCOMES.index("bypassed")],
        "errors_counted": totals[OUTCOMES.index("error")],
        "errors": [
            {"at_s": at, "kind": kind, "message": message, "count": count, "process": process}
            for at, kind, message, count, process in merged.errors
        ],
        "redis": redis,
    }
