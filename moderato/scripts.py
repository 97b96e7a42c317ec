"""The Lua scripts: found in the installed package or the source tree, hashed once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_INCLUDE = b"--#include "
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
# The scripts live inside the package (moderato/lua/), so the source tree, the
# sdist and the wheel carry the same files at the same place.
_SCRIPTS_DIR = _PACKAGE_DIR / "lua"


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, its source bytes and the SHA1 Redis knows it by."""

    name: str
    source: bytes
    sha: str


def scripts_dir() -> Path:
    if (_SCRIPTS_DIR / "fixed_window.lua").is_file():
        return _SCRIPTS_DIR
    raise FileNotFoundError(f"moderato's Lua scripts were not found in {_SCRIPTS_DIR}")


@cache
def load_script(name: str) -> Script:
    if name not in SCRIPT_NAMES:
        raise ValueError(f"unknown script {name!r}; expected one of {', '.join(SCRIPT_NAMES)}")
    directory = scripts_dir()
    source = _with_includes(directory, (directory / f"{name}.lua").read_bytes())
    return Script(name=name, source=source, sha=hashlib.sha1(source).hexdigest())


def _with_includes(directory: Path, source: bytes) -> bytes:
    """Replace each ``--#include <file>`` line with that file's text (one level)."""
    lines = source.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(_INCLUDE):
            included = line[len(_INCLUDE) :].strip().decode()
            lines[index] = (directory / included).read_bytes().rstrip(b"\n")
    return b"\n".join(lines)
