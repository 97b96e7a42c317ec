"""The sliding log: every admission in a sorted set, with running totals
(lua/sliding_log.lua, csrc/store_sliding_log.c)."""

from __future__ import annotations

from .base import Algorithm

ALGORITHM = Algorithm(name="sliding_log", key_tag="sl", state_suffixes=(":log",))
