"""The interface every backend offers the limiter.

A backend owns a check's work: it builds the keys of the identity's parts
(key, tenant, scope) from the KeySpace the limiter bound it to
(``decision_keys``), runs the decision on them for the plan (rate and
algorithm, worked out once) and the cost, maps its error replies to
moderato's errors and decodes the reply into a CheckResult. The limiter
holds the keys only to route (a cluster node's breaker) and to remember a
denial (denial_cache.py). The limiter keeps what is the same for every backend: the
circuit breaker, metrics, shadow mode and the failure policy.

An in-process backend (``synchronous``) answers ``check_now`` at once; a
remote one splits a check in three so the limiter awaits the client's own
future, with no coroutine of the backend's around it: ``start_check``
(keys, arguments, send), then ``finish_check`` (decode) or ``check_failed``
(map the error).

Direct callers, who build their own keys and scaled numbers, use ``decide``
(``DirectDecisions``): one policy, a window of 1 to 86,400 whole seconds,
and a ``BackendResult`` in the scripts' own units. Longer windows are the
limiter's (its rate strings reach them through ``start_check``/``check_now``).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Union

from ..algorithms import Algorithm, ScriptArg, get_algorithm
from ..errors import RateLimitConfigError
from ..keys import KeySpace
from ..plans import Plan
from ..policy import MAX_WINDOW_S, SCALE, Rate
from ..results import CheckResult
from .replies import DecisionReply, decoded_one

DecideNow = Callable[[Algorithm, Sequence[bytes], Sequence[ScriptArg]], DecisionReply]
"""An in-process backend's synchronous ``decide``."""

Part = tuple[Algorithm, Sequence[bytes], Sequence[ScriptArg]]
"""One decision among several taken together: its algorithm, keys and arguments
(``cost_scaled``, apply, then the per-policy arguments), as ``direct_reply`` takes them."""


@dataclass(frozen=True)
class BackendResult:
    """What a direct ``decide`` call answers: the script's numbers, in its units.

    Public results (CheckResult, RateLimitExceeded) speak whole requests and
    seconds, and None for the retry of a permanent denial; this record keeps
    the contract's units and its -1.
    """

    allowed: bool
    remaining_scaled: int
    """Capacity left in 1/1000 units, net of the cost when admitted (nothing is charged on a
    denial)."""
    retry_after: int
    """Milliseconds until the same cost could fit (0 when admitted); -1 for a permanent denial:
    the cost is larger than the capacity, and waiting cannot help."""
    reset_at: Optional[int]
    """Unix time in milliseconds on Redis's clock (admitted: the window's end or the full-refill
    instant; denied: when the same cost fits); None for a permanent denial."""

    @property
    def permanent(self) -> bool:
        """Denied for good: the cost exceeds the capacity."""
        return self.retry_after == -1


def _scaled_integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RateLimitConfigError(
            f"{name} must be an int (1/1000 units: {SCALE} is one request), got {value!r}"
        )
    return value


def direct_arguments(
    algorithm: Algorithm,
    *,
    capacity_scaled: object,
    window_s: object,
    cost_scaled: object,
    refill_scaled_per_s: object,
    apply: bool,
) -> tuple[ScriptArg, ...]:
    """The script arguments of one direct decision, or RateLimitConfigError before any I/O.

    The window is checked here, against the direct contract (1 to 86,400
    whole seconds); the scripts check every other range themselves, also
    before touching a key, and their refusal is a RateLimitConfigError too.
    """
    if (
        isinstance(window_s, bool)
        or not isinstance(window_s, int)
        or not 1 <= window_s <= MAX_WINDOW_S
    ):
        raise RateLimitConfigError(
            f"window_s must be a whole number of seconds from 1 to {MAX_WINDOW_S} "
            f"(the direct backend contract), got {window_s!r}; longer windows are for "
            f"RateLimiter's rates, e.g. check(key, '100/week')"
        )
    capacity = _scaled_integer("capacity_scaled", capacity_scaled)
    cost = _scaled_integer("cost_scaled", cost_scaled)
    # The algorithm's own per-policy layout, with the caller's capacity: capacity
    # and window, then (the token bucket) a refill rate, "" for the public rule.
    layout = list(algorithm.policy_args(Rate(1, window_s)))
    layout[0] = capacity
    if refill_scaled_per_s is not None:
        if len(layout) < 3:
            raise RateLimitConfigError(
                f"refill_scaled_per_s does not apply to {algorithm.name}: only an algorithm "
                f"that refills at a rate (token_bucket) takes one"
            )
        if (
            isinstance(refill_scaled_per_s, bool)
            or not isinstance(refill_scaled_per_s, (int, float))
            or not math.isfinite(refill_scaled_per_s)
        ):
            raise RateLimitConfigError(
                f"refill_scaled_per_s must be a finite number of 1/1000 units per second, "
                f"got {refill_scaled_per_s!r}"
            )
        layout[2] = repr(refill_scaled_per_s)
    return (cost, 1 if apply else 0, *layout)


