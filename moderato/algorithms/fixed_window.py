"""The fixed window: a counter per window (lua/fixed_window.lua, csrc/store_fixed_window.c)."""

from __future__ import annotations

from .base import WINDOW_INDEX, Algorithm

ALGORITHM = Algorithm(name="fixed_window", key_tag="fw", state_suffixes=(WINDOW_INDEX,))
