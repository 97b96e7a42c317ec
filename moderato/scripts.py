"""The Lua scripts: found in the installed package or the source tree, hashed once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SCRIPT_NAMES = (
    "fixed_window",
    "token_bucket",
    "sliding_window",
    "gcra",
    "sliding_log",
    "leaky_bucket",
    "reset",
)

_PACKAGE_DIR = Path(__file__).resolve().parent
# Installed wheels carry the scripts as moderato/lua/; a source checkout keeps
# them one level up in lua/ (the single copy that is edited).
_SEARCH_DIRS = (_PACKAGE_DIR / "lua", _PACKAGE_DIR.parent / "lua")


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, its source bytes and the SHA1 Redis knows it by."""

    name: str
    source: bytes
    sha: str


def scripts_dir() -> Path:
    for directory in _SEARCH_DIRS:
        if (directory / "fixed_window.lua").is_file():
            return directory
    searched = ", ".join(str(d) for d in _SEARCH_DIRS)
    raise FileNotFoundError(f"moderato's Lua scripts were not found (searched {searched})")


@cache
def load_script(name: str) -> Script:
    if name not in SCRIPT_NAMES:
        raise ValueError(f"unknown script {name!r}; expected one of {', '.join(SCRIPT_NAMES)}")
    source = (scripts_dir() / f"{name}.lua").read_bytes()
    return Script(name=name, source=source, sha=hashlib.sha1(source).hexdigest())
