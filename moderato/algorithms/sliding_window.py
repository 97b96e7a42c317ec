"""The sliding window: this window's counter plus the previous one's, weighted by what is
left of it (lua/sliding_window.lua, csrc/store_sliding_window.c)."""

from __future__ import annotations

from .base import WINDOW_INDEX, Algorithm

ALGORITHM = Algorithm(name="sliding_window", key_tag="sw", state_suffixes=(WINDOW_INDEX,))
