"""The interface every backend offers the limiter."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Callable, Protocol

from ..algorithms import Algorithm, ScriptArg
from ..errors import BackendError, RateLimitConfigError, RedisReplyError

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
    error reply stays a BackendError.
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
    return error


class Backend(Protocol):
    synchronous: bool
    """True when the backend decides without waiting (in process): it then
    offers ``decide_now``, which the limiter calls directly, with no await."""

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def decide(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> Awaitable[DecisionReply]:
        """Run one atomic decision (or a read-only peek), one key per policy.

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
    """A backend whose ``synchronous`` is True."""

    def decide_now(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        """``decide``, answered at once."""
        ...
