"""The algorithm registry and the contract's numbers, held to one definition.

docs/architecture.md's checklist for adding an algorithm is enforced here:
every registry entry has its Lua script, its C implementation in the store,
its Python module, a reference model entry and differential tests against
that model. And the
numbers of csrc/contract.h, the one source of the contract's constants, are
the numbers every other language states.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import accel_reference
import pytest
import reference_model as model

from moderato import _accel, policy
from moderato.algorithms import ALGORITHMS, RESET_SUFFIXES, WINDOW_INDEX
from moderato.plans import Plan
from moderato.scripts import SCRIPT_NAMES, load_script, scripts_dir

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
NOW_MS = 1_700_000_000_000


def contract() -> dict[str, int]:
    """``#define ACCEL_<NAME> <integer>`` of csrc/contract.h, by NAME."""
    text = (CSRC / "contract.h").read_text()
    found = re.findall(r"^#define ACCEL_(\w+) (\d+)(?:LL)?\s*$", text, re.M)
    return {name: int(value) for name, value in found}


def lua_constants(name: str) -> dict[str, int]:
    text = (scripts_dir() / name).read_text()
    found = re.findall(r"^\s*local (MAX_\w+) = (\d+)", text, re.M)
    return {name: int(value) for name, value in found}


# -- the contract's numbers --------------------------------------------------------------------


def test_the_contract_header_defines_every_number() -> None:
    assert contract() == {
        "MAX_POLICIES": 16,
        "MAX_WINDOW_S": 86_400,
        "MAX_LONG_WINDOW_S": 3600 * 86_400,
        "MAX_LIMIT": 9_007_199_254,
        "SCALE": 1000,
        "MAX_SCALED": 2**53,
    }


def test_the_c_module_exports_the_contract() -> None:
    numbers = contract()
    for name in ("MAX_POLICIES", "MAX_WINDOW_S", "MAX_LIMIT", "MAX_SCALED"):
        assert getattr(_accel, name) == numbers[name]


def test_python_states_the_contract() -> None:
    numbers = contract()
    assert (
        numbers["SCALE"],
        numbers["MAX_LIMIT"],
        numbers["MAX_WINDOW_S"],
    ) == (policy.SCALE, policy.MAX_LIMIT, policy.MAX_WINDOW_S)
    for name in ("MAX_POLICIES", "MAX_WINDOW_S", "MAX_LIMIT", "MAX_SCALED"):
        assert getattr(accel_reference, name) == numbers[name]


def test_lua_states_the_contract() -> None:
    numbers = contract()
    prelude = lua_constants("prelude.lua")
    assert prelude["MAX_SAFE_INTEGER"] == numbers["MAX_SCALED"]
    assert prelude["MAX_CAPACITY_SCALED"] == numbers["MAX_LIMIT"] * numbers["SCALE"]
    assert prelude["MAX_WINDOW_S"] == numbers["MAX_WINDOW_S"]
    assert prelude["MAX_POLICIES"] == numbers["MAX_POLICIES"]
    assert prelude["MAX_LONG_WINDOW_S"] == numbers["MAX_LONG_WINDOW_S"]
    reset = lua_constants("reset.lua")
    assert reset["MAX_WINDOW_S"] == numbers["MAX_LONG_WINDOW_S"]  # reset takes any window
    # reset takes every algorithm's base keys of one rate at once
    assert reset["MAX_KEYS"] == numbers["MAX_POLICIES"] * 16 >= len(ALGORITHMS)


def test_the_store_states_the_contract() -> None:
    """The C store's own names for the contract's numbers derive from contract.h
    or equal it; none restates a number differently."""
    numbers = contract()
    expected = {
        "MAX_SAFE_INTEGER": numbers["MAX_SCALED"],
        "MAX_CAPACITY_SCALED": numbers["MAX_LIMIT"] * numbers["SCALE"],
        "MAX_WINDOW_S": numbers["MAX_WINDOW_S"],
        "MAX_POLICIES": numbers["MAX_POLICIES"],
    }
    seen = 0
    for path in sorted(CSRC.glob("*.[ch]")):
        if path.name == "contract.h":
            continue
        for name, value in re.findall(
            r"^#define (\w+) (.+?)\s*(?:/\*.*)?$", path.read_text(), re.M
        ):
            if name not in expected:
                continue
            seen += 1
            literal = re.fullmatch(r"\(?(\d+)LL\)?", value)
            if literal:
                assert int(literal.group(1)) == expected[name], (path.name, name)
            else:
                assert "ACCEL_" in value, (path.name, name, value)
    assert seen >= 2


