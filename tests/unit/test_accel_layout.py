"""The shape of the C accelerator: what the extension exports, and how its files depend
on each other.

The built module exports one symbol, ``PyInit__accel`` (setup.py builds with
``-fvisibility=hidden``); its headers include each other in one direction; and
no C file calls into a file that calls back into it, so each file reads from
the ones it depends on, top to bottom (docs/architecture.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from moderato import _accel

CSRC = Path(__file__).resolve().parents[2] / "csrc"

# memory://'s headers, each including the one before it (store_call.h maps them).
STORE_HEADERS = (
    "store_table.h",
    "store_call.h",
    "store_validate.h",
    "store_keys.h",
    "store_bucket.h",
    "store_algorithms.h",
    "store_decide.h",
)


def local_includes(path: Path) -> list[str]:
    return re.findall(r'^#include "([^"]+)"', path.read_text(), re.M)


def cycle_in(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path (first node repeated last), or [] if there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        path.append(node)
        for after in sorted(graph.get(node, ())):
            found = visit(after)
            if found:
                return found
        path.pop()
        done.add(node)
        return []

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return []


def test_cycle_in_finds_a_cycle_and_none_where_there_is_none() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


# -- what the extension exports --------------------------------------------------------------


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("nm") is None,
    reason="reads the ELF dynamic symbol table with nm",
)
def test_the_extension_exports_only_its_init_function() -> None:
    listed = subprocess.run(
        ["nm", "-D", "--defined-only", _accel.__file__],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in listed.splitlines() if line.strip()}
    assert exported == {"PyInit__accel"}


# -- how the files depend on each other --------------------------------------------------------


def test_the_headers_include_each_other_without_a_cycle() -> None:
    graph = {path.name: set(local_includes(path)) for path in CSRC.glob("*.[ch]")}
    assert cycle_in(graph) == []


def test_the_store_headers_go_one_way() -> None:
    """Each store header includes the one before it and none after; the files of a
    layer include their own header (the algorithms theirs, the methods the top)."""
    for below, header in zip(STORE_HEADERS, STORE_HEADERS[1:]):
        included = local_includes(CSRC / header)
        assert below in included, header
        later = STORE_HEADERS[STORE_HEADERS.index(header) + 1 :]
        assert not set(included) & set(later), header
    layers = {
        "store_validate.c": "store_validate.h",
        "store_keys.c": "store_keys.h",
        "store_bucket.c": "store_bucket.h",
        "store_decide.c": "store_decide.h",
        "store_glob.c": "store_decide.h",
        "store_debug.c": "store_decide.h",
        "memory.c": "store_decide.h",
    }
    algorithms = [path.name for path in CSRC.glob("store_*.c") if path.name not in layers]
    algorithms.remove("store_table.c")
    assert len(algorithms) == len(_accel.MEMORY_ALGORITHMS)
    layers.update(dict.fromkeys(algorithms, "store_algorithms.h"))
    for source, header in layers.items():
        store_headers = [name for name in local_includes(CSRC / source) if name in STORE_HEADERS]
        assert store_headers == [header], source


def defined_and_needed(object_file: Path) -> tuple[set[str], set[str]]:
    """An object file's global symbols: those it defines and those it needs."""
    listed = subprocess.run(
        ["nm", str(object_file)], capture_output=True, text=True, check=True
    ).stdout
    defined, needed = set(), set()
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "U":
            needed.add(fields[1])
        elif len(fields) == 3 and fields[1].isupper():
            defined.add(fields[2])
    return defined, needed


@pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("nm") is None,
    reason="compiles csrc/ with cc and reads the objects with nm",
)
def test_no_c_file_calls_into_a_file_that_calls_back(tmp_path: Path) -> None:
    """Every C file compiled alone; a file depends on another when it uses a symbol the
    other defines. The dependencies form no cycle."""
    include = sysconfig.get_paths()["include"]
    symbols: dict[str, tuple[set[str], set[str]]] = {}
    for source in sorted(CSRC.glob("*.c")):
        object_file = tmp_path / f"{source.stem}.o"
        subprocess.run(
            ["cc", "-c", "-O0", "-w", f"-I{CSRC}", f"-I{include}", str(source), "-o", object_file],
            check=True,
        )
        symbols[source.name] = defined_and_needed(object_file)
    owner = {symbol: name for name, (defined, _) in symbols.items() for symbol in defined}
    graph = {
        name: {owner[symbol] for symbol in needed if owner.get(symbol, name) != name}
        for name, (_, needed) in symbols.items()
    }
    assert cycle_in(graph) == []
    # the store's layers, bottom to top
    assert graph["store_validate.c"] <= {"errors.c", "store_table.c"}
    callers_of_decide = {name for name, needs in graph.items() if "store_decide.c" in needs}
    # memory.c's type, and the one-call check, which asks the store as its decide() does
    assert callers_of_decide == {"memory.c", "fast_check.c"}
