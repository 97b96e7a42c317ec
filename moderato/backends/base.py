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
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Callable, Optional, Protocol

from .. import _accel
from ..algorithms import Algorithm, ScriptArg
from ..errors import BackendError, RateLimitConfigError
from ..keys import KeySpace
from ..plans import Plan
from ..redis.errors import RedisClientError, RedisReplyError
from ..results import CheckResult

# What Redis (7.0) says when a script calls a command its user may not run.
_SCRIPT_ACL_DENIAL = "can't run this command or subcommand"

DecisionReply = list[int]
"""A decision script's reply: ``[allowed, deciding, (remaining_scaled, retry_ms, reset_ms) * n]``.

docs/internals.md lays it out; the limiter checks it with ``_accel.check_result``.
"""

DecideNow = Callable[[Algorithm, Sequence[bytes], Sequence[ScriptArg]], DecisionReply]
"""An in-process backend's synchronous ``decide``."""


def script_refusal(script: str, error: RedisReplyError) -> Exception:
    """What an error reply from a script means to the caller.

    The scripts prefix their own refusals, so a bad argument from a direct
    caller reads as a configuration error rather than an outage; any other
    error reply is a BackendError with Redis's text.
    """
    message = error.message
    if message.startswith("MODERATO_ARG"):
        return RateLimitConfigError(f"{script}: {message}")
    if message.startswith("NOPERM") or _SCRIPT_ACL_DENIAL in message or ": NOPERM " in message:
        # A command the script calls was denied by the ACL (the script's own
        # reads report it as unreadable state): a permission problem, said so.
        return BackendError(
            f"NOPERM: the Redis user may not run a command the {script} script needs "
            f"(Redis said: {message}); see the ACL in docs/operations.md"
        )
    return BackendError(message)


def translated(error: BaseException, script: Optional[str] = None) -> BaseException:
    """The client's error as moderato's: an error reply (of ``script``, if one
    ran) as script_refusal() reads it, anything else the client raised as a
    BackendError with its text; any other exception unchanged."""
    if isinstance(error, RedisReplyError):
        return script_refusal(script, error) if script else BackendError(error.message)
    if isinstance(error, RedisClientError):
        return BackendError(str(error))
    return error


def decoded(plan: Plan, reply: object) -> CheckResult:
    """The CheckResult of a decision's reply; a reply of the wrong shape is a BackendError."""
    try:
        result: CheckResult = _accel.check_result(reply, plan.result_shape)
    except (TypeError, ValueError) as error:
        raise BackendError(
            f"malformed reply from the {plan.algorithm.name} script: {error}"
        ) from None
    return result


class KeySpaceBound:
    """``bind`` and ``decision_keys`` as every backend does them: the keys come
    from the bound KeySpace with the algorithm's key tag, whatever the store."""

    keyspace: KeySpace

    def bind(self, keyspace: KeySpace) -> None:
        self.keyspace = keyspace

    def decision_keys(
        self, plan: Plan, key: object, tenant_type: Optional[str], scope: object
    ) -> list[bytes]:
        return self.keyspace.decision_keys(
            plan.algorithm.key_tag, plan.policy, key, tenant_type, scope
        )


class Backend(Protocol):
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

    def decide(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> Awaitable[DecisionReply]:
        """The raw decision on keys already built: the script call, or the store's.

        ``args`` is ``(cost_scaled, apply, *per-policy arguments)`` as
        docs/internals.md lays out. A refused argument raises
        RateLimitConfigError, or RedisReplyError (for script_refusal() to
        map); a backend that cannot decide, BackendError.
        """
        ...

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        """Delete every key derived from these base keys; returns how many were deleted."""
        ...

    async def delete_matching(self, pattern: bytes) -> int:
        """Delete every key matching a glob pattern; returns how many were deleted."""
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
    ) -> Awaitable[Any]:
        """Send the decision on ``decision_keys``' keys; await the result for its raw reply."""
        ...

    def finish_check(self, plan: Plan, reply: Any) -> CheckResult:
        """The decoded decision of ``start_check``'s reply."""
        ...

    def check_failed(self, plan: Plan, error: Exception) -> BaseException:
        """What the error ``start_check``'s result raised means (moderato's errors only)."""
        ...
