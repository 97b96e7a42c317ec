"""The Lua scripts: read from lua/ (installed: moderato/lua/), assembled and hashed once.

Assembling a script splices its includes in and strips its comments: Redis is
sent the code alone (about half the bytes), and the SHA1 is that text's, so
the EVALSHA, the SCRIPT LOAD after a flushed cache and every test or
benchmark that takes ``load_script(name)`` agree on it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .algorithms import ALGORITHMS
from .errors import BackendError

_INCLUDE = b"--#include "
RESET_SCRIPT = "reset"
TOGETHER_SCRIPT = "together"
"""The composite's own part (lua/together.lua): several decisions as one."""
BATCH_DRIVER = "batch"
"""A batched script's driver (lua/batch.lua): several checks of one algorithm in one call."""
MAX_BATCH_PARTS = 16
"""The most checks sent in full (or with their own keys or cost) one batched call decides;
an algorithm's own bound (``Algorithm.batch_parts``) may be lower."""
BATCH_PART_UNITS = 4
"""A check's weight in a batched call: one sent in full (or with its own keys or cost)
weighs this many units, one sent as the check before it again (the ``=`` marker: a hot
identity's checks, decided on the run's Lua locals) ``Algorithm.batch_repeat_units``."""
MAX_BATCH_UNITS = MAX_BATCH_PARTS * BATCH_PART_UNITS
"""The most units one batched call's checks weigh (lua/batch.lua refuses more): 16 checks
in full, or one and 60 repeats of it (BENCHMARKS.md, "A hot run's repeats weigh less")."""
MAX_BATCH_POLICIES = 16
"""The most policies (keys) one batched call decides, over all its checks: a check of
several policies costs Redis about as much as as many checks of one, so a call of checks
of many policies stays as short as one of 16 one-policy checks (a check of more than 16
alone is sent alone; BENCHMARKS.md, "The bound of a batched call")."""
MAX_BATCH_ARGUMENT_BYTES = 16384
"""The most argument and key bytes the client puts in one batched call."""
_EACH_MARKER = b"--#batch each"
_SHARED_MARKER = b"--#batch shared"
_DECIDE_MARKER = b"--#batch decide"
_WRITE_MARKER = b"--#batch write"
_PIECE_MARKERS = (b"--#batch key", b"--#batch read", _DECIDE_MARKER, _WRITE_MARKER)
_END_MARKER = b"--#batch end"
_KEYED_MARKER = b"--#batch keyed"
_LAST_LINE = b"return decide("
# A refusal in the key or read piece: `return` and a name, alone on its line.
_REFUSAL_LINE = re.compile(rb"^(\s*)return ([A-Za-z_]\w*)\s*(?:--.*)?$")
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
    source = without_comments(_with_includes(directory, _read(directory / f"{name}.lua")))
    return Script(name=name, source=source, sha=hashlib.sha1(source).hexdigest())


def _with_includes(directory: Path, source: bytes) -> bytes:
    """Replace each ``--#include <file>`` line with that file's text, its own includes
    spliced in too (prelude.lua includes replied.lua, which reset.lua includes alone)."""
    lines = source.split(b"\n")
    for index, line in enumerate(lines):
        if line.startswith(_INCLUDE):
            included = line[len(_INCLUDE) :].strip().decode()
            lines[index] = _with_includes(directory, _read(directory / included)).rstrip(b"\n")
    return b"\n".join(lines)


# A long bracket's opening: "[", any number of "=", "[" (its level is the "=" count).
_LONG_BRACKET = re.compile(rb"\[(=*)\[")
_TRAILING_BLANKS = re.compile(rb"[ \t]+\n")
_EMPTY_LINES = re.compile(rb"\n\n+")


def without_comments(source: bytes) -> bytes:
    """``source`` without its Lua comments, trailing blanks and empty lines.

    A small lexer, so a ``--`` inside a string or a long string is left alone:
    quoted strings and long strings (``[[...]]``, ``[==[...]==]``) are copied
    as they are, ``--[[ ... ]]`` block comments become one space (they may sit
    between two tokens) and ``--`` line comments end at the newline. Only the
    code between strings is tidied; indentation stays, so the text stays readable
    in SCRIPT debugging and in the slow log.
    """
    code: list[bytes] = []  # code since the last string, tidied when a string comes
    out: list[bytes] = []
    start = index = 0
    size = len(source)
    while index < size:
        char = source[index]
        if char == 0x2D and source.startswith(b"--", index):  # "-"
            code.append(source[start:index])
            bracket = _LONG_BRACKET.match(source, index + 2)
            if bracket is not None:
                index = _long_bracket_end(source, bracket)
                code.append(b" ")
            else:
                newline = source.find(b"\n", index)
                index = size if newline < 0 else newline
            start = index
        elif char in (0x22, 0x27) or (char == 0x5B and _LONG_BRACKET.match(source, index)):
            if char == 0x5B:  # "["
                bracket = _LONG_BRACKET.match(source, index)
                assert bracket is not None
                end = _long_bracket_end(source, bracket)
            else:
                end = _quoted_end(source, index)
            code.append(source[start:index])
            out.append(_tidied(b"".join(code)))
            code.clear()
            out.append(source[index:end])
            index = start = end
        else:
            index += 1
    code.append(source[start:])
    out.append(_tidied(b"".join(code)))
    return b"".join(out).strip(b"\n") + b"\n"


