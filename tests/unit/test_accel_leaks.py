"""Reference and memory leak checks of moderato._accel.

Every function is called 100,000 times on each of its success and error
paths; the reference counts of its arguments (and of their items) must not
move, and the process's resident memory must not grow by more than a
couple of pages' worth of allocator noise.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from typing import Any, Callable

import pytest

from moderato import _accel
from moderato.results import CheckResult, PolicyState

CALLS = 100_000
WARM_UP_CALLS = 2_000
# A leak of one small object per call is 100,000 objects: several MB.
RSS_GROWTH_BOUND_BYTES = 2 << 20

SHA = "e0e1f9fabfc9d4800c877a703b823ac0578ff831"
SECRET = b"0123456789abcdef"
NOW_MS = 1_700_000_000_000
RESULT_CLASSES = (CheckResult, PolicyState)


def text(value: str) -> str:
    """A fresh, non-interned copy: its reference count is this test's alone."""
    return "".join(list(value))


CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
    ("parse_rate", _accel.parse_rate, (text("10/second ; 5 per 10 minutes;1000/day"),), {}),
    ("parse_rate-unknown-unit", _accel.parse_rate, (text("10/fortnight"),), {}),
    ("parse_rate-non-ascii", _accel.parse_rate, (text("10/minut\u00e9"),), {}),
    ("parse_rate-duplicate", _accel.parse_rate, (text("1/minute;2/60 seconds"),), {}),
    ("parse_rate-type", _accel.parse_rate, (b"10/minute",), {}),
    (
        "build_keys",
        _accel.build_keys,
        (text("app:rl"), "fw", text("t\u00fc"), b"s", text("x" * 100), [1, 60, 86400]),
        {},
    ),
    (
        "build_keys-secret",
        _accel.build_keys,
        (b"app", b"tb", "", text("api"), text("10.0.0.1"), (60,)),
        {"secret": SECRET},
    ),
    ("build_keys-prefix", _accel.build_keys, (text("my app"), "fw", "", "", "", [1]), {}),
    (
        "build_keys-surrogate",
        _accel.build_keys,
        ("p", "fw", "", "", text("id\ud800"), [1], None),
        {},
    ),
    ("build_keys-window", _accel.build_keys, ("p", "fw", "", "", "", [1, 2**70]), {}),
    ("build_keys-secret-type", _accel.build_keys, ("p", "fw", "", "", "", [1], "s"), {}),
    ("build_keys-arity", _accel.build_keys, ("p", "fw"), {"secret": SECRET}),
    (
        "build_keys-burst",
        _accel.build_keys,
        ("p", "tb", "", "", text("id"), [1, 60]),
        {"burst": 50},
    ),
    ("build_keys-burst-range", _accel.build_keys, ("p", "tb", "", "", "", [1]), {"burst": 2**70}),
    (
        "key_pattern",
        _accel.key_pattern,
        (text("app:rl"), text("t"), b"s*", text("x" * 100)),
        {"secret": SECRET},
    ),
    ("key_pattern-prefix", _accel.key_pattern, (text("app*"), "", "", ""), {}),
    ("key_pattern-secret", _accel.key_pattern, ("p", "", "", text("id"), b"short"), {}),
    ("key_slot", _accel.key_slot, (text("app:fw:{t:s:i}:60"),), {}),
    ("key_slot-surrogate", _accel.key_slot, (text("{\udc00}"),), {}),
    (
        "encode_command",
        _accel.encode_command,
        (
            text("SET"),
            b"key",
            bytearray(b"value"),
            memoryview(b"view"),
            12345,
            -(2**100),
            text("\u00e9"),
        ),
        {},
    ),
    ("encode_command-bool", _accel.encode_command, (text("SET"), b"k", True), {}),
    ("encode_command-surrogate", _accel.encode_command, (b"k", text("\ud800")), {}),
    (
        "encode_command-strided",
        _accel.encode_command,
        (bytearray(b"k"), memoryview(b"abcd")[::2]),
        {},
    ),
    (
        "encode_evalsha",
        _accel.encode_evalsha,
        (SHA, [b"k1", text("k2")], (1000, 1, 5000, 60, bytearray(b"x"))),
        {},
    ),
    ("encode_evalsha-sha", _accel.encode_evalsha, (text("z" * 40), [], []), {}),
    ("encode_evalsha-key", _accel.encode_evalsha, (SHA, [b"k", None], [1]), {}),
    (
        "decode_decision",
        _accel.decode_decision,
        ([0, 1, 0, 500, NOW_MS, 7, -1, -1], 2),
        {},
    ),
    ("decode_decision-bool", _accel.decode_decision, ([1, 0, 1, True, 1], 1), {}),
    ("decode_decision-huge", _accel.decode_decision, ([1, 0, 2**80, 0, 1], 1), {}),
    ("decode_decision-length", _accel.decode_decision, ([1, 0, 1, 0], 1), {}),
    ("decode_decision-deciding", _accel.decode_decision, ([1, 0, 5, 0, 1, 4, 0, 1], 2), {}),
    ("decode_decision-policies", _accel.decode_decision, ([1, 0, 1, 0, 1], True), {}),
    (
        "check_result",
        _accel.check_result,
        ([0, 1, 0, 500, NOW_MS, 7000, -1, -1], (*RESULT_CLASSES, "r", "a", ((10, 1), (9, 60)))),
        {},
    ),
    (
        "check_result-reply",
        _accel.check_result,
        ([1, 0, 1, 5, 1], (*RESULT_CLASSES, "r", "a", ((10, 1),))),
        {},
    ),
    ("check_result-plan", _accel.check_result, ([1, 0, 1, 0, 1], (*RESULT_CLASSES, "r")), {}),
    (
        "check_result-burst",
        _accel.check_result,
        ([1, 0, 49000, 0, NOW_MS], (*RESULT_CLASSES, text("r"), "a", ((50, 1, 2**70),))),
        {},
    ),
    ("PolicyState", PolicyState, (10, 1, text("x"), None, 1.5), {}),
    (
        "CheckResult",
        CheckResult,
        (True, 10, 9, 0, 1.5, 1, text("r")),
        {"algorithm": text("a"), "shadow_denied": True},
    ),
    ("CheckResult-missing", CheckResult, (True, 10), {"rate": text("r")}),
    ("CheckResult-unknown", CheckResult, (), {"nope": text("x")}),
    ("CheckResult-repr", repr, (CheckResult(True, 1, 1, 0, 1.0, 1, "r", "a"),), {}),
    ("CheckResult-hash", hash, (PolicyState(1, 1, 1, 0, 1.0),), {}),
]


