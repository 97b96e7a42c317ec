"""Rate-limit response headers, from the decisions taken for a request.

Two vocabularies:

- ``legacy``: ``X-RateLimit-Limit``, ``X-RateLimit-Remaining``,
  ``X-RateLimit-Reset`` (a Unix timestamp in whole seconds, rounded up, from
  the backend's decision);
- ``ietf``: the HTTP API working group draft's structured fields
  ``RateLimit-Policy: "100-per-60s";q=100;w=60`` and
  ``RateLimit: "100-per-60s";r=42;t=17`` (``t``: seconds until reset, rounded up).

A policy with a burst (a bucket holding more, or fewer, requests than the
limit it refills per window) states its capacity and its refill: the limit
(``X-RateLimit-Limit``, ``q``) is the burst, the most a client can spend at
once and what ``X-RateLimit-Remaining`` counts down from; ``w`` is the time a
full refill takes, in whole seconds rounded up (``q / w`` never overstates
the refill); the name says both: ``"10-per-1s-burst-50";q=50;w=5``.

A request may be decided by several policies (``"10/second;1000/day"``,
stacked decorators, an app-wide middleware). The quota headers describe the
most restrictive one: on a denial the policy that denied, otherwise the one
with the fewest requests left. ``RateLimit-Policy`` lists every policy.

``Retry-After`` (whole seconds, rounded up) accompanies every temporary
denial whatever the style; a permanent denial (cost above capacity) has
neither ``Retry-After`` nor a reset. Quota headers are left out entirely when
any decision was a fail-open bypass: the quota is then unknown, and unknown
must not read as zero or as a fresh quota.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Optional

from ..errors import RateLimitConfigError, RateLimitExceeded
from ..results import CheckResult

HeaderStyle = Optional[Literal["legacy", "ietf", "both"]]
HeaderList = list[tuple[bytes, bytes]]

_STYLES = ("legacy", "ietf", "both", None)


def validate_style(style: object) -> HeaderStyle:
    if style not in _STYLES:
        raise RateLimitConfigError(
            f"headers must be 'legacy', 'ietf', 'both' or None, got {style!r:.80}"
        )
    return style  # type: ignore[return-value]


@dataclass(frozen=True)
class Quota:
    """One policy's state as the headers report it."""

    limit: int
    """The most the policy admits at once: its limit, or its burst."""
    window_seconds: int
    remaining: Optional[int]
    reset_at: Optional[float]
    refill: Optional[int] = None
    """With a burst: the requests refilled per window; None: the limit."""

    @property
    def name(self) -> str:
        if self.refill is None:
            return f"{self.limit}-per-{self.window_seconds}s"
        return f"{self.refill}-per-{self.window_seconds}s-burst-{self.limit}"

    @property
    def refill_seconds(self) -> int:
        """The IETF ``w``: the window, or with a burst the whole seconds a full refill
        takes (rounded up)."""
        if self.refill is None:
            return self.window_seconds
        return -(-self.limit * self.window_seconds // self.refill)


@dataclass(frozen=True)
class Report:
    """What the headers of one response describe."""

    chosen: Quota
    policies: tuple[Quota, ...]
    retry_after_s: Optional[int]
    """Seconds to wait (temporary denial); None on admission or permanent denial."""
    quota_known: bool


def _top(result: CheckResult) -> Quota:
    return Quota(
        result.limit, result.window_seconds, result.remaining, result.reset_at, result.refill
    )


def _policies(result: CheckResult) -> list[Quota]:
    if not result.policies:
        return [_top(result)]
    return [
        Quota(state.limit, state.window_seconds, state.remaining, state.reset_at, state.refill)
        for state in result.policies
    ]


def report(
    decisions: Sequence[CheckResult], denial: Optional[RateLimitExceeded] = None
) -> Optional[Report]:
    """The report for a response, or None when nothing was decided for it.

    ``denial`` is the exception being turned into a response; without one, the
    last denied decision (a response built by the application's own handler)
    or else the most restrictive admitted policy is reported.
    """
    policies: list[Quota] = []
    for decision in decisions:
        policies.extend(p for p in _policies(decision) if p not in policies)
    quota_known = not any(d.bypassed or d.remaining is None for d in decisions)
    retry_after_s: Optional[int]
    if denial is not None:
        chosen = Quota(
            denial.limit,
            denial.window_seconds,
            denial.remaining,
            denial.reset_at,
            denial.refill,
        )
        retry_after_s = denial.retry_after
        if chosen not in policies:
            policies.append(chosen)
    else:
        denied = [d for d in decisions if not d.allowed]
        if denied:
            chosen, retry_after_s = _top(denied[-1]), denied[-1].retry_after
        elif policies:
            known = [p for p in policies if p.remaining is not None]
            chosen = min(known, key=_remaining) if known else policies[0]
            retry_after_s = None
        else:
            return None
    return Report(chosen, tuple(policies), retry_after_s, quota_known)


def legacy_for_one(result: CheckResult) -> Optional[HeaderList]:
    """``render(report([result]), "legacy", now)`` for one admitted decision, without the Report.

    The common response (one decorator, dependency or middleware admitted it)
    skips the intermediate Quota and Report objects; None outside that case,
    for ``report`` and ``render`` to handle. tests/unit/test_headers_fast_path.py
    holds the two to the same output.
    """
    if not result.allowed or result.bypassed or result.remaining is None:
        return None
    limit, remaining, reset_at = result.limit, result.remaining, result.reset_at
    for state in result.policies:  # the first policy with the fewest left, as report() picks
        if state.remaining is None:
            return None
        if state is result.policies[0] or state.remaining < remaining:
            limit, remaining, reset_at = state.limit, state.remaining, state.reset_at
    headers = [(b"x-ratelimit-limit", b"%d" % limit), (b"x-ratelimit-remaining", b"%d" % remaining)]
    if reset_at is not None:
        headers.append((b"x-ratelimit-reset", b"%d" % math.ceil(reset_at)))
    return headers


def legacy_for_denial(decisions: Sequence[CheckResult], denial: RateLimitExceeded) -> HeaderList:
    """``render(report(decisions, denial), "legacy", now)``, without the Report.

    The legacy headers of a denial describe the denying policy alone, so the
    other policies need not be gathered. tests/unit/test_headers_fast_path.py holds
    the two to the same output.
    """
    # str(), as render() does: an application may raise its own RateLimitExceeded.
    headers: HeaderList = []
    if not any(d.bypassed or d.remaining is None for d in decisions):
        headers.append((b"x-ratelimit-limit", str(denial.limit).encode()))
        if denial.remaining is not None:
            headers.append((b"x-ratelimit-remaining", str(denial.remaining).encode()))
        if denial.reset_at is not None:
            headers.append((b"x-ratelimit-reset", str(math.ceil(denial.reset_at)).encode()))
    if denial.retry_after is not None:
        headers.append((b"retry-after", str(denial.retry_after).encode()))
    return headers


def _remaining(quota: Quota) -> int:
    return quota.remaining if quota.remaining is not None else 0


def render(report: Report, style: HeaderStyle, now_s: float) -> HeaderList:
    """Header pairs for a report; ``now_s`` turns the reset timestamp into the IETF ``t``."""
    headers: HeaderList = []
    if report.quota_known and style in ("legacy", "both"):
        headers.extend(_legacy(report.chosen))
    if report.quota_known and style in ("ietf", "both"):
        headers.extend(_ietf(report, now_s))
    if report.retry_after_s is not None:
        headers.append((b"retry-after", str(report.retry_after_s).encode()))
    return headers


def _legacy(chosen: Quota) -> HeaderList:
    headers = [(b"x-ratelimit-limit", str(chosen.limit).encode())]
    if chosen.remaining is not None:
        headers.append((b"x-ratelimit-remaining", str(chosen.remaining).encode()))
    if chosen.reset_at is not None:
        headers.append((b"x-ratelimit-reset", str(math.ceil(chosen.reset_at)).encode()))
    return headers


def _ietf(report: Report, now_s: float) -> HeaderList:
    policy = ", ".join(
        f'"{quota.name}";q={quota.limit};w={quota.refill_seconds}'
        for quota in _unique_names(report.policies)
    )
    chosen = report.chosen
    state = f'"{chosen.name}";r={_remaining(chosen)}'
    if chosen.reset_at is not None:
        state += f";t={max(0, math.ceil(chosen.reset_at - now_s))}"
    return [(b"ratelimit-policy", policy.encode()), (b"ratelimit", state.encode())]


def _unique_names(policies: Sequence[Quota]) -> list[Quota]:
    # Two rules with the same limit and window advertise one policy.
    seen: set[str] = set()
    unique: list[Quota] = []
    for quota in policies:
        if quota.name not in seen:
            seen.add(quota.name)
            unique.append(quota)
    return unique
