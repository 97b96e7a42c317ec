"""The algorithm registry and the contract's numbers, held to one definition.

docs/architecture.md's checklist for adding an algorithm is enforced here:
every registry entry has its Lua script, its C implementation in the store,
its Python module and a reference model entry (the differential tests walk
the registry by themselves). And the numbers of csrc/contract.h, the one source of the
contract's constants, are the numbers every other language states: Python
reads them from the C module, the scripts name every copy they hold.
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
from moderato.backends.memory import MemoryBackend
from moderato.plans import Plan
from moderato.scripts import SCRIPT_NAMES, load_script, scripts_dir

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
NOW_MS = 1_700_000_000_000


def contract() -> dict[str, int]:
    """``#define ACCEL_<NAME> <digits>`` of csrc/contract.h, by NAME."""
    text = (CSRC / "contract.h").read_text()
    found = re.findall(r"^#define ACCEL_(\w+) (\d+)\s*$", text, re.M)
    return {name: int(value) for name, value in found}


def distinctive(numbers: dict[str, int]) -> dict[int, set[str]]:
    """The numbers long enough to be found by their digits alone (5 or more), by value."""
    by_value: dict[int, set[str]] = {}
    for name, value in numbers.items():
        if value >= 10_000:
            by_value.setdefault(value, set()).add(name)
    return by_value


def lua_code_lines(text: str) -> list[str]:
    """The lines of a script without comments, block comments blanked (the scripts
    use '--' in no string)."""
    blanked = re.sub(
        r"--\[(=*)\[.*?\]\1\]", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S
    )
    return [line.split("--", 1)[0] for line in blanked.split("\n")]


def lua_copies() -> dict[tuple[str, str], int]:
    """Every ``local NAME = <digits>`` of the scripts whose NAME is a contract number."""
    numbers = contract()
    copies = {}
    for path in sorted(scripts_dir().glob("*.lua")):
        for name, value in re.findall(r"^\s*local (\w+) = (\d+)\b", path.read_text(), re.M):
            if name in numbers:
                copies[path.name, name] = int(value)
    return copies


# -- the contract's numbers --------------------------------------------------------------------


def test_the_contract_header_defines_every_number_once_and_lists_it() -> None:
    numbers = contract()
    assert numbers == {
        "SCALE": 1000,
        "MAX_POLICIES": 16,
        "MAX_WINDOW_S": 86_400,
        "MAX_LONG_WINDOW_S": 3600 * 86_400,
        "MAX_LIMIT": 9_007_199_254,
        "MAX_CAPACITY_SCALED": 9_007_199_254_000,
        "MAX_SAFE_INTEGER": 2**53,
        "MAX_STATE_TIME_MS": 2**52,
        "MAX_NOW_MS": 9 * 10**12,
        "ACCRUAL_EXACT_WINDOW_MS": 94_906_266,
        "GCRA_MAX_WINDOW_S": 3_599_627,
        "MAX_RESET_KEYS": 256,
        "BUCKET_EXPIRY_MARGIN_MS": 60_000,
        "DRAINED_EXPIRY_MARGIN_MS": 1000,
        "LOG_TOTAL_DIGITS": 16,
    }
    text = (CSRC / "contract.h").read_text()
    listed = re.findall(r"^\s+X\((\w+)\)", text, re.M)
    assert sorted(listed) == sorted(numbers)  # module.c exports the list


def test_the_contract_numbers_hold_what_they_promise() -> None:
    n = contract()
    safe = n["MAX_SAFE_INTEGER"]
    assert n["MAX_CAPACITY_SCALED"] == n["MAX_LIMIT"] * n["SCALE"]
    assert n["MAX_CAPACITY_SCALED"] * 1000 <= safe  # times a permille weight
    assert len(str(safe)) == n["LOG_TOTAL_DIGITS"]  # a running total up to 2^53
    # the buckets' accrual: window_ms * (window_ms - 1) within 2^53, the largest such
    window_ms = n["ACCRUAL_EXACT_WINDOW_MS"]
    assert window_ms * (window_ms - 1) <= safe < (window_ms + 1) * window_ms
    # GCRA: now + 2 windows + 1, in microseconds, within 2^53 until MAX_NOW_MS
    now_us = n["MAX_NOW_MS"] * 1000
    window_s = n["GCRA_MAX_WINDOW_S"]
    assert now_us + 2 * window_s * 10**6 + 1 <= safe < now_us + 2 * (window_s + 1) * 10**6 + 1
    # reset takes every algorithm's base keys of one rate at once
    assert n["MAX_RESET_KEYS"] == n["MAX_POLICIES"] * 16 >= n["MAX_POLICIES"] * len(ALGORITHMS)


def test_the_c_module_exports_every_number() -> None:
    for name, value in contract().items():
        assert getattr(_accel, name) == value, name


def test_python_reads_the_contract_from_the_c_module() -> None:
    numbers = contract()
    for name in ("SCALE", "MAX_LIMIT", "MAX_WINDOW_S", "MAX_LONG_WINDOW_S"):
        assert getattr(policy, name) == numbers[name], name
    # and spells none of them itself (a number reads as its digits, underscores or not;
    # 86,400 is also the seconds of a day, a unit the grammar and messages use)
    by_value = distinctive(numbers)
    del by_value[86_400]
    for path in sorted((ROOT / "moderato").rglob("*.py")):
        for line_number, line in enumerate(path.read_text().splitlines(), 1):
            for digits in re.findall(r"(?<![\w.])\d[\d_]*(?![\w.])", line):
                value = int(digits.replace("_", ""))
                assert value not in by_value, (path.name, line_number, by_value[value])