def watched(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The arguments and the items of those that are lists or tuples, but not
    the interpreter's shared small ints and singletons, whose counts other code
    moves too."""
    objects = [*args, *kwargs.values()]
    for value in list(objects):
        if isinstance(value, (list, tuple)):
            objects.extend(value)
    return [
        value
        for value in objects
        if not (value is None or (isinstance(value, int) and -5 <= value <= 256))
    ]


def call(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], times: int
) -> None:
    for _ in range(times):
        with contextlib.suppress(TypeError, ValueError):
            function(*args, **kwargs)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize(
    ("function", "args", "kwargs"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_no_leaks(
    function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    objects = watched(args, kwargs)
    call(function, args, kwargs, WARM_UP_CALLS)
    gc.collect()
    refcounts = [sys.getrefcount(value) for value in objects]
    rss_before = rss_bytes()

    call(function, args, kwargs, CALLS)

    gc.collect()
    # A leaked reference per call would add CALLS references. Shared singletons
    # ('' and small ints before Python 3.12 made them immortal) also move by a few
    # when anything else in the process touches them, so only growth that could
    # come from these calls counts.
    grown = [sys.getrefcount(value) - before for value, before in zip(objects, refcounts)]
    assert all(abs(delta) < CALLS // 100 for delta in grown), grown
    assert rss_bytes() - rss_before < RSS_GROWTH_BOUND_BYTES
