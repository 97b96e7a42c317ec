"""Tests of moderato._accel against its contract (docs/internals.md).

Fixed cases run against both the C module and its pure-Python twin
(tests/accel_reference.py); hypothesis then feeds both the same generated,
often hostile, input and requires the same result or the same exception type.
"""

from __future__ import annotations

import array
import binascii
import dataclasses
import enum
import fnmatch
import hashlib
import hmac
import importlib.machinery
import random
import sys
import types
from typing import Any, Callable

import accel_reference as reference
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import moderato._accel as accel
from moderato.results import CheckResult, PolicyState

IMPLEMENTATIONS = [pytest.param(accel, id="c"), pytest.param(reference, id="python")]

MB = 1 << 20
SHA = "e0e1f9fabfc9d4800c877a703b823ac0578ff831"
SECRET = b"0123456789abcdef"
GRAMMAR = (
    "expected '<count>/<unit>', '<count> per <unit>' or '<count>/<n> <units>' with unit "
    "second, minute, hour, day, week, month (30 days) or year (360 days) (singular or "
    "plural) or s, sec, m, min, h, hr, d, w, wk, several joined by ';', ',' or '|'"
)

# Every property: more examples than the default, and no deadline (inputs reach 1 MB).
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> types.ModuleType:
    module: types.ModuleType = request.param
    return module


