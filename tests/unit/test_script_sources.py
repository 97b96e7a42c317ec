"""The shipped script files: where they are found, the clock read once, the prelude
spliced into every decision script once (no server: the files as the loader reads them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lua_harness import CLOCK_KEY, TIME_LINE, shipped_source

from moderato.algorithms import ALGORITHMS
from moderato.scripts import (
    SCRIPT_NAMES,
    _with_includes,
    batched_script,
    load_script,
    scripts_dir,
    without_comments,
)


def test_scripts_are_found_in_the_source_tree() -> None:
    assert scripts_dir() == Path(__file__).resolve().parents[2] / "lua"
    # spliced into scripts, never run on their own (together.lua and one_instant.lua:
    # into the composite scripts.composite_script() assembles; batch.lua: into the
    # batched scripts scripts.batched_script() assembles; replied.lua: into prelude.lua
    # and reset.lua; expiry_text.lua: into the write pieces;
    # decided_reply.lua: after the pieces, the script alone's reply)
    included = (
        "prelude",
        "accrual",
        "bucket_state",
        "one_policy",
        "window_counter",
        "counter_run",
        "counter_write",
        "expiry_text",
        "decided_reply",
        "together",
        "one_instant",
        "batch",
        "batch_reply",
        "cluster_batch",
        "replied",
    )
    shipped = sorted(p.stem for p in scripts_dir().glob("*.lua") if p.stem not in included)
    assert sorted(SCRIPT_NAMES) == shipped


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_each_script_reads_the_clock_once(name: str) -> None:
    source = shipped_source(name)
    assert source.count(TIME_LINE) == 1
    assert source.count(b"'TIME'") == 1
    assert CLOCK_KEY.encode() not in source


def test_decision_scripts_include_the_prelude_once() -> None:
    # As the loader sends it: replied.lua spliced in, without its comments (and so
    # without the blank lines).
    replied = (scripts_dir() / "replied.lua").read_bytes().rstrip(b"\n")
    prelude_raw = (scripts_dir() / "prelude.lua").read_bytes()
    assert prelude_raw.count(b"--#include replied.lua") == 1
    prelude = without_comments(prelude_raw.replace(b"--#include replied.lua", replied))
    prelude = prelude.rstrip(b"\n")
    decision_scripts = [name for name in SCRIPT_NAMES if name != "reset"]
    assert len(decision_scripts) == 6
    for name in decision_scripts:
        raw = (scripts_dir() / f"{name}.lua").read_bytes()
        assert raw.count(b"--#include prelude.lua") == 1, name
        source = load_script(name).source
        assert source.count(prelude) == 1 and b"--#include" not in source, name


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_script_turns_its_outcome_into_a_reply_through_replied_once(name: str) -> None:
    source = load_script(name).source
    assert source.count(b"local function replied(") == 1
    assert source.count(b"return replied(pcall(") == 1


def _lua_names(code: bytes) -> set[str]:
    """The names in Lua code (its strings and comments aside)."""
    code = re.sub(rb"'[^'\n]*'|\"[^\"\n]*\"", b"", without_comments(code))
    return {name.decode() for name in re.findall(rb"\b[A-Za-z_]\w*\b", code)}


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("piece", ["key", "read", "decide", "write"])
def test_the_pieces_the_driver_splices_in_name_none_of_its_locals(name: str, piece: str) -> None:
    # batched_script() splices an algorithm's decide and write pieces (and its key and read
    # pieces, where the read cannot refuse) into lua/batch.lua's loops as blocks: a name a
    # piece shares with one of the driver's locals would be the driver's there.
    directory = scripts_dir()
    driver = without_comments((directory / "batch.lua").read_bytes())
    driver_locals = {
        local.strip().decode()
        for names in re.findall(rb"\blocal\s+(?:function\s+)?([\w, ]+)", driver)
        for local in names.split(b",")
    }
    text = _with_includes(directory, (directory / f"{name}.lua").read_bytes())
    start = text.index(b"\n--#batch " + piece.encode())
    code = text[start : text.index(b"\n--#batch ", start + 1)]
    assert len(driver_locals) > 20 and "run_key" in driver_locals
    assert _lua_names(code) & driver_locals == set()
    # and it is spliced in
    assert without_comments(code).strip() in batched_script(name).source


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_key_and_read_pieces_are_spliced_into_the_inner_loop(name: str) -> None:
    # The inner loop opens another identity's run with the key and read pieces as a block:
    # where the read can refuse (a return among them: the counters'), in repeat ... until
    # true, each return a break that leaves the refusal in `decided`; the loop's body calls
    # keyed_check() either way.
    directory = scripts_dir()
    text = _with_includes(directory, (directory / f"{name}.lua").read_bytes())
    pieces = text[text.index(b"\n--#batch key") : text.index(b"\n--#batch decide")]
    refusals = len(re.findall(rb"\breturn\b", without_comments(pieces)))
    # (the counters' reads refuse, the rest cannot)
    assert (refusals > 0) == (name in ("fixed_window", "sliding_window"))
    source = batched_script(name).source
    assert source.count(b"decided = keyed_check()") == 1
    assert source.count(b"decided = true") == 1
    if refusals:
        assert source.count(b"\nrepeat\n") == 1
        assert source.index(b"decided = true") < source.index(b"\nuntil true")
        breaks = source[source.index(b"\nrepeat\n") : source.index(b"\nuntil true")]
        assert len(re.findall(rb"\n\s*decided = \w+\n\s*break\n", breaks)) == refusals
    else:
        assert b"\nrepeat\n" not in source


def _call_arguments(source: str) -> list[list[str]]:
    """Each redis.call / redis.pcall (or its local) in ``source``: its arguments' text,
    split at the commas outside brackets and quotes."""
    calls = []
    for opening in re.finditer(r"redis[._]p?call\(", source):
        arguments, depth, quote, current = [], 1, "", ""
        for character in source[opening.end() :]:
            if quote:
                quote = "" if character == quote else quote
            elif character in "'\"":
                quote = character
            elif character in "({":
                depth += 1
            elif character in ")}":
                depth -= 1
                if depth == 0:
                    break
            elif character == "," and depth == 1:
                arguments.append(current.strip())
                current = ""
                continue
            current += character
        calls.append([*arguments, current.strip()])
    return calls


@pytest.mark.parametrize("path", sorted(scripts_dir().glob("*.lua")), ids=lambda p: p.stem)
def test_no_command_is_sent_a_number_literal(path: Path) -> None:
    # Redis 7.0 formats a Lua number argument with '%.17g' (about 2,000 instructions
    # each): a constant goes as its text.
    source = without_comments(path.read_bytes()).decode()
    literals = [
        arguments
        for arguments in _call_arguments(source)
        if any(re.fullmatch(r"-?\d+(\.\d*)?", argument) for argument in arguments)
    ]
    assert literals == []