# -- adding an algorithm: the checklist ---------------------------------------------------------


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_has_a_python_module_holding_its_entry(name: str) -> None:
    module = importlib.import_module(f"moderato.algorithms.{name}")
    assert module.ALGORITHM is ALGORITHMS[name]
    assert (ROOT / "moderato" / "algorithms" / f"{name}.py").is_file()
    # one line of the registry
    registry = (ROOT / "moderato" / "algorithms" / "__init__.py").read_text()
    assert registry.count(f"    {name}.ALGORITHM,\n") == 1


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_has_a_script(name: str) -> None:
    algorithm = ALGORITHMS[name]
    assert (scripts_dir() / f"{name}.lua").is_file()
    assert name in SCRIPT_NAMES
    source = load_script(name).source.decode()
    live_suffix = algorithm.state_suffixes[0]
    if live_suffix != WINDOW_INDEX:  # its state lives where reset looks for it
        assert f"'{live_suffix}'" in source


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_has_a_c_implementation(name: str) -> None:
    algorithm = ALGORITHMS[name]
    plan = Plan(policy.policy_for("5/minute"), algorithm)
    store = _accel.MemoryStore(16)
    reply = store.decide(name, [b"k:60"], (1000, 1, *plan.script_args), NOW_MS)
    assert reply[:3] == [1, 0, 4000]
    # its own file, ending in its registry entry, and named on store.h's list
    last_line = (CSRC / f"store_{name}.c").read_text().rstrip().splitlines()[-1]
    assert last_line.startswith(f"STORE_ALGORITHM({name}, ")
    names = re.search(r"STORE_ALGORITHM_NAMES\(X\)\s*\\\n(.*)\n", (CSRC / "store.h").read_text())
    assert names is not None and f"X({name})" in names.group(1).split()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_has_a_reference_model_and_differential_tests(name: str) -> None:
    assert name in model.DECIDERS
    lua_differential = (TESTS / "test_lua_differential.py").read_text()
    assert f"async def test_{name}_matches_model(" in lua_differential
    assert f"async def test_{name}_matches_model_from_any_state(" in lua_differential
    # the store's differential tests walk the registry itself
    memory_differential = (TESTS / "test_memory_differential.py").read_text()
    assert "ALGORITHM_NAMES = tuple(ALGORITHMS)" in memory_differential


def test_key_tags_and_suffixes_are_distinct_and_reset_knows_every_suffix() -> None:
    tags = [algorithm.key_tag for algorithm in ALGORITHMS.values()]
    assert len(set(tags)) == len(tags)
    for algorithm in ALGORITHMS.values():
        assert algorithm.state_suffixes
        assert set(algorithm.state_suffixes) <= set(RESET_SUFFIXES)
    c_sources = "".join(path.read_text() for path in CSRC.glob("*.c"))
    for suffix in RESET_SUFFIXES:  # the C store's reset deletes the same keys
        if suffix != WINDOW_INDEX:
            assert f'"{suffix}"' in c_sources, suffix


def test_the_registry_names_and_tags() -> None:
    rows = [(a.name, a.key_tag) for a in ALGORITHMS.values()]
    assert rows == [
        ("fixed_window", "fw"),
        ("token_bucket", "tb"),
        ("sliding_window", "sw"),
        ("gcra", "gc"),
        ("sliding_log", "sl"),
        ("leaky_bucket", "lb"),
    ]
    # the C store lists its algorithms in the registry's order
    assert tuple(ALGORITHMS) == _accel.MEMORY_ALGORITHMS
