"""The Lua scripts: read from lua/ (installed: moderato/lua/), hashed once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .algorithms import ALGORITHMS
from .errors import BackendError

_INCLUDE = b"--#include "
RESET_SCRIPT = "reset"
# The registry's scripts, and reset.
SCRIPT_NAMES = (*ALGORITHMS, RESET_SCRIPT)

_PACKAGE_DIR = Path(__file__).resolve().parent
# The scripts are edited in the top-level lua/ folder; the wheel installs them
# as moderato/lua/ (pyproject.toml maps the package moderato.lua to lua/). An
# installed package has the folder beside this file, a source checkout (an
# editable or in-place build) one level up.
_SCRIPTS_DIR = next(
    (
        directory
        for directory in (_PACKAGE_DIR / "lua", _PACKAGE_DIR.parent / "lua")
        if (directory / "prelude.lua").is_file()
    ),
    _PACKAGE_DIR / "lua",
)


@dataclass(frozen=True)
class Script:
    """One Lua script: its name, its source bytes and the SHA1 Redis knows it by."""

    name: str
    source: bytes
    sha: str


def scripts_dir() -> Path:
    return _SCRIPTS_DIR


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        # A BackendError, so the HTTP layer answers 503 (the backend cannot
        # decide) and fail_open applies, as for any other backend failure.
        raise BackendError(
            f"moderato's Lua script {path.name} is missing from {path.parent}: this "
            f"installation of moderato is incomplete (its package data was not installed). "
            f"Reinstall it: pip install --force-reinstall --no-cache-dir moderato; "
            f"when building from source, build from the sdist or a full checkout, "
            f"where the scripts are lua/*.lua"
        ) from None


@cache
def load_script(name: str) -> Script:
    if name not in SCRIPT_NAMES:
        raise ValueError(f"unknown script {name!r}; expected one of {', '.join(SCRIPT_NAMES)}")
    directory = scripts_dir()
    source = _with_includes(directory, _read(directory / f"{name}.lua"))
    return Script(name=name, source=source, sha=hashlib.sha1(source).hexdigest())


def _with_includes(directory: Path, source: bytes) -> bytes:
    """Replace each ``--#include <file>`` line with that file's text (one level)."""
    lines = source.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(_INCLUDE):
            included = line[len(_INCLUDE) :].strip().decode()
            lines[index] = _read(directory / included).rstrip(b"\n")
    return b"\n".join(lines)
