"""The interface every backend offers the limiter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..algorithms import Algorithm, ScriptArg

PolicyReply = tuple[int, int, int]
"""One policy's (remaining_scaled, retry_ms, reset_ms); -1 marks 'never' / 'none'."""

Decision = tuple[bool, int, tuple[PolicyReply, ...]]
"""(allowed, index of the deciding policy, one PolicyReply per policy)."""


class Backend(Protocol):
    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def decide(
        self,
        algorithm: Algorithm,
        keys: Sequence[bytes],
        args: Sequence[ScriptArg],
        policies: int,
    ) -> Decision:
        """Run one atomic decision (or a read-only peek) over ``policies`` policies.

        ``args`` is ``(cost_scaled, apply, *per-policy arguments)`` as
        docs/internals.md lays out.
        """
        ...

    async def reset(self, keys: Sequence[bytes], windows_s: Sequence[int]) -> int:
        """Delete every key derived from these base keys; returns how many were deleted."""
        ...

    async def delete_matching(self, pattern: bytes) -> int:
        """Delete every key matching a glob pattern; returns how many were deleted."""
        ...
