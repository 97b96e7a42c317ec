"""One process's figures as the dashboard publishes and reads them, and their merge.

A snapshot is a few JSON fields (the fields of the process's hash in Redis):
who the process is, its decisions by outcome per limit, its most-denied
identities (already shown as the dashboard shows them), its check latency
histogram, its circuit breakers and its last errors. The per-second series is
published apart (fleet.py), added into hashes every process shares.

Nothing in a snapshot is secret: identities are in their shown form
(identities.py) and error messages have their credentials removed (redact).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

from .identities import shown_identity
from .recorder import OUTCOME_COUNT, DecisionRecorder, LimitKey
from .sketches import merge_hitters

if TYPE_CHECKING:
    from ..limiter import RateLimiter
    from ..sync.limiter import RateLimiter as BlockingRateLimiter

    AnyLimiter = Union[RateLimiter, BlockingRateLimiter]
    """The asyncio or the blocking limiter: a recorder and its publisher serve either."""

SNAPSHOT_VERSION = 1
MAX_PUBLISHED_HITTERS = 32
MAX_MESSAGE_CHARS = 300

# user:password@ or :password@ after a scheme, and password=... in a query string.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_QUERY_PASSWORD = re.compile(r"(?i)(password=)[^&\s]*")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without URL credentials and without any of ``secrets``."""
    text = _URL_CREDENTIALS.sub(r"\g<scheme>", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text[:MAX_MESSAGE_CHARS]


def backend_secrets(limiter: AnyLimiter) -> list[str]:
    """The passwords of the limiter's backend address, to keep out of anything served."""
    client = getattr(limiter.backend, "client", None)
    address = getattr(client, "address", None)
    found = []
    for name in ("password", "sentinel_password"):
        value = getattr(address, name, None)
        if isinstance(value, str) and value:
            found.append(value)
    if isinstance(limiter.redis_url, str):
        match = re.match(r"[^:]+://[^:@/]*:([^@/]+)@", limiter.redis_url)
        if match:
            found.append(match.group(1))
    return found


def process_snapshot(
    recorder: DecisionRecorder, limiter: AnyLimiter, updated_s: float, secrets: Iterable[str]
) -> dict[str, str]:
    """This process's figures, as the fields of its hash (JSON text each)."""
    secret = limiter._keyspace.identity_secret
    denied: dict[str, int] = {}
    for identity, count in recorder.top_denied().items():
        shown = shown_identity(identity, secret)
        denied[shown] = denied.get(shown, 0) + count
    top = sorted(denied.items(), key=lambda pair: (-pair[1], pair[0]))[:MAX_PUBLISHED_HITTERS]
    breakers = limiter._breakers
    secrets = list(secrets)
    meta = {
        "version": SNAPSHOT_VERSION,
        "id": recorder.process_id,
        "pid": recorder.pid,
        "started_s": recorder.started_s,
        "updated_s": updated_s,
    }
    return {
        "meta": _dump(meta),
        "totals": _dump(recorder.all_totals()),
        "limits": _dump([[*name, counts] for name, counts in recorder.limit_rows()]),
        "top": _dump({"items": top, "error_bound": recorder.denial_error_bound()}),
        "latency": _dump(recorder.latency_buckets()),
        "breaker": _dump({"state": breakers.worst_state(), "nodes": breakers.nodes()}),
        "errors": _dump(
            [
                [at, kind, redact(message, secrets), count]
                for at, kind, message, count in recorder.last_errors()
            ]
        ),
    }


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass
class ProcessView:
    """One process's snapshot, read back."""

    meta: dict[str, Any]
    totals: list[int]
    limits: list[tuple[LimitKey, list[int]]]
    top: list[tuple[str, int]]
    top_error_bound: int
    latency: dict[int, int]
    breaker: dict[str, Any]
    errors: list[list[Any]]


def read_snapshot(fields: Mapping[str, str]) -> Optional[ProcessView]:
    """A snapshot from its fields; None when it is not one this version reads."""
    try:
        meta = json.loads(fields["meta"])
        if meta.get("version") != SNAPSHOT_VERSION:
            return None
        top = json.loads(fields["top"])
        return ProcessView(
            meta=meta,
            totals=_counts(json.loads(fields["totals"])),
            limits=[
                ((str(rate), str(algorithm), str(scope), _burst(burst)), _counts(counts))
                for rate, algorithm, scope, burst, counts in json.loads(fields["limits"])
            ],
            top=[(str(item), int(count)) for item, count in top["items"]],
            top_error_bound=int(top["error_bound"]),
            latency={
                int(index): int(count) for index, count in json.loads(fields["latency"]).items()
            },
            breaker=dict(json.loads(fields["breaker"])),
            errors=list(json.loads(fields["errors"])),
        )
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def _burst(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _counts(values: Any) -> list[int]:
    counts = [int(value) for value in values]
    if len(counts) != OUTCOME_COUNT:
        raise ValueError(f"expected {OUTCOME_COUNT} counts, got {len(counts)}")
    return counts


@dataclass
class Merged:
    """Every process's figures added up."""

    processes: list[ProcessView] = field(default_factory=list)
    limits: dict[LimitKey, list[int]] = field(default_factory=dict)
    top: list[tuple[str, int]] = field(default_factory=list)
    top_error_bound: int = 0
    latency: dict[int, int] = field(default_factory=dict)
    errors: list[list[Any]] = field(default_factory=list)


def merge(views: Iterable[ProcessView], top_count: int = 10, max_errors: int = 10) -> Merged:
    merged = Merged()
    tops = []
    for view in views:
        merged.processes.append(view)
        for name, counts in view.limits:
            into = merged.limits.setdefault(name, [0] * OUTCOME_COUNT)
            for outcome, count in enumerate(counts):
                into[outcome] += count
        tops.append(dict(view.top))
        merged.top_error_bound += view.top_error_bound
        for index, count in view.latency.items():
            merged.latency[index] = merged.latency.get(index, 0) + count
        merged.errors.extend([*error, view.meta.get("id", "")] for error in view.errors)
    merged.top = merge_hitters(tops, top_count)
    merged.errors.sort(key=lambda error: -float(error[0]))
    del merged.errors[max_errors:]
    return merged