def test_the_test_references_state_the_contract() -> None:
    """The pure-Python twins keep their own copies, on purpose: each is held to contract.h."""
    numbers = contract()
    checked = 0
    for module in (accel_reference, model):
        for name, value in numbers.items():
            if hasattr(module, name):
                assert getattr(module, name) == value, (module.__name__, name)
                checked += 1
    assert checked >= 15


def test_lua_names_every_copy_of_the_contract() -> None:
    numbers = contract()
    copies = lua_copies()
    for (script, name), value in copies.items():
        assert value == numbers[name], (script, name)
    assert set(copies) == {
        ("prelude.lua", "MAX_SAFE_INTEGER"),
        ("prelude.lua", "MAX_CAPACITY_SCALED"),
        ("prelude.lua", "MAX_WINDOW_S"),
        ("prelude.lua", "MAX_POLICIES"),
        ("prelude.lua", "MAX_STATE_TIME_MS"),
        ("prelude.lua", "MAX_LONG_WINDOW_S"),
        ("prelude.lua", "ACCRUAL_EXACT_WINDOW_MS"),
        ("prelude.lua", "GCRA_MAX_WINDOW_S"),
        ("reset.lua", "MAX_LONG_WINDOW_S"),
        ("reset.lua", "MAX_RESET_KEYS"),
        ("token_bucket.lua", "BUCKET_EXPIRY_MARGIN_MS"),
        ("gcra.lua", "DRAINED_EXPIRY_MARGIN_MS"),
        ("leaky_bucket.lua", "DRAINED_EXPIRY_MARGIN_MS"),
        ("sliding_log.lua", "LOG_TOTAL_DIGITS"),
    }
    # A number written as digits where a named local would cost an upvalue names
    # its contract number on its line (in a comment), so that it is found here.
    by_value = distinctive(numbers)
    unnamed = []
    for path in sorted(scripts_dir().glob("*.lua")):
        text = path.read_text()
        for line_number, (line, code) in enumerate(zip(text.split("\n"), lua_code_lines(text)), 1):
            for digits in re.findall(r"(?<![\w.])\d+(?![\w.])", code):
                names = by_value.get(int(digits), set())
                if names and not any(re.search(rf"\b{name}\b", line) for name in names):
                    unnamed.append((path.name, line_number, digits))
    assert unnamed == []


def test_c_spells_the_contract_only_in_contract_h() -> None:
    """Elsewhere in csrc/ a number is its ACCEL_ name (ACCEL_TEXT() in a message); no
    file defines a name of its own for one."""
    numbers = contract()
    by_value = distinctive(numbers)
    del by_value[86_400]  # also the seconds of a day (rate.c's unit)
    alias = re.compile(rf"^#define (?:ACCEL_)?({'|'.join(numbers)})\b", re.M)
    for path in sorted(CSRC.glob("*.[ch]")):
        if path.name == "contract.h":
            continue
        text = path.read_text()
        assert alias.findall(text) == [], path.name
        for line_number, line in enumerate(text.splitlines(), 1):
            for digits in re.findall(r"(?<![\w.])\d+(?![\w.])", line):
                assert int(digits) not in by_value, (path.name, line_number, digits)


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
    # its own file, ending in its registry entry, and named on store_algorithms.h's list
    own = CSRC / f"store_{name}.c"
    last_line = own.read_text().rstrip().splitlines()[-1]
    assert last_line.startswith(f"STORE_ALGORITHM({name}, ")
    algorithms_h = (CSRC / "store_algorithms.h").read_text()
    names = re.search(r"STORE_ALGORITHM_NAMES\(X\)\s*\\\n(.*)\n", algorithms_h)
    assert names is not None and f"X({name})" in names.group(1).split()
    # every step of it, its argument parsing included, is defined there alone
    for path in CSRC.glob("*.c"):
        defines = re.findall(rf"^{name}_\w+\(", path.read_text(), re.M)
        assert bool(defines) == (path == own), path.name


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_has_a_reference_model_and_a_behaviour_file(name: str) -> None:
    # tests/test_differential.py is parametrized over the registry, so the model is all
    # an entry needs to be held against it on both backends
    assert name in model.DECIDERS
    assert (ROOT / "tests" / f"test_{name}.py").is_file()


def test_key_tags_and_suffixes_are_distinct_and_reset_knows_every_suffix() -> None:
    tags = [algorithm.key_tag for algorithm in ALGORITHMS.values()]
    assert len(set(tags)) == len(tags)
    for algorithm in ALGORITHMS.values():
        assert algorithm.state_suffixes
        assert set(algorithm.state_suffixes) <= set(RESET_SUFFIXES)


async def test_both_backends_reset_every_suffix_the_registry_names() -> None:
    """The suffixes live in the registry alone: reset.lua and the C store take them as
    arguments (the store's reset has no list of its own)."""
    assert '":bucket"' not in (CSRC / "memory.c").read_text()
    backend = MemoryBackend(clock=lambda: NOW_MS)
    base = b"m:tb:{t:s:i}:60"
    index = NOW_MS // 60_000
    keys = [base, *(base + suffix.encode() for suffix in RESET_SUFFIXES if suffix != WINDOW_INDEX)]
    keys += [b"%s:%d" % (base, index), b"%s:%d" % (base, index - 1)]
    for key in keys:
        backend.store.load(key, 1, -1)
    backend.store.load(base + b":other", 1, -1)
    assert await backend.reset([base], [60]) == len(keys) == 2 + len(RESET_SUFFIXES)
    assert list(backend.store.dump(NOW_MS)) == [base + b":other"]


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
