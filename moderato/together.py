"""Several limits decided as one: a request is admitted only if every limit admits it,
and then every limit is charged; when one refuses, none is.

Both RateLimiters (asyncio and blocking) decide a list of ``Check``s with
``_check_together``; this module holds the pure steps around the backend call,
limiter_core.py the steps that need the limiter (plans, keys, shadow mode, the
failure policy, metrics). Checks of one algorithm
and one cost share a script call, their policies side by side (the scripts
already decide up to 16 policies atomically, docs/internals.md); checks that
differ in algorithm or cost become parts of one composite call
(lua/together.lua), which peeks every part before it charges any. Each check
keeps its own keys, so its counters are its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Optional

from . import _accel
from .algorithms import Algorithm, ScriptArg
from .backends.replies import ALLOWED, POLICY_FIELDS, RETRY, DecisionReply, decoded, policy_at
from .errors import RateLimitConfigError
from .keys import Identity
from .plans import Plan
from .results import CheckResult

MAX_POLICIES_PER_CALL = 16
"""A script decides at most this many policies (prelude.lua's MAX_POLICIES)."""


class Check(NamedTuple):
    """One limit of a request, with ``check_with_info``'s arguments."""

    key: Identity
    rate: str
    scope: str
    cost: int = 1
    tenant_type: Optional[str] = None
    algorithm: Optional[str] = None
    shadow: Optional[bool] = None
    burst: Optional[int] = None


class Together(NamedTuple):
    """The decision on several checks: one result per check, in their order (None for
    a check in shadow mode when the others refused: it was not decided)."""

    allowed: bool
    results: tuple[Optional[CheckResult], ...]
    deciding: int
    """The check that speaks for the request: on a denial the one that refused with
    the longest wait (a permanent refusal counts as the longest); on an admission the
    one with the fewest requests left. Ties go to the first."""


class TogetherCall(NamedTuple):
    """One atomic backend call of ``_check_together``: some of its checks, worked out."""

    plans: list[Plan]
    keys: list[list[bytes]]
    costs: list[int]
    shadow: bool
    """These checks are in shadow mode: a refusal is counted as shadow_denied."""


class Member(NamedTuple):
    """A check's place in a script call: its index, first policy and policy count."""

    check: int
    first_policy: int
    policy_count: int


class CallPart(NamedTuple):
    """One script call's worth of checks (one algorithm, one cost, with bursts or without)."""

    algorithm: Algorithm
    cost_scaled: int
    keys: list[bytes]
    arguments: list[ScriptArg]
    members: list[Member]


def call_parts(
    plans: Sequence[Plan], keys: Sequence[list[bytes]], costs_scaled: Sequence[int]
) -> list[CallPart]:
    """The checks grouped into script calls: same algorithm and cost side by side, in the
    order first seen, at most MAX_POLICIES_PER_CALL policies per call. Checks with a burst
    and checks without one go to different calls (a burst adds a field per policy)."""
    parts: list[CallPart] = []
    open_parts: dict[tuple[str, int, bool], CallPart] = {}
    for index, (plan, check_keys, cost_scaled) in enumerate(zip(plans, keys, costs_scaled)):
        group = (plan.algorithm.name, cost_scaled, plan.policy.burst is None)
        part = open_parts.get(group)
        if part is None or len(part.keys) + len(check_keys) > MAX_POLICIES_PER_CALL:
            part = CallPart(plan.algorithm, cost_scaled, [], [cost_scaled, 1], [])
            open_parts[group] = part
            parts.append(part)
        part.members.append(Member(index, len(part.keys), len(check_keys)))
        part.keys.extend(check_keys)
        part.arguments.extend(plan.script_args)
    return parts


def distinct_keys(checks: Sequence[Check], keys: Sequence[list[bytes]]) -> None:
    """Refuse two checks that would count in one key: each limit needs its own counter."""
    if len({key for check_keys in keys for key in check_keys}) == sum(map(len, keys)):
        return
    seen: dict[bytes, int] = {}
    for index, check_keys in enumerate(keys):
        for key in check_keys:
            other = seen.setdefault(key, index)
            if other != index:
                first, second = checks[other], checks[index]
                raise RateLimitConfigError(
                    f"limits '{first.rate}' and '{second.rate}' would count in one counter "
                    f"(scope {first.scope!r}, same identity, algorithm and window): give "
                    "one of them its own scope=, or write them as one rate string"
                )


def results_of(
    plans: Sequence[Plan], parts: Sequence[CallPart], replies: Sequence[DecisionReply]
) -> tuple[bool, list[CheckResult]]:
    """Whether the checks were admitted, and each check's own result.

    A check's result says what it alone would answer: admitted (with what is
    left after its charge) when the request was; otherwise refused when one of
    its policies refused, else admitted with what it has left, uncharged.
    """
    allowed = all(reply[ALLOWED] == 1 for reply in replies)
    results: list[Optional[CheckResult]] = [None] * len(plans)
    for part, reply in zip(parts, replies):
        # A part peeked while another refused reports what a charge would leave: add it back.
        uncharge = part.cost_scaled if not allowed and reply[ALLOWED] == 1 else 0
        for member in part.members:
            first = policy_at(member.first_policy)
            triples = list(reply[first : first + POLICY_FIELDS * member.policy_count])
            if uncharge:
                for at in range(0, len(triples), POLICY_FIELDS):
                    triples[at] += uncharge
            own_allowed = allowed or all(
                triples[at + RETRY] == 0 for at in range(0, len(triples), POLICY_FIELDS)
            )
            # A reply of this check's policies alone, in the decision reply's layout.
            own = [1 if own_allowed else 0, _deciding_policy(triples, own_allowed), *triples]
            results[member.check] = decoded(plans[member.check], own)
    return allowed, [result for result in results if result is not None]


def _deciding_policy(triples: Sequence[int], allowed: bool) -> int:
    """The scripts' rule: the fewest remaining on an admission, else the longest wait."""
    deciding, best = 0, None
    for index, at in enumerate(range(0, len(triples), POLICY_FIELDS)):
        remaining_scaled, retry_ms = triples[at], triples[at + RETRY]
        if allowed:
            if best is None or remaining_scaled < best:
                deciding, best = index, remaining_scaled
        elif best != -1 and (best is None or retry_ms == -1 or retry_ms > best):
            deciding, best = index, retry_ms
    return deciding


def deciding_check(allowed: bool, results: Sequence[CheckResult]) -> int:
    """The index of the check that speaks for the request (see ``Together.deciding``)."""
    deciding, best = 0, None
    for index, result in enumerate(results):
        if allowed:
            remaining = result.remaining
            if remaining is not None and (best is None or remaining < best):
                deciding, best = index, remaining
        elif not result.allowed:
            wait = -1 if result.retry_after is None else result.retry_after
            if best != -1 and (best is None or wait == -1 or wait > best):
                deciding, best = index, wait
    return deciding


def one_slot(checks: Sequence[Check], keys: Sequence[list[bytes]]) -> None:
    """On a Redis Cluster, refuse checks whose keys lie in two slots: no one script
    call could decide them atomically."""
    first_slot = _accel.key_slot(keys[0][0])
    for check, check_keys in zip(checks, keys):
        if any(_accel.key_slot(key) != first_slot for key in check_keys):
            raise RateLimitConfigError(
                f"limits '{checks[0].rate}' (scope {checks[0].scope!r}) and '{check.rate}' "
                f"(scope {check.scope!r}) apply to one request but their keys hash to "
                "different Redis Cluster slots, so no one atomic call can decide them: "
                "on a cluster, the limits of one request need one scope, tenant and key "
                "(different windows, or one rate string); or use a single Redis server"
            )
