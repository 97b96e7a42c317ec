"""Prometheus collectors (the ``moderato[metrics]`` extra).

Labels are drawn from small fixed sets (algorithm names, results, operation
names): never keys, identities, scopes or tenants, whose values are unbounded.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

from .errors import RateLimitConfigError

RESULTS = ("allowed", "denied", "bypassed", "shadow_denied", "error")
BREAKER_STATES = {"closed": 0, "open": 1, "half_open": 2}

# Keyed by the registry object itself (weakly): an id() could be reused by a
# new registry after the old one is collected, handing it stale collectors.
_registered: weakref.WeakKeyDictionary[Any, dict[str, Metrics]] = weakref.WeakKeyDictionary()
_registered_lock = threading.Lock()


# Why a limiter wants metrics, as its error names it when prometheus_client is missing.
WANTED_BY_OPTION = "enable_metrics=True"
WANTED_BY_FAIL_OPEN = "fail_open=True (a bypass must always be counted, so it turns metrics on)"


def _prometheus(wanted_by: str = WANTED_BY_OPTION) -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise RateLimitConfigError(
            f"{wanted_by} needs the prometheus_client package, which is not installed: "
            "pip install 'moderato[metrics]'"
        ) from None
    return prometheus_client


class Metrics:
    """The collectors of one namespace in one registry."""

    def __init__(self, namespace: str, registry: Any) -> None:
        prometheus = _prometheus()
        options = {"namespace": namespace, "registry": registry}

        def counter(name: str, documentation: str, *labels: str) -> Any:
            return prometheus.Counter(name, documentation, labels, **options)

        self.checks = counter("checks", "Rate limit checks by outcome", "algorithm", "result")
        self.check_duration = prometheus.Histogram(
            "check_duration_seconds",
            "Time to decide one check, backend round trip included",
            ["algorithm"],
            buckets=(
                0.0001,
                0.00025,
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1.0,
            ),
            **options,
        )
        self.limit_exceeded = counter(
            "limit_exceeded", "Checks denied because a limit was exceeded", "algorithm"
        )
        # Also counted in checks{result="denied"} and limit_exceeded: this only
        # says which of those the denial cache answered without Redis.
        self.local_denials = counter(
            "local_denials",
            "Denied checks answered by the denial cache, without a backend call",
            "algorithm",
        )
        self.backend_operations = counter(
            "backend_operations", "Backend calls by operation and status", "operation", "status"
        )
        self.fail_open = counter(
            "fail_open", "Checks let through because the backend could not decide", "algorithm"
        )
        self.breaker_state = prometheus.Gauge(
            "circuit_breaker_state",
            "Backend circuit breaker: 0 closed, 1 open, 2 half-open",
            **options,
        )

    def set_breaker_state(self, state: str) -> None:
        self.breaker_state.set(BREAKER_STATES[state])


def metrics_for(
    namespace: str = "moderato",
    registry: Optional[Any] = None,
    *,
    wanted_by: str = WANTED_BY_OPTION,
) -> Metrics:
    """The shared collectors of ``namespace`` in ``registry`` (the default one if None).

    Several limiters in one process share them: Prometheus refuses to
    register one metric name twice in a registry. ``wanted_by`` names the
    setting that asked for metrics, for the error when the extra is missing.
    """
    prometheus = _prometheus(wanted_by)
    target = prometheus.REGISTRY if registry is None else registry
    with _registered_lock:
        by_namespace = _registered.setdefault(target, {})
        metrics = by_namespace.get(namespace)
        if metrics is None:
            metrics = by_namespace[namespace] = Metrics(namespace, target)
        return metrics