def _tidied(code: bytes) -> bytes:
    return _EMPTY_LINES.sub(b"\n", _TRAILING_BLANKS.sub(b"\n", code))


def _long_bracket_end(source: bytes, opening: re.Match[bytes]) -> int:
    """The index just past the long bracket that ``opening`` opens (the end if unclosed)."""
    closing = b"]" + opening.group(1) + b"]"
    end = source.find(closing, opening.end())
    return len(source) if end < 0 else end + len(closing)


def _quoted_end(source: bytes, index: int) -> int:
    """The index just past the quoted string starting at ``index`` (backslash escapes skipped)."""
    quote = source[index]
    index += 1
    size = len(source)
    while index < size:
        char = source[index]
        if char == 0x5C:  # a backslash escapes the next byte, a newline included
            index += 2
        elif (
            char == quote or char == 0x0A
        ):  # an unfinished string ends at its line (Lua refuses it)
            return index + 1
        else:
            index += 1
    return size


def _functions_then(names: tuple[str, ...], driver: str) -> bytes:
    """``local scripts = {...}``, the scripts ``names`` as functions of KEYS, ARGV and
    redis (the names their text uses as globals, so each runs unchanged), then the
    driver ``driver`` (lua/<driver>.lua) that calls them."""
    functions = b",\n".join(
        b"function(KEYS, ARGV, redis)\n" + load_script(name).source + b"end" for name in names
    )
    directory = scripts_dir()
    driver_source = without_comments(_with_includes(directory, _read(directory / f"{driver}.lua")))
    return b"local scripts = {\n" + functions + b"\n}\n" + driver_source


@cache
def composite_script(names: tuple[str, ...]) -> Script:
    """One script deciding parts of the decision scripts ``names`` atomically (lua/together.lua).

    A part names its script by its 1-based index in ``names``.
    """
    if not names or len(set(names)) != len(names):
        raise ValueError(f"composite_script takes distinct script names, got {names!r}")
    source = _functions_then(names, TOGETHER_SCRIPT)
    return Script(
        name=f"together({'+'.join(names)})", source=source, sha=hashlib.sha1(source).hexdigest()
    )


@cache
def batched_script(name: str) -> Script:
    """The decision script ``name`` deciding several checks in one call (lua/batch.lua).

    Made of the script's own text, split at its markers, so each algorithm's math has one
    home: its head (up to ``--#batch each``: the clock, read once) stays at the top; its
    one-policy straight-line path (to ``--#batch shared``), split in turn at ``--#batch
    key``, ``read``, ``decide``, ``write`` and ``end``, becomes ``parse_check()`` (its
    argument check, the policy's piece before ``key`` and the key piece),
    ``open_check()`` (those and the read: a run's first check), ``keyed_check()`` (the
    key piece and the read: a run's first check whose arguments are those of the last
    check parsed, so the policy's scalars stand) and ``write_state()``, which the driver
    runs per check or once per run of checks on one key; the decide piece is spliced into
    the driver where it decides a check (its ``--#batch decide`` lines), as a block on the
    script's locals, with no call (what follows ``--#batch end``, the reply's return, is
    the script's alone); the general path (the rest, to its closing ``return
    decide(...)``) becomes ``general_path()``, run for a check the straight-line path
    leaves to it. A straight-line path without the pieces' markers becomes
    ``open_check()`` whole, answering its reply or nil, each check on its own. ``KEYS``
    and ``ARGV`` are locals the driver sets per check.
    """
    if name not in ALGORITHMS:
        raise ValueError(
            f"unknown decision script {name!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    directory = scripts_dir()
    lines = _with_includes(directory, _read(directory / f"{name}.lua")).rstrip(b"\n").split(b"\n")
    each, shared = _marked(lines, _EACH_MARKER), _marked(lines, _SHARED_MARKER)
    if (
        len(each) != 1
        or len(shared) != 1
        or not each[0] < shared[0]
        or not lines[-1].startswith(_LAST_LINE)
    ):
        raise ValueError(
            f"{name}.lua needs one '--#batch each', then one '--#batch shared' line, and "
            f"its last line 'return decide(...)' to be batched"
        )
    head, straight_line = lines[: each[0]], lines[each[0] + 1 : shared[0]]
    general = lines[shared[0] + 1 :]
    pieces, decide_piece, write_piece, keyed_piece = _check_pieces(name, straight_line)
    driver = _with_includes(directory, _read(directory / f"{BATCH_DRIVER}.lua")).split(b"\n")
    # The driver's `--#batch decide` and `--#batch write` lines: the decide and the write
    # piece spliced in as a block (their names the script's locals: the driver's own are
    # apart, tests/unit/test_script_sources.py); its `--#batch keyed` line: the key and the
    # read piece as a block (see _check_pieces), or keyed_check() called where neither
    # block can take them.
    keyed = tuple(keyed_piece) if keyed_piece else (b"decided = keyed_check()",)
    driver = [
        line
        for driver_line in driver
        for line in (
            (b"do", *decide_piece, b"end")
            if driver_line.startswith(_DECIDE_MARKER)
            else (b"do", *write_piece, b"end")
            if driver_line.startswith(_WRITE_MARKER)
            else keyed
            if driver_line.startswith(_KEYED_MARKER)
            else (driver_line,)
        )
    ]
    source = without_comments(
        b"\n".join(
            [
                b"local BATCH_KEYS, BATCH_ARGV = KEYS, ARGV",
                b"local KEYS, ARGV",
                *head,
                *pieces,
                b"local function general_path()",
                *general,
                b"end",
                *driver,
            ]
        )
    )
    return Script(name=f"batch({name})", source=source, sha=hashlib.sha1(source).hexdigest())


def _marked(lines: list[bytes], marker: bytes) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith(marker)]


