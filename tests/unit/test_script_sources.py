"""The shipped script files: where they are found, the clock read once, the prelude
spliced into every decision script once (no server: the files as the loader reads them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lua_harness import CLOCK_KEY, TIME_LINE, shipped_source

from moderato.scripts import SCRIPT_NAMES, load_script, scripts_dir, without_comments


def test_scripts_are_found_in_the_source_tree() -> None:
    assert scripts_dir() == Path(__file__).resolve().parents[2] / "lua"
    # spliced into scripts, never run on their own (together.lua and one_instant.lua:
    # into the composite scripts.composite_script() assembles)
    included = (
        "prelude",
        "accrual",
        "bucket_state",
        "one_policy",
        "window_counter",
        "together",
        "one_instant",
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
    # As the loader sends it: without its comments (and so without the blank lines).
    prelude = without_comments((scripts_dir() / "prelude.lua").read_bytes()).rstrip(b"\n")
    decision_scripts = [name for name in SCRIPT_NAMES if name != "reset"]
    assert len(decision_scripts) == 6
    for name in decision_scripts:
        raw = (scripts_dir() / f"{name}.lua").read_bytes()
        assert raw.count(b"--#include prelude.lua") == 1, name
        source = load_script(name).source
        assert source.count(prelude) == 1 and b"--#include" not in source, name