def outcome(function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """The result, or the exact type of a TypeError or ValueError; anything
    else (a SystemError, a crash) fails the test."""
    try:
        return ("returned", function(*args, **kwargs))
    except (TypeError, ValueError) as error:
        return ("raised", type(error))


def same_outcome(name: str, *args: Any, **kwargs: Any) -> None:
    expected = outcome(getattr(reference, name), *args, **kwargs)
    assert outcome(getattr(accel, name), *args, **kwargs) == expected


def released_memoryview() -> memoryview:
    view = memoryview(b"released")
    view.release()
    return view


def crc16_slot(data: bytes) -> int:
    return binascii.crc_hqx(data, 0) % 16384


def sha_part(data: bytes) -> bytes:
    return b"~" + hashlib.sha256(data).hexdigest()[:32].encode()


def hmac_part(secret: bytes, data: bytes) -> bytes:
    return b"!" + hmac.new(secret, data, hashlib.sha256).hexdigest()[:32].encode()


# -- the module --------------------------------------------------------------------


def test_accel_is_a_compiled_extension() -> None:
    assert accel.__file__ is not None
    assert accel.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert isinstance(accel.parse_rate, types.BuiltinFunctionType)


def test_constants_match_the_contract() -> None:
    assert accel.MAX_POLICIES == reference.MAX_POLICIES == 16
    assert accel.MAX_WINDOW_S == reference.MAX_WINDOW_S == 86_400
    assert accel.MAX_LIMIT == reference.MAX_LIMIT == 9_007_199_254
    assert accel.MAX_SAFE_INTEGER == reference.MAX_SAFE_INTEGER == 2**53


def test_signatures_are_documented() -> None:
    assert accel.parse_rate.__text_signature__ == "($module, text, /)"
    assert accel.build_keys.__text_signature__ == (
        "($module, prefix, algorithm, tenant, scope, identity, windows_s, /,\n"
        "           secret=None, *, burst=None)"
    )
    assert accel.key_pattern.__text_signature__ == (
        "($module, prefix, tenant, scope, identity, /, secret=None)"
    )
    assert accel.encode_evalsha.__text_signature__ == "($module, sha, keys, args, /)"
    assert accel.decode_decision.__text_signature__ == "($module, reply, policies, /)"


# -- parse_rate ----------------------------------------------------------------------

VALID_RATES = [
    ("10/second", ((10, 1),)),
    ("100/minute", ((100, 60),)),
    ("1000/hour", ((1000, 3600),)),
    ("10000/day", ((10000, 86400),)),
    ("100 per minute", ((100, 60),)),
    ("10/5 minutes", ((10, 300),)),
    ("  10 / Minute  ", ((10, 60),)),
    ("10/second;1000/day", ((10, 1), (1000, 86400))),
    ("2/2 seconds", ((2, 2),)),
    ("1/second", ((1, 1),)),
    ("9007199254/day", ((9007199254, 86400),)),
    ("010/minute", ((10, 60),)),
    ("5/10seconds", ((5, 10),)),
    ("10\tper\tHOURS", ((10, 3600),)),
    ("3 per 1 day", ((3, 86400),)),
    ("1/86400 seconds", ((1, 86400),)),
    ("1/24 hours", ((1, 86400),)),
    ("5/minute ; 50 / hour;500 per DAY", ((5, 60), (50, 3600), (500, 86400))),
    ("7/0001 minute", ((7, 60),)),
    ("10 PER minute", ((10, 60),)),
    ("10 Per 5 Minutes", ((10, 300),)),
    # Longer windows: limits' month (30 days) and year (360 days), throttled-py's week.
    ("1000/month", ((1000, 2_592_000),)),
    ("1/year", ((1, 31_104_000),)),
    ("5/2 days", ((5, 172_800),)),
    ("3/week", ((3, 604_800),)),
    ("2 per 3 MONTHS", ((2, 7_776_000),)),
    ("1/10 years", ((1, 311_040_000),)),
    ("1/3600 days", ((1, 311_040_000),)),
    ("1/311040000 seconds", ((1, 311_040_000),)),
    ("1/86401 seconds", ((1, 86_401),)),
    ("9007199254/year", ((9_007_199_254, 31_104_000),)),
    # throttled-py's abbreviations.
    ("5/s", ((5, 1),)),
    ("5/sec", ((5, 1),)),
    ("5/secs", ((5, 1),)),
    ("5/m", ((5, 60),)),
    ("5/Min", ((5, 60),)),
    ("5/mins", ((5, 60),)),
    ("5/h", ((5, 3600),)),
    ("5/hr", ((5, 3600),)),
    ("5/hrs", ((5, 3600),)),
    ("5/d", ((5, 86_400),)),
    ("5/w", ((5, 604_800),)),
    ("5/wk", ((5, 604_800),)),
    ("5/wks", ((5, 604_800),)),
    ("5 per weeks", ((5, 604_800),)),
    ("5/2m", ((5, 120),)),
    # ',' and '|' join policies as ';' does.
    ("5/minute,10/hour", ((5, 60), (10, 3600))),
    (
        "5/minute , 10/hour | 100/day ; 1000/month",
        ((5, 60), (10, 3600), (100, 86_400), (1000, 2_592_000)),
    ),
]

INVALID_RATES = [
    "0/minute",
    "9007199255/minute",
    "99999999999999999999999999/minute",
    "1/3601 days",
    "1/311040001 seconds",
    "1/11 years",
    "1/0 minutes",
    "1/2 fortnights",
    "1/ms",
    "1/mon",
    "1/yr",
    "1/y",
    "10/minute,",
    "10/minute|",
    ",10/minute",
    "10/minute,,5/second",
    "1,000/day",
    "1/day;1/d",
    "1/week,7/7 days",
    "1/month|30/30 days",
    "1/minute;2/60 seconds",
    "1/hour;1/60 minutes",
    "10per minute",
    "10 perminute",
    "10/fortnight",
    "",
    "   ",
    ";",
    "10/",
    "/minute",
    "-1/minute",
    "+1/minute",
    "1.5/minute",
    "1e3/minute",
    "1_000/minute",
    "10/minute;",
    ";10/minute",
    "10/minute;;5/second",
    "10/minute x",
    "10/minute\n",
    "10/\nminute",
    "10/minute\x00",
    "\u0661\u0660/minute",
    "10/minut\u00e9",
    "10/-5 minutes",
    "10 / 5 / minutes",
    "10//minute",
]


@pytest.mark.parametrize(("text", "expected"), VALID_RATES)
def test_parse_rate_accepts(impl: Any, text: str, expected: tuple[tuple[int, int], ...]) -> None:
    assert impl.parse_rate(text) == expected


@pytest.mark.parametrize("text", INVALID_RATES)
def test_parse_rate_rejects(impl: Any, text: str) -> None:
    with pytest.raises(ValueError):
        impl.parse_rate(text)


@pytest.mark.parametrize("text", [b"10/minute", 10, None, ["10/minute"]])
def test_parse_rate_wants_str(impl: Any, text: object) -> None:
    with pytest.raises(TypeError):
        impl.parse_rate(text)


def test_parse_rate_takes_up_to_16_policies(impl: Any) -> None:
    sixteen = ";".join(f"{i}/{i} seconds" for i in range(1, 17))
    assert impl.parse_rate(sixteen) == tuple((i, i) for i in range(1, 17))
    with pytest.raises(ValueError):
        impl.parse_rate(sixteen + ";17/17 seconds")


def test_parse_rate_message_names_input_reason_and_grammar() -> None:
    with pytest.raises(ValueError) as raised:
        accel.parse_rate("10/fortnight")
    assert str(raised.value) == f"invalid rate '10/fortnight': unknown unit 'fortnight'; {GRAMMAR}"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no rate given"),
        ("0/minute", "count '0' is out of range 1..9007199254"),
        (
            "1/3601 days",
            "window '3601 days' is longer than 10 years (3600 days, 311040000 seconds)",
        ),
        ("1/999999999999 days", "multiple '999999999999' is out of range 1..311040000"),
        ("1/d,2/24 hours", "policies 1 and 2 both have a window of 86400 seconds"),
        ("1/2 ms", "unknown unit 'ms'"),
        ("1/minute;2/60 seconds", "policies 1 and 2 both have a window of 60 seconds"),
        ("10per minute", "'per' at offset 2 needs a blank on both sides"),
        ("1.5/minute", "expected '/' or ' per ' after the count at offset 1, found '.'"),
        (
            "10/",
            "expected a unit (second, minute, hour, day, week, month, year or an abbreviation)"
            " at offset 3, found the end",
        ),
        ("10/minute;", "policy 2: no rate given"),
        ("10/minute,", "policy 2: no rate given"),
        ("1/s|", "policy 2: no rate given"),
        (
            "5/second,10/minute x",
            "policy 2: expected ';', ',', '|' or the end after the unit at offset 19",
        ),
        (
            "10/minute\x00",
            "expected ';', ',', '|' or the end after the unit at offset 9, found '\\x00'",
        ),
        (
            "100/s burst 200",
            "'burst' at offset 6 is not part of a rate: give it beside the rate, burst=<n> (the"
            " token bucket, GCRA and leaky bucket take one)",
        ),
        ("1/day bursting", "'burst' at offset 6 is not part of a rate"),
        ("1/day x", "expected ';', ',', '|' or the end after the unit at offset 6, found 'x'"),
        ("1\u0660/minute", "non-ASCII character '\u0660' at offset 1"),
    ],
)
def test_parse_rate_messages(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as raised:
        accel.parse_rate(text)
    assert str(raised.value).startswith(f"invalid rate {text!r}: {reason}")
    assert str(raised.value).endswith(GRAMMAR)


def test_parse_rate_message_stays_short_for_huge_input() -> None:
    for text in ("9" * MB + "/minute", "10/" + "x" * MB, " " * MB + "\ud800"):
        with pytest.raises(ValueError) as raised:
            accel.parse_rate(text)
        message = str(raised.value)
        assert len(message) < 600
        assert "'..." in message


# -- build_keys ----------------------------------------------------------------------


def test_build_keys_layout(impl: Any) -> None:
    keys = impl.build_keys("myapp:ratelimit", "fw", "acme", "api", "1.2.3.4", (60, 3600))
    assert keys == [
        b"myapp:ratelimit:fw:{acme:api:1.2.3.4}:60",
        b"myapp:ratelimit:fw:{acme:api:1.2.3.4}:3600",
    ]


def test_build_keys_takes_bytes_like_str(impl: Any) -> None:
    as_str = impl.build_keys("p", "tb", "t\u00fc", "s", "id", [1])
    assert impl.build_keys(b"p", b"tb", "t\u00fc".encode(), b"s", b"id", [1]) == as_str


def test_build_keys_percent_encodes_unsafe_bytes(impl: Any) -> None:
    keys = impl.build_keys("p", "fw", "a b", "x:y{}", "\u00fc%~!\x00", [86400])
    assert keys == [b"p:fw:{a%20b:x%3Ay%7B%7D:%C3%BC%25%7E%21%00}:86400"]


def test_build_keys_keeps_safe_bytes(impl: Any) -> None:
    safe = "AZaz09._/@+=,-"
    assert impl.build_keys("p", "fw", safe, "", "", [5]) == [f"p:fw:{{{safe}::}}:5".encode()]


@pytest.mark.parametrize(
    ("component", "kept"),
    [
        (b"a" * 64, True),
        (b"a" * 65, False),
        (b"%" * 21 + b"a", True),  # 63 + 1 bytes encoded
        (b"%" * 21 + b"ab", False),  # 65
        (b"%" * 22, False),  # 66
        (b"\xff" * 1000, False),
    ],
)
def test_build_keys_hashes_components_past_64_bytes(
    impl: Any, component: bytes, kept: bool
) -> None:
    [key] = impl.build_keys("p", "fw", component, component, component, [1])
    encoded = reference._component(component)
    assert (encoded == sha_part(component)) is not kept
    assert key == b"p:fw:{%s:%s:%s}:1" % (encoded, encoded, encoded)


@pytest.mark.parametrize("size", [*range(22, 140), 1000, 4096, MB])
def test_build_keys_sha256_matches_hashlib(size: int) -> None:
    # Sizes around the 55, 56, 64 and 128-byte padding boundaries of SHA-256.
    component = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    [key] = accel.build_keys("p", "fw", component, "", "", [1])
    assert key == b"p:fw:{%s::}:1" % sha_part(component)


@pytest.mark.parametrize("secret_size", [16, 55, 63, 64, 65, 128, 1000])
@pytest.mark.parametrize("identity_size", [0, 1, 55, 56, 64, 119, 120, 1000])
def test_build_keys_hmac_matches_hmac_module(secret_size: int, identity_size: int) -> None:
    secret = bytes(range(7, 7 + secret_size % 249)) * (secret_size // 249 + 1)
    secret = secret[:secret_size]
    identity = b"\xab" * identity_size
    [key] = accel.build_keys("p", "fw", "", "", identity, [1], secret=secret)
    assert key == b"p:fw:{::%s}:1" % hmac_part(secret, identity)


def test_build_keys_burst_ends_every_key(impl: Any) -> None:
    """A burst policy's keys are its own: 'b' and the burst after the window."""
    keys = impl.build_keys("p", "tb", "t", "s", "id", (1, 60), burst=50)
    assert keys == [b"p:tb:{t:s:id}:1b50", b"p:tb:{t:s:id}:60b50"]
    assert impl.build_keys("p", "tb", "t", "s", "id", [1], SECRET, burst=None) == (
        impl.build_keys("p", "tb", "t", "s", "id", [1], SECRET)
    )
    [largest] = impl.build_keys("p", "tb", "", "", "", [311_040_000], burst=9_007_199_254)
    assert largest == b"p:tb:{::}:311040000b9007199254"


@pytest.mark.parametrize(
    ("burst", "error"),
    [(0, ValueError), (-1, ValueError), (9_007_199_255, ValueError), (2**64, ValueError),
     (True, TypeError), (5.0, TypeError), ("5", TypeError)],
)  # fmt: skip
def test_build_keys_rejects_bad_bursts(impl: Any, burst: object, error: type) -> None:
    with pytest.raises(error):
        impl.build_keys("p", "tb", "", "", "", [1], burst=burst)


def test_build_keys_burst_messages() -> None:
    with pytest.raises(TypeError, match=r"^build_keys\(\) burst must be int or None, not bool$"):
        accel.build_keys("p", "tb", "", "", "", [1], burst=True)
    with pytest.raises(ValueError, match=r"^build_keys\(\) burst must be 1\.\.9007199254, got 0$"):
        accel.build_keys("p", "tb", "", "", "", [1], burst=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'burst'"):
        accel.key_pattern("p", "", "", "", burst=5)  # type: ignore[call-arg]


def test_build_keys_secret_replaces_every_identity(impl: Any) -> None:
    keys = impl.build_keys("p", "fw", "t", "s", "10.0.0.1", (1, 60), SECRET)
    assert keys == impl.build_keys("p", "fw", "t", "s", "10.0.0.1", [1, 60], secret=SECRET)
    tag = hmac_part(SECRET, b"10.0.0.1")
    assert keys == [b"p:fw:{t:s:%s}:1" % tag, b"p:fw:{t:s:%s}:60" % tag]
    assert impl.build_keys("p", "fw", "t", "s", "10.0.0.1", (1,), None) == [
        b"p:fw:{t:s:10.0.0.1}:1"
    ]


def test_build_keys_bounds_key_size() -> None:
    [key] = accel.build_keys("p", "fw", "", "", "\u00e9" * MB, [60])
    assert len(key) < 400
    longest = accel.build_keys("p" * 128, "a" * 16, "%" * 21, "~" * 21, "!" * 21, [311040000])
    assert len(longest[0]) == 128 + 1 + 16 + 2 + 3 * 63 + 2 + 2 + 9
    assert len(longest[0]) <= 128 + 1 + 16 + 2 + 3 * 66 + 2 + 1 + 9


BAD_BUILD_KEYS = [
    # (prefix, algorithm, tenant, scope, identity, windows_s, secret), expected
    (("", "fw", "", "", "", [1]), ValueError),
    (("p" * 129, "fw", "", "", "", [1]), ValueError),
    (("my app", "fw", "", "", "", [1]), ValueError),
    (("p{x}", "fw", "", "", "", [1]), ValueError),
    (("\u00e9", "fw", "", "", "", [1]), ValueError),
    (("\ud800", "fw", "", "", "", [1]), ValueError),
    ((5, "fw", "", "", "", [1]), TypeError),
    ((bytearray(b"p"), "fw", "", "", "", [1]), TypeError),
    (("p", "", "", "", "", [1]), ValueError),
    (("p", "FW", "", "", "", [1]), ValueError),
    (("p", "a" * 17, "", "", "", [1]), ValueError),
    (("p", "f:w", "", "", "", [1]), ValueError),
    (("p", None, "", "", "", [1]), TypeError),
    (("p", "fw", 5, "", "", [1]), TypeError),
    (("p", "fw", "", None, "", [1]), TypeError),
    (("p", "fw", "", "", memoryview(b"x"), [1]), TypeError),
    (("p", "fw", "\ud800", "", "", [1]), ValueError),
    (("p", "fw", "", "", "x\udfff", [1]), ValueError),
    (("p", "fw", "", "", "", 60), TypeError),
    (("p", "fw", "", "", "", {60}), TypeError),
    (("p", "fw", "", "", "", ()), ValueError),
    (("p", "fw", "", "", "", [1] * 17), ValueError),
    (("p", "fw", "", "", "", [True]), TypeError),
    (("p", "fw", "", "", "", [60.0]), TypeError),
    (("p", "fw", "", "", "", ["60"]), TypeError),
    (("p", "fw", "", "", "", [0]), ValueError),
    (("p", "fw", "", "", "", [311_040_001]), ValueError),
    (("p", "fw", "", "", "", [-1]), ValueError),
    (("p", "fw", "", "", "", [2**64]), ValueError),
    (("p", "fw", "", "", "", [1], "x" * 16), TypeError),
    (("p", "fw", "", "", "", [1], bytearray(16)), TypeError),
    (("p", "fw", "", "", "", [1], b"x" * 15), ValueError),
    (("p", "fw", "", "", "", [1], False), TypeError),
    # The first bad argument decides: a value error before a type error.
    (("", "fw", 5, "", "", [1]), ValueError),
    (("p", "fw", 5, "", "", [0]), TypeError),
]


@pytest.mark.parametrize(("args", "error"), BAD_BUILD_KEYS)
def test_build_keys_rejects(impl: Any, args: tuple[object, ...], error: type) -> None:
    with pytest.raises(error):
        impl.build_keys(*args)


def test_build_keys_rejects_bad_calls(impl: Any) -> None:
    good = ("p", "fw", "", "", "", [1])
    with pytest.raises(TypeError):
        impl.build_keys(*good[:5])
    with pytest.raises(TypeError):
        impl.build_keys(*good, None, None)
    with pytest.raises(TypeError):
        impl.build_keys(*good, SECRET, secret=SECRET)
    with pytest.raises(TypeError):
        impl.build_keys(*good, salt=SECRET)
    with pytest.raises(TypeError):
        impl.build_keys(*good[:5], windows_s=[1])


def test_build_keys_messages() -> None:
    with pytest.raises(ValueError) as raised:
        accel.build_keys("my app", "fw", "", "", "", [1])
    assert str(raised.value) == (
        "build_keys() prefix may only hold A-Z a-z 0-9 _ . : -, got 'my app' "
        "(byte 2 is not allowed)"
    )
    with pytest.raises(TypeError, match=r"^build_keys\(\) windows_s\[1\] must be int, not bool$"):
        accel.build_keys("p", "fw", "", "", "", [1, True])
    with pytest.raises(ValueError, match=r"windows_s\[0\] must be 1\.\.311040000 seconds, got 0$"):
        accel.build_keys("p", "fw", "", "", "", [0])
    with pytest.raises(ValueError, match=r"windows_s\[0\] must be 1\.\.311040000 seconds, got "):
        accel.build_keys("p", "fw", "", "", "", [311040001])
    assert accel.build_keys("p", "fw", "", "", "", [311040000]) == [b"p:fw:{::}:311040000"]
    with pytest.raises(ValueError) as raised:
        accel.build_keys("p", "fw", "x" * MB + "\ud800", "", "", [1])
    assert str(raised.value).startswith(
        "build_keys() tenant is a str that cannot be encoded as UTF-8, got 'xxx"
    )
    assert len(str(raised.value)) < 400
    assert isinstance(raised.value.__cause__, UnicodeEncodeError)


def test_build_keys_messages_never_show_a_protected_identity_or_secret() -> None:
    with pytest.raises(ValueError) as raised:
        accel.build_keys("p", "fw", "", "", "alice\ud800", [1], SECRET)
    assert "alice" not in str(raised.value)
    with pytest.raises(ValueError) as raised:
        accel.build_keys("p", "fw", "", "", "", [1], b"hunter2")
    assert "hunter2" not in str(raised.value)
    assert "got 7 bytes" in str(raised.value)


# -- key_pattern ---------------------------------------------------------------------


def test_key_pattern_layout(impl: Any) -> None:
    assert impl.key_pattern("myapp:ratelimit", "acme", "api", "1.2.3.4") == (
        b"myapp:ratelimit:??:{acme:api:1.2.3.4}:*"
    )
    assert impl.key_pattern(b"p", b"", b"", b"") == b"p:??:{::}:*"


def test_key_pattern_escapes_glob_metacharacters(impl: Any) -> None:
    pattern = impl.key_pattern("p", "*", "?[", "]\\")
    assert pattern == b"p:??:{%2A:%3F%5B:%5D%5C}:*"


def test_key_pattern_uses_the_keys_tag(impl: Any) -> None:
    for secret in (None, SECRET):
        [key] = impl.build_keys("p", "sw", "t\u00fc", "x" * 70, "10.0.0.1", [60], secret)
        pattern = impl.key_pattern("p", "t\u00fc", "x" * 70, "10.0.0.1", secret=secret)
        assert pattern == b"p:??:" + key[key.index(b"{") : key.index(b"}") + 1] + b":*"


BAD_KEY_PATTERNS = [
    # (prefix, tenant, scope, identity, secret), expected
    (("", "", "", ""), ValueError),
    (("p*", "", "", ""), ValueError),
    ((None, "", "", ""), TypeError),
    (("p", 1, "", ""), TypeError),
    (("p", "", "\ud800", ""), ValueError),
    (("p", "", "", bytearray()), TypeError),
    (("p", "", "", "", "s" * 16), TypeError),
    (("p", "", "", "", b"short"), ValueError),
]


@pytest.mark.parametrize(("args", "error"), BAD_KEY_PATTERNS)
def test_key_pattern_rejects(impl: Any, args: tuple[object, ...], error: type) -> None:
    with pytest.raises(error):
        impl.key_pattern(*args)


def test_key_pattern_rejects_bad_calls(impl: Any) -> None:
    with pytest.raises(TypeError):
        impl.key_pattern("p", "", "")
    with pytest.raises(TypeError):
        impl.key_pattern("p", "", "", "", None, None)
    with pytest.raises(TypeError):
        impl.key_pattern("p", "", "", "", SECRET, secret=SECRET)
    with pytest.raises(TypeError):
        impl.key_pattern("p", "", "", "", windows_s=[1])


def test_key_pattern_messages_name_the_function() -> None:
    with pytest.raises(ValueError, match=r"^key_pattern\(\) prefix may only hold"):
        accel.key_pattern("p*", "", "", "")
    with pytest.raises(ValueError) as raised:
        accel.key_pattern("p", "", "", "bob\ud800", SECRET)
    assert str(raised.value).startswith("key_pattern() identity is a str that cannot be encoded")
    assert "bob" not in str(raised.value)


# -- key_slot ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "hashed"),
    [
        (b"foo", b"foo"),
        (b"123456789", b"123456789"),
        (b"", b""),
        (b"{user1000}.following", b"user1000"),
        (b"foo{}{bar}", b"foo{}{bar}"),
        (b"foo{{bar}}zap", b"{bar"),
        (b"foo{bar}{zap}", b"bar"),
        (b"{", b"{"),
        (b"}{", b"}{"),
        (b"a{b", b"a{b"),
        (b"p:fw:{t:s:i}:60", b"t:s:i"),
    ],
)
def test_key_slot_follows_redis_hash_tags(impl: Any, key: bytes, hashed: bytes) -> None:
    assert impl.key_slot(key) == crc16_slot(hashed)
    assert impl.key_slot(key.decode()) == crc16_slot(hashed)


def test_key_slot_known_values(impl: Any) -> None:
    assert impl.key_slot(b"foo") == 12182  # CLUSTER KEYSLOT foo
    assert impl.key_slot(b"123456789") == 0x31C3  # the CRC16/XMODEM check value
    assert impl.key_slot("{\u00e9}") == crc16_slot("\u00e9".encode())


@pytest.mark.parametrize(
    ("key", "error"),
    [(5, TypeError), (None, TypeError), (bytearray(b"k"), TypeError), ("\ud800", ValueError)],
)
def test_key_slot_rejects(impl: Any, key: object, error: type) -> None:
    with pytest.raises(error):
        impl.key_slot(key)


# -- encode_command and encode_evalsha -----------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class Label(str):
    pass


@pytest.mark.parametrize(
    ("args", "encoded"),
    [
        (("PING",), b"*1\r\n$4\r\nPING\r\n"),
        (("SET", b"k", 1), b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"),
        ((b"",), b"*1\r\n$0\r\n\r\n"),
        (("\u00e9\x00",), b"*1\r\n$3\r\n\xc3\xa9\x00\r\n"),
        ((0, -1, 2**63 - 1), b"*3\r\n$1\r\n0\r\n$2\r\n-1\r\n$19\r\n9223372036854775807\r\n"),
        ((-(2**63),), b"*1\r\n$20\r\n-9223372036854775808\r\n"),
        (
            (2**64, -(2**64)),
            b"*2\r\n$20\r\n18446744073709551616\r\n$21\r\n-18446744073709551616\r\n",
        ),
        ((Color.RED,), b"*1\r\n$1\r\n1\r\n"),
        ((bytearray(b"ab"), memoryview(b"cd")), b"*2\r\n$2\r\nab\r\n$2\r\ncd\r\n"),
        ((memoryview(b"abcdef").cast("B", (2, 3)),), b"*1\r\n$6\r\nabcdef\r\n"),
        ((memoryview(b"abcdef")[1:4],), b"*1\r\n$3\r\nbcd\r\n"),
        (
            (memoryview(array.array("H", [1, 2])),),
            b"*1\r\n$4\r\n" + array.array("H", [1, 2]).tobytes() + b"\r\n",
        ),
    ],
)
def test_encode_command(impl: Any, args: tuple[object, ...], encoded: bytes) -> None:
    assert impl.encode_command(*args) == encoded


def test_encode_command_writes_big_ints_and_long_lists(impl: Any) -> None:
    big = 7**500
    assert impl.encode_command(big) == b"*1\r\n$%d\r\n%d\r\n" % (len(str(big)), big)
    args = [str(i) for i in range(1000)]
    assert impl.encode_command(*args) == reference.encode_command(*args)
    assert impl.encode_command(b"x" * MB) == b"*1\r\n$1048576\r\n" + b"x" * MB + b"\r\n"


@pytest.mark.parametrize(
    ("arg", "error"),
    [
        (True, TypeError),
        (False, TypeError),
        (1.0, TypeError),
        (None, TypeError),
        (object(), TypeError),
        ([b"x"], TypeError),
        (1j, TypeError),
        ("\ud800", ValueError),
        (memoryview(b"abcd")[::2], ValueError),
        (released_memoryview(), ValueError),
    ],
)
def test_encode_command_rejects(impl: Any, arg: object, error: type) -> None:
    with pytest.raises(error):
        impl.encode_command("SET", arg)
    with pytest.raises(error):
        impl.encode_evalsha(SHA, [arg], [])
    with pytest.raises(error):
        impl.encode_evalsha(SHA, [], ["x", arg])


def test_encode_command_needs_an_argument(impl: Any) -> None:
    # Redis answers nothing to an empty array: a pipeline would never get its reply.
    with pytest.raises(TypeError):
        impl.encode_command()


@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="no digit limit")
def test_encode_command_int_past_the_digit_limit_is_a_value_error(impl: Any) -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        with pytest.raises(ValueError):
            impl.encode_command(10**1500)
    finally:
        sys.set_int_max_str_digits(limit)


def test_encode_command_messages() -> None:
    with pytest.raises(TypeError) as raised:
        accel.encode_command("SET", b"k", True)
    assert str(raised.value) == (
        "encode_command() argument 3 must be bytes, bytearray, memoryview, str or int, not bool"
    )
    with pytest.raises(ValueError) as raised:
        accel.encode_command("x" * MB + "\ud800")
    message = str(raised.value)
    assert message.startswith("encode_command() argument 1 is a str that cannot be encoded")
    assert "x" * 80 + "'..." in message
    assert len(message) < 400
    with pytest.raises(TypeError, match=r"^encode_evalsha\(\) args\[1\] must be .*not float$"):
        accel.encode_evalsha(SHA, [], [1, 2.0])
    with pytest.raises(ValueError, match=r"^encode_evalsha\(\) keys\[0\] cannot be read"):
        accel.encode_evalsha(SHA, [memoryview(b"abcd")[::2]], [])


def test_encode_evalsha(impl: Any) -> None:
    keys = [b"p:fw:{t:s:i}:60", "p:fw:{t:s:i}:3600"]
    args = (1000, 1, 5000, 60, 50000, 3600)
    expected = reference.encode_command("EVALSHA", SHA, 2, *keys, *args)
    assert impl.encode_evalsha(SHA, keys, args) == expected
    assert impl.encode_evalsha(SHA.encode(), tuple(keys), list(args)) == expected
    assert impl.encode_evalsha(SHA.upper(), [], []) == (
        b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n" + SHA.upper().encode() + b"\r\n$1\r\n0\r\n"
    )


@pytest.mark.parametrize(
    ("sha", "keys", "args", "error"),
    [
        (SHA[:39], [], [], ValueError),
        (SHA + "0", [], [], ValueError),
        (SHA[:39] + "g", [], [], ValueError),
        (SHA[:39] + "\u00e9", [], [], ValueError),
        (SHA[:39] + "\ud800", [], [], ValueError),
        (SHA.encode()[:39] + b"\xff", [], [], ValueError),
        (int(SHA, 16), [], [], TypeError),
        (bytearray(SHA.encode()), [], [], TypeError),
        (None, [], [], TypeError),
        (SHA, None, [], TypeError),
        (SHA, "k", [], TypeError),
        (SHA, [], b"a", TypeError),
        (SHA, [], {1: 2}, TypeError),
        (SHA, [True], [], TypeError),
        (SHA[:39], None, [], ValueError),
    ],
)
def test_encode_evalsha_rejects(
    impl: Any, sha: object, keys: object, args: object, error: type
) -> None:
    with pytest.raises(error):
        impl.encode_evalsha(sha, keys, args)


def test_encode_evalsha_wants_three_arguments(impl: Any) -> None:
    with pytest.raises(TypeError):
        impl.encode_evalsha(SHA, [])


def test_evalsha_size_is_the_encodings_length() -> None:
    """evalsha_size (what a check queued unencoded takes in a batch's bytes bound) is
    len(encode_evalsha(...)) for any sha: every kind of item (subclasses too), every size
    of number and text (the counts' and lengths' decimal widths), lists and tuples."""
    rng = random.Random(30)
    kinds: list[Any] = [
        lambda: rng.randrange(-(10**20), 10**20),
        lambda: rng.randrange(-12, 12),
        lambda: 2 ** rng.randrange(60, 200),
        lambda: "x" * rng.choice([0, 1, 9, 10, 99, 100, 1000]),
        lambda: "t\u00fc" * rng.randrange(4),
        lambda: "\U0001f600" * rng.randrange(3),
        lambda: b"b" * rng.choice([0, 9, 10, 100]),
        lambda: bytearray(b"ba" * rng.randrange(3)),
        lambda: memoryview(b"mv" * rng.randrange(3)),
        lambda: True,
        # Subclasses: an int's takes the plain route, a str's (never compact) the other.
        lambda: Color.RED,
        lambda: Label("s" * rng.randrange(3)),
    ]
    for _ in range(2000):
        keys = [rng.choice(kinds)() for _ in range(rng.choice([0, 1, 3, 9, 10, 11]))]
        args = [rng.choice(kinds)() for _ in range(rng.choice([0, 1, 2, 9, 10, 99, 100]))]
        keys = [key for key in keys if type(key) is not bool]  # a bool is refused
        args_given: Any = tuple(args) if rng.random() < 0.5 else args
        if any(type(arg) is bool for arg in args):
            with pytest.raises(TypeError, match="must be bytes, bytearray"):
                accel.evalsha_size(keys, args_given)
            continue
        assert accel.evalsha_size(keys, args_given) == len(
            accel.encode_evalsha(SHA, keys, args_given)
        )
    for keys, args in [(None, []), ("k", []), ([], b"a"), ([1.0], []), (["\ud800"], [])]:
        with pytest.raises((TypeError, ValueError)):
            accel.evalsha_size(keys, args)
    with pytest.raises(TypeError):
        accel.evalsha_size([])  # type: ignore[call-arg]


# -- decode_decision -----------------------------------------------------------------

NOW_MS = 1_700_000_000_000


@pytest.mark.parametrize(
    ("reply", "policies", "decoded"),
    [
        ([1, 0, 9000, 0, NOW_MS], 1, (True, 0, ((9000, 0, NOW_MS),))),
        (
            [1, 1, 5000, 0, NOW_MS, 1000, 0, NOW_MS + 1],
            2,
            (True, 1, ((5000, 0, NOW_MS), (1000, 0, NOW_MS + 1))),
        ),
        # Ties go to the lowest index.
        ([1, 0, 0, 0, 0, 0, 0, 0], 2, (True, 0, ((0, 0, 0), (0, 0, 0)))),
        ([0, 0, 0, 500, 1, 0, 500, 2], 2, (False, 0, ((0, 500, 1), (0, 500, 2)))),
        (
            [0, 1, 0, 500, NOW_MS, 0, 9000, NOW_MS],
            2,
            (False, 1, ((0, 500, NOW_MS), (0, 9000, NOW_MS))),
        ),
        # A permanent denial (-1) outranks any retry; its reset may be -1.
        ([0, 1, 0, 2**53, 5, 7, -1, -1], 2, (False, 1, ((0, 2**53, 5), (7, -1, -1)))),
        ([0, 0, 0, -1, 5, 0, -1, -1], 2, (False, 0, ((0, -1, 5), (0, -1, -1)))),
        ([1, 0, 2**53, 0, 2**53], 1, (True, 0, ((2**53, 0, 2**53),))),
        (
            [1, 15, *([5, 0, 1] * 15), 4, 0, 1],
            16,
            (True, 15, ((5, 0, 1),) * 15 + ((4, 0, 1),)),
        ),
    ],
)
def test_decode_decision(impl: Any, reply: list[int], policies: int, decoded: Any) -> None:
    result = impl.decode_decision(reply, policies)
    assert result == decoded
    assert type(result[0]) is bool


BAD_REPLIES = [
    # reply, policies
    ((1, 0, 1, 0, 1), 1),
    (b"\x01\x00", 1),
    (None, 1),
    ({0: 1}, 1),
    ([1, 0, 1, 0], 1),
    ([1, 0, 1, 0, 1, 0], 1),
    ([], 1),
    ([1, 0, 1, 0, 1], 2),
    ([True, 0, 1, 0, 1], 1),
    ([1, False, 1, 0, 1], 1),
    ([1, 0, 1.0, 0, 1], 1),
    ([1, 0, b"1", 0, 1], 1),
    ([1, 0, None, 0, 1], 1),
    ([2, 0, 1, 0, 1], 1),
    ([-1, 0, 1, 0, 1], 1),
    ([1, 1, 1, 0, 1], 1),
    ([1, -1, 1, 0, 1], 1),
    ([1, 0, -1, 0, 1], 1),
    ([1, 0, 2**53 + 1, 0, 1], 1),
    ([1, 0, 2**63, 0, 1], 1),
    ([1, 0, 2**64, 0, 1], 1),
    ([1, 0, -(2**63) - 1, 0, 1], 1),
    ([1, 0, 10**5000, 0, 1], 1),
    ([1, 0, 1, 5, 1], 1),  # retry on an admission
    ([1, 0, 1, -1, -1], 1),
    ([0, 0, 1, -2, 1], 1),
    ([0, 0, 1, 2**53 + 1, 1], 1),
    ([0, 0, 1, 5, -1], 1),  # reset -1 without a permanent denial
    ([0, 0, 1, 5, -2], 1),
    ([0, 0, 1, 5, 2**53 + 1], 1),
    ([1, 0, 5, 0, 1, 4, 0, 1], 2),  # policy 1 has fewer remaining
    ([0, 0, 0, 5, 1, 0, 6, 1], 2),  # policy 1 has the longer retry
    ([0, 0, 0, 5, 1, 0, -1, -1], 2),  # policy 1 is permanent
    ([0, 1, 0, -1, -1, 0, -1, -1], 2),  # a tie goes to policy 0
]


@pytest.mark.parametrize(("reply", "policies"), BAD_REPLIES)
def test_decode_decision_rejects_bad_replies(impl: Any, reply: object, policies: int) -> None:
    with pytest.raises(ValueError):
        impl.decode_decision(reply, policies)


@pytest.mark.parametrize(
    ("policies", "error"),
    [
        (True, TypeError),
        (1.0, TypeError),
        ("1", TypeError),
        (None, TypeError),
        (0, ValueError),
        (17, ValueError),
        (-1, ValueError),
        (2**64, ValueError),
    ],
)
def test_decode_decision_rejects_bad_policies(impl: Any, policies: object, error: type) -> None:
    with pytest.raises(error):
        impl.decode_decision([1, 0, 1, 0, 1], policies)


def test_decode_decision_messages() -> None:
    with pytest.raises(ValueError) as raised:
        accel.decode_decision([1, 0, 1, 0, 1, 0, 2**64, 1], 2)
    assert str(raised.value) == (
        "decode_decision() reply[6] (retry_ms of policy 1) must be 0 on an admission, "
        "got 18446744073709551616"
    )
    with pytest.raises(
        ValueError,
        match=r"reply\[2\] \(remaining_scaled of policy 0\) must "
        r"be an int, got 'x{80}'\.\.\.$",
    ):
        accel.decode_decision([1, 0, "x" * MB, 0, 1], 1)
    with pytest.raises(
        ValueError,
        match=r"must hold 5 ints \(2 \+ 3 per policy, 1 policies\), "
        r"got 4$",
    ):
        accel.decode_decision([1, 0, 1, 0], 1)
    with pytest.raises(ValueError, match=r"reply\[3\] \(retry_ms of policy 0\) must be -1"):
        accel.decode_decision([0, 0, 1, 10**5000, 1], 1)


# -- check_result --------------------------------------------------------------------

ONE_RATE = (CheckResult, PolicyState, "10/second", "fixed_window", ((10, 1),))
TWO_RATES = (CheckResult, PolicyState, "10/second;100/minute", "gcra", ((10, 1), (100, 60)))
# "10/second" with a burst of 50: the limit is what the bucket holds, refilled 10 per second.
BURST = (CheckResult, PolicyState, "10/second", "token_bucket", ((50, 1, 10),))


def states(*fields: tuple[Any, ...]) -> tuple[PolicyState, ...]:
    return tuple(PolicyState(*each) for each in fields)


@pytest.mark.parametrize(
    ("reply", "plan", "expected"),
    [
        # Admitted: remaining rounds down to whole requests, retry is 0.
        (
            [1, 0, 9999, 0, NOW_MS],
            ONE_RATE,
            CheckResult(True, 10, 9, 0, NOW_MS / 1000, 1, "10/second", "fixed_window",
                        states((10, 1, 9, 0, NOW_MS / 1000))),
        ),
        # Denied: retry rounds up to whole seconds; the deciding policy is on top.
        (
            [0, 1, 0, 1, NOW_MS + 1, 500, 59001, NOW_MS + 59001],
            TWO_RATES,
            CheckResult(False, 100, 0, 60, (NOW_MS + 59001) / 1000, 60,
                        "10/second;100/minute", "gcra",
                        states((10, 1, 0, 1, (NOW_MS + 1) / 1000),
                               (100, 60, 0, 60, (NOW_MS + 59001) / 1000))),
        ),
        # Permanent: retry -1 and reset -1 become None.
        (
            [0, 1, 3000, 1000, NOW_MS, 5000, -1, -1],
            TWO_RATES,
            CheckResult(False, 100, 5, None, None, 60, "10/second;100/minute", "gcra",
                        states((10, 1, 3, 1, NOW_MS / 1000), (100, 60, 5, None, None))),
        ),
        # The largest values of the contract.
        (
            [1, 0, 2**53, 0, 2**53],
            ONE_RATE,
            CheckResult(True, 10, 2**53 // 1000, 0, 2**53 / 1000, 1, "10/second",
                        "fixed_window", states((10, 1, 2**53 // 1000, 0, 2**53 / 1000))),
        ),
        # A burst: its refill beside the limit, on the policy and on top.
        (
            [1, 0, 49000, 0, NOW_MS + 100],
            BURST,
            CheckResult(True, 50, 49, 0, (NOW_MS + 100) / 1000, 1, "10/second",
                        "token_bucket", states((50, 1, 49, 0, (NOW_MS + 100) / 1000, 10)),
                        refill=10),
        ),
    ],
)  # fmt: skip
def test_check_result(impl: Any, reply: list[int], plan: Any, expected: CheckResult) -> None:
    result = impl.check_result(reply, plan)
    assert type(result) is CheckResult
    assert result == expected
    assert all(type(state) is PolicyState for state in result.policies)
    # Built through the constructor: every field, in order, and the same hash.
    assert fields_of(result) == fields_of(expected)
    assert hash(result) == hash(expected)
    for state, expected_state in zip(result.policies, expected.policies):
        assert fields_of(state) == fields_of(expected_state)
        assert hash(state) == hash(expected_state)
    assert repr(result) == repr(expected)
    assert dataclasses.replace(result, allowed=True).allowed is True
    assert result.status_code == expected.status_code
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.allowed = True  # type: ignore[misc]


@pytest.mark.parametrize(("reply", "policies"), BAD_REPLIES)
def test_check_result_rejects_bad_replies(impl: Any, reply: object, policies: int) -> None:
    plan = (CheckResult, PolicyState, "r", "a", ((1, 1),) * policies)
    with pytest.raises(ValueError):
        impl.check_result(reply, plan)


def fields_of(record: Any) -> list[tuple[str, Any]]:
    return [(field.name, getattr(record, field.name)) for field in dataclasses.fields(record)]


@dataclasses.dataclass(frozen=True)
class LookalikeResult:
    """A frozen dataclass of CheckResult's fields: not the type check_result builds."""

    allowed: bool


class SlottedResult:
    __slots__ = ("allowed",)


class DictResult(dict):  # type: ignore[type-arg]
    pass


BAD_PLANS = [
    None,
    [CheckResult, PolicyState, "r", "a", ((1, 1),)],
    (CheckResult, PolicyState, "r", "a"),
    (CheckResult, PolicyState, "r", "a", ((1, 1),), None),
    (CheckResult(True, 1, 1, 0, 1.0, 1, "r", "a"), PolicyState, "r", "a", ((1, 1),)),
    (int, PolicyState, "r", "a", ((1, 1),)),
    (DictResult, PolicyState, "r", "a", ((1, 1),)),
    (CheckResult, SlottedResult, "r", "a", ((1, 1),)),
    (LookalikeResult, PolicyState, "r", "a", ((1, 1),)),
    (PolicyState, CheckResult, "r", "a", ((1, 1),)),
    (CheckResult, PolicyState, b"r", "a", ((1, 1),)),
    (CheckResult, PolicyState, "r", None, ((1, 1),)),
    (CheckResult, PolicyState, "r", "a", ()),
    (CheckResult, PolicyState, "r", "a", ((1, 1),) * 17),
    (CheckResult, PolicyState, "r", "a", [(1, 1)]),
    (CheckResult, PolicyState, "r", "a", ((1, 1, 1, 1),)),
    (CheckResult, PolicyState, "r", "a", ((1, 1, None),)),
    (CheckResult, PolicyState, "r", "a", ((1, 1, 1.0),)),
    (CheckResult, PolicyState, "r", "a", ((1,),)),
    (CheckResult, PolicyState, "r", "a", ((1.0, 1),)),
    (CheckResult, PolicyState, "r", "a", ((1, True),)),
    (CheckResult, PolicyState, "r", "a", ([1, 1],)),
]


@pytest.mark.parametrize("plan", BAD_PLANS)
def test_check_result_rejects_bad_plans(impl: Any, plan: object) -> None:
    with pytest.raises(TypeError):
        impl.check_result([1, 0, 1, 0, 1], plan)


def test_check_result_messages() -> None:
    with pytest.raises(TypeError, match=r"^check_result\(\) plan must be \(CheckResult class, "):
        accel.check_result([1, 0, 1, 0, 1], BAD_PLANS[-1])
    with pytest.raises(
        ValueError, match=r"^check_result\(\) reply\[3\] \(retry_ms of policy 0\) must be 0 "
    ):
        accel.check_result([1, 0, 1, 5, 1], ONE_RATE)
    with pytest.raises(TypeError, match="exactly 2 arguments"):
        accel.check_result([1, 0, 1, 0, 1])


# -- properties: the C module against its twin ---------------------------------------
#
# Each property draws well-formed arguments, then usually spoils one of them
# with a hostile value, so both the success and the error paths get exercised.

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
ANY_TEXT = st.text(st.one_of(st.characters(), SURROGATES), max_size=90)
HUGE = st.sampled_from(
    ["x" * MB, "\u00e9" * MB, "y" * MB + "\ud800", b"z" * MB, b"\xff" * MB, "7" * MB]
)
EDGE_INTS = st.sampled_from(
    [0, 1, -1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**400]
)
ANY_INT = st.one_of(st.integers(), st.integers(-(2**300), 2**300), EDGE_INTS)
MEMORYVIEWS = st.one_of(
    st.builds(memoryview, st.binary(max_size=20)),
    st.builds(lambda data: memoryview(data)[::2], st.binary(min_size=2, max_size=20)),
    st.builds(lambda data: memoryview(data)[::-1], st.binary(max_size=20)),
    st.builds(released_memoryview),
)
HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(),
    ANY_INT,
    ANY_TEXT,
    st.binary(max_size=90),
    HUGE,
    st.builds(bytearray, st.binary(max_size=20)),
    MEMORYVIEWS,
    st.lists(st.integers(), max_size=3),
    st.tuples(st.integers()),
    st.just(object()),
    st.just(Color.RED),
)


@st.composite
def spoiled(draw: st.DrawFn, *valid: st.SearchStrategy[Any]) -> tuple[Any, ...]:
    """One value from each strategy; then, half the time, one of them hostile."""
    values = [draw(strategy) for strategy in valid]
    if draw(st.booleans()):
        values[draw(st.integers(0, len(values) - 1))] = draw(HOSTILE)
    return tuple(values)


@st.composite
def rate_texts(draw: st.DrawFn) -> str:
    """A well-formed rate string; half the time with one flaw."""
    blanks = st.text(" \t", max_size=2)
    policies = []
    for _ in range(draw(st.integers(1, 4))):
        unit = draw(st.sampled_from(sorted(reference._UNIT_S)))
        multiple = draw(
            st.one_of(
                st.just(""),
                st.builds(
                    "{}{}{}".format,
                    st.sampled_from(["", "0"]),
                    st.integers(1, reference.MAX_LONG_WINDOW_S // reference._UNIT_S[unit]),
                    blanks,
                ),
            )
        )
        unit = "".join(
            c.upper() if up else c
            for c, up in zip(unit, draw(st.lists(st.booleans(), min_size=7, max_size=7)))
        )
        # Now and then a multiple past the longest window.
        if multiple and draw(st.integers(0, 9)) == 0:
            multiple = f"{reference.MAX_LONG_WINDOW_S // reference._UNIT_S[unit.lower()] + 1} "
        count = draw(st.sampled_from(["", "0"])) + str(draw(st.integers(1, 10**10)))
        separator = draw(st.sampled_from(["/", " / ", " per ", "\tper  "]))
        policies.append(
            draw(blanks) + count + separator + draw(blanks) + multiple + unit + draw(blanks)
        )
    text = draw(st.sampled_from([";", ",", "|", " ; ", ", "])).join(policies)
    if draw(st.booleans()):
        position = draw(st.integers(0, len(text)))
        flaw = draw(
            st.sampled_from(
                [
                    ";",
                    ",",
                    "|",
                    " ",
                    "0",
                    "9" * 12,
                    "x",
                    "s",
                    "per",
                    "/",
                    "\x00",
                    "\n",
                    "\u0660",
                    "\ud800",
                    "e",
                    ".",
                    "-",
                    ";1/day" * 16,
                ]
            )
        )
        text = text[:position] + flaw + text[position:]
    return text


@PROPERTY
@given(
    spoiled(
        st.one_of(
            rate_texts(), st.text("0123456789/ ;,|\tperPERsecondminutehoursdayweekmonthyear.")
        )
    )
)
def test_parse_rate_matches_reference(text: tuple[object]) -> None:
    same_outcome("parse_rate", *text)


COMPONENTS = st.one_of(
    st.text(max_size=70),
    st.binary(max_size=70),
    st.text("%~!:{}aZ9.", max_size=70),
    st.sampled_from(["a" * MB, "\u00e9" * MB, b"\xff" * MB]),
)
WINDOWS = st.one_of(
    st.lists(st.integers(1, 311_040_000), min_size=1, max_size=16),
    st.lists(st.integers(1, 86_400), min_size=1, max_size=16).map(tuple),
    st.lists(st.one_of(st.integers(1, 311_040_001), ANY_INT, st.booleans()), max_size=17),
)
BUILD_KEYS_ARGS = spoiled(
    st.one_of(
        st.from_regex(r"[A-Za-z0-9_.:-]{1,128}", fullmatch=True),
        st.from_regex(rb"[A-Za-z0-9_.:-]{1,128}", fullmatch=True),
    ),
    st.from_regex(r"[a-z0-9_]{1,16}", fullmatch=True),
    COMPONENTS,
    COMPONENTS,
    COMPONENTS,
    WINDOWS,
    st.one_of(st.none(), st.binary(min_size=16, max_size=100), st.binary(max_size=15)),
)


@PROPERTY
@given(BUILD_KEYS_ARGS, st.booleans())
def test_build_keys_matches_reference(args: tuple[Any, ...], secret_by_keyword: bool) -> None:
    if secret_by_keyword:
        same_outcome("build_keys", *args[:6], secret=args[6])
    else:
        same_outcome("build_keys", *args)


@PROPERTY
@given(
    spoiled(
        st.from_regex(r"[A-Za-z0-9_.:-]{1,128}", fullmatch=True),
        COMPONENTS,
        COMPONENTS,
        COMPONENTS,
        st.one_of(st.none(), st.binary(min_size=16, max_size=100), st.binary(max_size=15)),
    ),
    st.booleans(),
)
def test_key_pattern_matches_reference(args: tuple[Any, ...], secret_by_keyword: bool) -> None:
    if secret_by_keyword:
        same_outcome("key_pattern", *args[:4], secret=args[4])
    else:
        same_outcome("key_pattern", *args)


@PROPERTY
@given(spoiled(st.one_of(st.binary(max_size=40), st.text("{}ab\u00e9", max_size=12), HUGE)))
def test_key_slot_matches_reference(key: tuple[object]) -> None:
    same_outcome("key_slot", *key)


ARGUMENT = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40),
    ANY_INT,
    st.builds(bytearray, st.binary(max_size=20)),
    st.builds(memoryview, st.binary(max_size=20)),
    st.sampled_from(["x" * MB, b"y" * MB]),
)
ARGUMENT_LISTS = st.lists(ARGUMENT, max_size=20)


@st.composite
def command_arguments(draw: st.DrawFn) -> list[Any]:
    """Arguments for a command; half the time one of them hostile."""
    args = draw(ARGUMENT_LISTS)
    if draw(st.booleans()):
        args.insert(draw(st.integers(0, len(args))), draw(HOSTILE))
    return args


@PROPERTY
@given(command_arguments())
def test_encode_command_matches_reference(args: list[object]) -> None:
    same_outcome("encode_command", *args)


SHAS = st.one_of(
    st.text("0123456789abcdefABCDEF", min_size=40, max_size=40),
    st.text("0123456789abcdefABCDEF", min_size=40, max_size=40).map(str.encode),
    st.text("0123456789abcdefg\u00e9\ud800", min_size=39, max_size=41),
    st.binary(min_size=39, max_size=41),
)
SEQUENCES = st.one_of(command_arguments(), command_arguments().map(tuple))


@PROPERTY
@given(spoiled(SHAS, SEQUENCES, SEQUENCES))
def test_encode_evalsha_matches_reference(args: tuple[Any, Any, Any]) -> None:
    same_outcome("encode_evalsha", *args)


@st.composite
def decision_replies(draw: st.DrawFn) -> tuple[object, object]:
    """A valid decision reply; half the time with one flaw."""
    policies = draw(st.integers(1, 16))
    allowed = draw(st.integers(0, 1))
    scaled = st.one_of(st.integers(0, 2**53), st.sampled_from([0, 1, 2**53]))
    states = []
    for _ in range(policies):
        remaining = draw(scaled)
        retry = 0 if allowed else draw(st.one_of(st.just(-1), scaled))
        reset = draw(st.one_of(st.just(-1), scaled)) if retry == -1 else draw(scaled)
        states.append((remaining, retry, reset))
    deciding = reference._deciding(allowed, states)
    reply: list[object] = [allowed, deciding, *(value for state in states for value in state)]
    flaws = ["none", "none", "none", "value", "deciding", "length", "policies"]
    flaw = draw(st.sampled_from(flaws))
    if flaw == "value":
        position = draw(st.integers(0, len(reply) - 1))
        reply[position] = draw(st.one_of(EDGE_INTS, st.integers(-3, 3), HOSTILE))
    elif flaw == "deciding":
        reply[1] = draw(st.integers(0, policies - 1))
    elif flaw == "length":
        del reply[draw(st.integers(0, len(reply) - 1))]
    elif flaw == "policies":
        return reply, draw(st.one_of(st.integers(-1, 17), HOSTILE))
    return reply, policies


@PROPERTY
@given(st.one_of(decision_replies(), decision_replies(), st.tuples(HOSTILE, HOSTILE)))
def test_decode_decision_matches_reference(reply_and_policies: tuple[object, object]) -> None:
    same_outcome("decode_decision", *reply_and_policies)


@st.composite
def result_plans(draw: st.DrawFn, policies: object) -> object:
    """A plan for this many policies; now and then a broken one."""
    count = policies if isinstance(policies, int) and 1 <= policies <= 16 else 1
    limit = st.integers(1, 9_007_199_254)
    rates: tuple[tuple[int, ...], ...] = tuple(
        (draw(limit), draw(st.integers(1, 86_400))) for _ in range(count)
    )
    if draw(st.booleans()):  # a burst's: (burst, window_s, refill)
        rates = tuple((*rate, draw(limit)) for rate in rates)
    plan = (CheckResult, PolicyState, draw(st.text(max_size=20)), draw(st.text(max_size=12)), rates)
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(BAD_PLANS))
    return plan


@PROPERTY
@given(st.one_of(decision_replies(), st.tuples(HOSTILE, HOSTILE)), st.data())
def test_check_result_matches_reference(
    reply_and_policies: tuple[object, object], data: st.DataObject
) -> None:
    reply, policies = reply_and_policies
    same_outcome("check_result", reply, data.draw(result_plans(policies)))


# -- properties of the keys themselves -----------------------------------------------

COMPONENT = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=80),
    st.text("%~!:{}aZ9", max_size=70),
    st.sampled_from(["", ":", "%3A", "%", "~", "!", "}", "{", "a" * 64, "a" * 65, "%" * 22]),
)
TRIPLES = st.tuples(COMPONENT, COMPONENT, COMPONENT)
WINDOW_SETS = st.lists(st.integers(1, 86_400), min_size=1, max_size=16, unique=True)