def _check_pieces(
    name: str, straight_line: list[bytes]
) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes]]:
    """The straight-line path's functions for lua/batch.lua (see batched_script), its
    decide and write pieces (nothing when the path is not split: open_check() never
    opens a run), and its key and read pieces as the block the driver runs in place of
    keyed_check() (a call would cost Redis the call and every local read as an upvalue):
    ``decided = true`` after them where they hold no ``return``; where the read can refuse
    (``return`` and a name alone on a line, no loop around it), in ``repeat ... until
    true`` with each such return as ``decided = <name>`` and ``break``; else nothing."""
    reset = b"cost_scaled, capacity_scaled, window_s, window_ms = nil, nil, nil, nil"
    markers = [_marked(straight_line, marker) for marker in (*_PIECE_MARKERS, _END_MARKER)]
    if not any(markers):
        return (
            [
                b"local state_key, reply",
                b"local function open_check()",
                reset,
                *straight_line,
                b"end",
                b"local function parse_check() end",
                b"local write_state, keyed_check = parse_check, open_check",
            ],
            [],
            [],
            [],
        )
    at = [found[0] for found in markers if len(found) == 1]
    if len(at) != len(markers) or at != sorted(at):
        raise ValueError(
            f"{name}.lua's straight-line path needs one each of '--#batch key', 'read', "
            f"'decide', 'write' and 'end', in that order, or none"
        )
    key, read, decide, write, end = at
    parse, key_piece = straight_line[:key], straight_line[key + 1 : read]
    read_piece, decide_piece = straight_line[read + 1 : decide], straight_line[decide + 1 : write]
    write_piece = straight_line[write + 1 : end]
    keyed = [*key_piece, *read_piece]
    # parse ends in the straight-line path's 'if <it applies> then', then the policy's piece
    # (what the policy's fields and the instant give), which key_piece follows in that block.
    return (
        [
            b"local function parse_check()",
            reset,
            *parse,
            *key_piece,
            b"return true",
            b"end",
            b"end",
            b"local function open_check()",
            reset,
            *parse,
            *key_piece,
            *read_piece,
            b"return true",
            b"end",
            b"end",
            b"local function keyed_check()",
            *key_piece,
            *read_piece,
            b"return true",
            b"end",
            b"local function write_state()",
            *write_piece,
            b"end",
        ],
        decide_piece,
        write_piece,
        _keyed_block(keyed),
    )


def _keyed_block(keyed: list[bytes]) -> list[bytes]:
    """The key and read pieces as a block for the driver's inner loop (see _check_pieces),
    or nothing when a return in them takes another form."""
    code = without_comments(b"\n".join(keyed))
    if not re.search(rb"\breturn\b", code):
        return [b"do", *keyed, b"end", b"decided = true"]
    if re.search(rb"\b(?:for|while|repeat)\b", code):
        return []  # a break there would leave that loop, not the block
    block = [b"repeat"]
    for line in keyed:
        refusal = _REFUSAL_LINE.match(line)
        if refusal:
            block += [refusal[1] + b"decided = " + refusal[2], refusal[1] + b"break"]
        elif re.search(rb"\breturn\b", without_comments(line)):
            return []
        else:
            block.append(line)
    return [*block, b"decided = true", b"until true"]
