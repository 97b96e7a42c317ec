"""A reset without a rate: SCAN for the keys of a pattern and UNLINK them (no I/O here).

``deletion()`` yields each command to send (SCAN, UNLINK) and is sent back
each reply; the asyncio Redis backend awaits them, the blocking one blocks
on them, so both delete the same keys by the same rules. On a cluster the
keys one node returns may lie in several slots, and one UNLINK must stay in
one slot: they are grouped by slot, each group its own UNLINK (the cluster
client sends it to the slot's owner, following a slot that moved meanwhile).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .._accel import key_slot
from ..errors import BackendError

__all__ = ["SCAN_BATCH", "as_count", "deletion", "literal_hash_tag"]

SCAN_BATCH = 1000

Command = tuple[Any, ...]


def deletion(pattern: bytes, cluster: bool) -> Generator[Command, Any, int]:
    """The SCAN and UNLINK commands deleting every key matching ``pattern`` on one node;
    returns how many were deleted."""
    deleted = 0
    cursor: Any = b"0"
    while True:
        reply = yield ("SCAN", cursor, "MATCH", pattern, "COUNT", SCAN_BATCH)
        cursor, found = reply[0], reply[1]
        if found:
            groups = [found]
            if cluster:
                by_slot: dict[int, list[bytes]] = {}
                for key in found:
                    by_slot.setdefault(key_slot(key), []).append(key)
                groups = list(by_slot.values())
            for group in groups:
                deleted += as_count((yield ("UNLINK", *group)), "UNLINK")
        if cursor in (b"0", 0, "0"):
            return deleted


def literal_hash_tag(pattern: bytes) -> bool:
    """Whether the pattern's ``{hash tag}`` is literal text (so it fixes one slot)."""
    start = pattern.find(b"{")
    end = pattern.find(b"}", start + 1) if start >= 0 else -1
    return end > start + 1 and not any(char in pattern[start + 1 : end] for char in b"*?[]\\")


def as_count(reply: object, what: str) -> int:
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise BackendError(f"{what} replied {reply!r}, expected an integer count")
    return reply