def as_bytes(triple: tuple[str | bytes, ...]) -> tuple[bytes, ...]:
    return tuple(part.encode() if isinstance(part, str) else part for part in triple)


@st.composite
def triple_pairs(draw: st.DrawFn) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Two triples, often nearly the same: a separator moved from one
    component to the next, a character changed, or the same bytes twice."""
    first = draw(TRIPLES)
    how = draw(st.sampled_from(["other", "same", "shift", "edit"]))
    if how == "other":
        return first, draw(TRIPLES)
    parts = [bytearray(part) for part in as_bytes(first)]
    if how == "shift" and parts[0]:
        parts[1][:0] = parts[0][-1:]
        del parts[0][-1:]
    elif how == "edit":
        index = draw(st.integers(0, 2))
        position = draw(st.integers(0, len(parts[index])))
        parts[index][position:position] = draw(st.sampled_from([b":", b"%", b"}", b"a", b"~"]))
    return first, tuple(bytes(part) for part in parts)


@PROPERTY
@given(triple_pairs(), st.sampled_from([None, SECRET]))
def test_build_keys_is_injective(pair: Any, secret: bytes | None) -> None:
    first, second = pair
    windows = (1, 60, 86_400)
    first_keys = accel.build_keys("app", "fw", *first, windows, secret)
    second_keys = accel.build_keys("app", "fw", *second, windows, secret)
    assert (first_keys == second_keys) == (as_bytes(first) == as_bytes(second))


@PROPERTY
@given(
    triple_pairs(),
    st.sampled_from([None, SECRET]),
    st.from_regex(r"[a-z0-9_]{2}", fullmatch=True),  # every registered tag has two characters
)
def test_key_pattern_matches_exactly_the_identity_keys(
    pair: Any, secret: bytes | None, algorithm: str
) -> None:
    first, second = pair
    pattern = accel.key_pattern("app", *first, secret)
    # Only the '??' (the two-character algorithm tag) and the final '*' are glob
    # syntax, so fnmatch and Redis agree on it.
    assert pattern.count(b"*") == 1 and pattern.count(b"?") == 2
    assert not set(pattern) & set(b"[]\\")
    keys = accel.build_keys("app", algorithm, *second, (1, 60, 86_400), secret)
    derived = [key + suffix for key in keys for suffix in (b"", b":123", b":bucket:v2")]
    same_identity = as_bytes(first) == as_bytes(second)
    assert all(fnmatch.fnmatchcase(key, pattern) == same_identity for key in derived)
    # A limiter whose prefix extends this one's is out of reach.
    nested = accel.build_keys("app:x", algorithm, *first, (60,), secret)
    assert not fnmatch.fnmatchcase(nested[0], pattern)


@PROPERTY
@given(TRIPLES, WINDOW_SETS, st.sampled_from([None, SECRET]))
def test_build_keys_share_one_hash_tag(
    triple: tuple[Any, ...], windows_s: list[int], secret: bytes | None
) -> None:
    keys = accel.build_keys("my.app:rl", "tb", *triple, windows_s, secret)
    assert len(keys) == len(windows_s)
    for key, window_s in zip(keys, windows_s):
        assert key.count(b"{") == 1
        assert key.count(b"}") == 1
        assert key.index(b"{") < key.index(b"}")
        assert key.endswith(b"}:%d" % window_s)
        assert len(key) <= 128 + 1 + 16 + 2 + 3 * 66 + 2 + 1 + 5
    assert len({accel.key_slot(key) for key in keys}) == 1


@PROPERTY
@given(st.one_of(st.text("%~!:{}aZ9 \u00e9", min_size=60, max_size=80), HUGE))
def test_long_components_are_hashed_to_a_short_key(identity: Any) -> None:
    assume(not (isinstance(identity, str) and "\ud800" in identity))
    [key] = accel.build_keys("p", "fw", identity, identity, identity, [60])
    assert len(key) < 400
