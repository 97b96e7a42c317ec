"""The interface every backend offers the limiter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Protocol

from ..algorithms import Algorithm, ScriptArg

DecisionReply = list[int]
"""A decision script's reply: ``[allowed, deciding, (remaining_scaled, retry_ms, reset_ms) * n]``.

docs/internals.md lays it out; the limiter checks it with ``_accel.check_result``.
"""

DecideNow = Callable[[Algorithm, Sequence[bytes], Sequence[ScriptArg]], DecisionReply]
"""An in-process backend's synchronous ``decide``."""


class Backend(Protocol):
    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def decide(
        self, algorithm: Algorithm, keys: Sequence[bytes], args: Sequence[ScriptArg]
    ) -> DecisionReply:
        """Run one atomic decision (or a read-only peek), one key per policy.

        ``args`` is ``(cost_scaled, apply, *per-policy arguments)`` as
        docs/internals.md lays out. A refused argument raises
        RateLimitConfigError; a backend that cannot decide, BackendError.
        """
        ...

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        """Delete every key derived from these base keys; returns how many were deleted."""
        ...

    async def delete_matching(self, pattern: bytes) -> int:
        """Delete every key matching a glob pattern; returns how many were deleted."""
        ...