class DirectDecisions(Protocol):
    """``decide`` for direct callers, over a backend's raw ``direct_reply``: every
    backend's (a subclass inherits it), and so part of the Backend protocol."""

    def direct_reply(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> Awaitable[object]:
        """The raw reply of one decision in the scripts' own layout; moderato's errors only."""
        raise NotImplementedError

    async def decide(
        self,
        key: Union[bytes, str],
        *,
        capacity_scaled: int,
        window_s: int,
        cost_scaled: int = SCALE,
        algorithm: str = "fixed_window",
        refill_scaled_per_s: Optional[float] = None,
        apply: bool = True,
    ) -> BackendResult:
        """One decision on a key the caller built (docs/internals.md, "The direct backend API").

        ``capacity_scaled`` and ``cost_scaled`` are in 1/1000 units (1000 is
        one request); ``window_s`` is 1 to 86,400 whole seconds; the token
        bucket takes ``refill_scaled_per_s`` (default: one capacity per
        window). ``apply=False`` peeks: the same answer, nothing written.
        Anything outside the contract raises RateLimitConfigError before a
        key is read or written; a backend that cannot decide raises
        BackendError.
        """
        chosen = get_algorithm(algorithm)
        args = direct_arguments(
            chosen,
            capacity_scaled=capacity_scaled,
            window_s=window_s,
            cost_scaled=cost_scaled,
            refill_scaled_per_s=refill_scaled_per_s,
            apply=apply,
        )
        if not isinstance(key, (bytes, str)):
            raise RateLimitConfigError(f"key must be bytes or str, got {type(key).__name__}")
        encoded = key.encode() if isinstance(key, str) else key
        reply = await self.direct_reply(chosen, [encoded], args)
        allowed, remaining_scaled, retry_ms, reset_ms = decoded_one(chosen.name, reply)
        return BackendResult(
            allowed, remaining_scaled, retry_ms, None if reset_ms < 0 else reset_ms
        )


class KeySpaceBound:
    """``bind`` and ``decision_keys`` as every backend does them: the keys come
    from the bound KeySpace with the algorithm's key tag, whatever the store."""

    keyspace: KeySpace
    decision_keys: Callable[[Plan, object, Optional[str], object], list[bytes]]
    """The bound KeySpace's ``plan_keys`` itself: a check asks it with no call between."""

    def bind(self, keyspace: KeySpace) -> None:
        self.keyspace = keyspace
        self.decision_keys = keyspace.plan_keys


NodeOf = Callable[[bytes], Optional[str]]
"""On a cluster, the node owning a key."""


def cluster_routes(
    client: Any, cluster: bool
) -> tuple[Optional[NodeOf], Optional[Callable[[], None]]]:
    """A Redis backend's ``node_of`` and ``reload_routes``: None for one server.

    On a cluster the limiter keeps a circuit breaker per node (``node_of``), so
    one failing primary does not stop the others; while a node's breaker is
    open no check reaches it, so the slot map is reloaded meanwhile
    (``reload_routes``) and a replica promoted in its place is used at once.
    """
    return (client.node_for_key, client.reload_map_soon) if cluster else (None, None)


class Backend(DirectDecisions, Protocol):
    synchronous: bool
    """True for SynchronousBackend (answers at once), False for AsyncBackend."""

    keyspace: KeySpace
    """Where its keys live; set by ``bind`` before the first check."""

    def bind(self, keyspace: KeySpace) -> None:
        """Build every key from ``keyspace`` (the limiter's prefix and identity secret)."""
        ...

    def decision_keys(
        self, plan: Plan, key: object, tenant_type: Optional[str], scope: object
    ) -> list[bytes]:
        """The keys of a check, one per policy window (RateLimitConfigError for a bad part)."""
        ...

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def decide_together(self, parts: Sequence[Part]) -> Awaitable[list[DecisionReply]]:
        """Several raw decisions as one: every part is charged, or none is.

        Every part is decided at one instant; when one does not fit, nothing is
        written and each part's reply is what it would answer (a peek). The
        replies come back in the parts' order. On Redis the parts' keys must
        share one Cluster slot; moderato's errors only.
        """
        ...

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        """Delete every key derived from these base keys; returns how many were deleted."""
        ...

    async def delete_matching(self, pattern: bytes) -> int:
        """Delete every key matching a glob pattern; returns how many were deleted."""
        ...

    async def announce_reset(self) -> None:
        """After a reset: tell every limiter that may remember denials under this key
        prefix (denial_cache.py) to forget them; a failure is logged, never raised."""
        ...


class SynchronousBackend(Backend, Protocol):
    """A backend that decides in process, without waiting."""

    def check_now(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> CheckResult:
        """One decision (``apply``) or peek, decoded; raises moderato's errors only."""
        ...


class AsyncBackend(Backend, Protocol):
    """A backend whose decisions wait for a reply."""

    def start_check(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> Union[Awaitable[Any], CheckResult]:
        """Send the decision on ``decision_keys``' keys; await the result for its raw reply.

        Or, when the backend knows the answer without asking (a denial it
        remembers: denial_cache.py), the CheckResult itself: no backend call
        was made, so the limiter counts none.
        """
        ...

    def finish_check(self, plan: Plan, sent: object, reply: Any) -> CheckResult:
        """The decoded decision of ``start_check``'s reply (``sent``: what start_check
        returned, awaited for ``reply``)."""
        ...

    def check_failed(self, plan: Plan, sent: object, error: BaseException) -> BaseException:
        """What the error awaiting ``sent`` (start_check's result) raised means: moderato's
        errors, or ``error`` itself when it is none of the client's (a cancellation...).
        Called for every such error, so a backend may forget ``sent`` here."""
        ...


class BlockingBackend(Protocol):
    """A backend of the blocking RateLimiter (moderato.sync): every call returns once it
    is done. The same keys, scripts, replies and errors as the asyncio backends."""

    keyspace: KeySpace

    def bind(self, keyspace: KeySpace) -> None: ...

    def decision_keys(
        self, plan: Plan, key: object, tenant_type: Optional[str], scope: object
    ) -> list[bytes]: ...

    def check_now(
        self, plan: Plan, keys: list[bytes], cost_scaled: int, apply: bool
    ) -> CheckResult:
        """One decision (``apply``) or peek, decoded; raises moderato's errors only."""
        ...

    def decide_now(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        """One script's raw reply for these keys and arguments (cost_scaled, apply, then
        the per-policy fields), as ``direct_reply`` answers it."""
        ...

    def decide_together_now(self, parts: Sequence[Part]) -> list[DecisionReply]:
        """Several decisions as one (``decide_together``): each part's raw reply."""
        ...

    def reset_now(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        """Delete every key derived from these base keys; returns how many were deleted."""
        ...

    def delete_matching_now(self, pattern: bytes) -> int:
        """Delete every key matching a glob pattern; returns how many were deleted."""
        ...

    def announce_reset_now(self) -> None:
        """After a reset: tell the asyncio limiters that may remember denials under this
        key prefix to forget them (Backend.announce_reset)."""
        ...

    def connect_now(self) -> None:
        """Check the backend answers now (BackendError if not)."""
        ...

    def close_now(self) -> None:
        """Release connections (the backend stays usable)."""
        ...
