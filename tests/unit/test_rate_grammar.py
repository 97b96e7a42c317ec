"""The rate strings users of limits (and slowapi) and throttled-py already write.

Every rate string in those libraries' documentation goes through moderato's
parser (the C one and its pure-Python reference): it must give the
(limit, window_s) pairs the library documents, or be refused with the reason
moderato's docs give (docs/internals.md, "parse_rate"). Where the peer is
installed (limits comes with the `bench` extra), its own parser is asked too,
at run time, and Hypothesis compares the two on generated strings of the
grammar both accept.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Union

import accel_reference as reference
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moderato import _accel as accel
from moderato.policy import MAX_LONG_WINDOW_S, parse_rate

DAY_S = 86_400
MONTH_S = 30 * DAY_S  # limits' month
YEAR_S = 360 * DAY_S  # limits' year
WEEK_S = 7 * DAY_S  # throttled-py's week

# Where each string was collected from.
LIMITS_NOTATION = "limits docs: doc/source/string-notation.rst, 'Examples'"
LIMITS_QUICKSTART = "limits docs: doc/source/quickstart.rst, parse('1/minute')"
LIMITS_FORMAT = (
    "limits docs: string-notation.rst, the format "
    "'[count] [per|/] [n (optional)] [second|minute|hour|day|month|year]'"
)
THROTTLED_README = "throttled-py 3.5.0 README (its PyPI description), 'Quota Configuration'"
THROTTLED_EXAMPLES = "throttled-py 3.5.0 README, the usage examples' quota= strings"
THROTTLED_UNITS = (
    "throttled-py 3.5.0 README ('unit supports s / m / h / d / w') and its parser's "
    "error text ('s/sec/second, m/min/minute, h/hr/hour, d/day, w/wk/week')"
)
ISSUE = "moderato issue 14: strings limits/slowapi and throttled-py users write"

BURST = "'burst' at offset {} is not part of a rate: give it beside the rate, burst=<n>"

Pairs = tuple[tuple[int, int], ...]


class Refused:
    """A documented string moderato refuses, and the start of the reason it gives."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Refused({self.reason!r})"


# (text, what the peer documents it as, or Refused, the peer that documents it, source)
TABLE: list[tuple[str, Union[Pairs, Refused], str, str]] = [
    ("10 per hour", ((10, 3600),), "limits", LIMITS_NOTATION),
    ("10/hour", ((10, 3600),), "limits", LIMITS_NOTATION),
    (
        "10/hour;100/day;2000 per year",
        ((10, 3600), (100, DAY_S), (2000, YEAR_S)),
        "limits",
        LIMITS_NOTATION,
    ),
    ("100/day, 500/7days", ((100, DAY_S), (500, 7 * DAY_S)), "limits", LIMITS_NOTATION),
    ("1/minute", ((1, 60),), "limits", LIMITS_QUICKSTART),
    *[
        (text, ((limit, multiple * unit_s),), "limits", LIMITS_FORMAT)
        for unit, unit_s in [
            ("second", 1),
            ("minute", 60),
            ("hour", 3600),
            ("day", DAY_S),
            ("month", MONTH_S),
            ("year", YEAR_S),
        ]
        for text, limit, multiple in [
            (f"3/{unit}", 3, 1),
            (f"3 per {unit}", 3, 1),
            (f"3/{unit}s", 3, 1),
            (f"3/2 {unit}s", 3, 2),
            (f"3 per 2 {unit}s", 3, 2),
        ]
    ],
    ("1000/s burst 1000", Refused(BURST.format(7)), "throttled", THROTTLED_EXAMPLES),
    ("1/m", ((1, 60),), "throttled", THROTTLED_EXAMPLES),
    ("100/s burst 100", Refused(BURST.format(6)), "throttled", THROTTLED_EXAMPLES),
    ("60/m", ((60, 60),), "throttled", THROTTLED_EXAMPLES),
    ("100/s", ((100, 1),), "throttled", THROTTLED_README),
    ("100/s burst 200", Refused(BURST.format(6)), "throttled", THROTTLED_README),
    ("100 per second", ((100, 1),), "throttled", THROTTLED_README),
    ("100 per second burst 200", Refused(BURST.format(15)), "throttled", THROTTLED_README),
    *[
        (f"2/{unit}", ((2, unit_s),), "throttled", THROTTLED_UNITS)
        for unit, unit_s in [
            ("s", 1),
            ("sec", 1),
            ("second", 1),
            ("m", 60),
            ("min", 60),
            ("minute", 60),
            ("h", 3600),
            ("hr", 3600),
            ("hour", 3600),
            ("d", DAY_S),
            ("day", DAY_S),
            ("w", WEEK_S),
            ("wk", WEEK_S),
            ("week", WEEK_S),
        ]
    ],
    ("1000/month", ((1000, MONTH_S),), "limits", ISSUE),
    ("1/year", ((1, YEAR_S),), "limits", ISSUE),
    ("5/2 days", ((5, 2 * DAY_S),), "limits", ISSUE),
    ("5/minute,10/hour", ((5, 60), (10, 3600)), "limits", ISSUE),
    ("5/min", ((5, 60),), "throttled", ISSUE),
    ("5/m", ((5, 60),), "throttled", ISSUE),
    ("5/s", ((5, 1),), "throttled", ISSUE),
    ("5/h", ((5, 3600),), "throttled", ISSUE),
    ("5/d", ((5, DAY_S),), "throttled", ISSUE),
    ("3/week", ((3, WEEK_S),), "throttled", ISSUE),
]

ACCEPTED = [(text, pairs, peer) for text, pairs, peer, _ in TABLE if not isinstance(pairs, Refused)]
REFUSED = [(text, refused) for text, refused, _, _ in TABLE if isinstance(refused, Refused)]


def test_every_entry_names_its_source() -> None:
    assert len(TABLE) == 67
    assert all(source and peer in ("limits", "throttled") for _, _, peer, source in TABLE)
    assert len({text for text, *_ in TABLE}) == len(TABLE)


@pytest.mark.parametrize(("text", "pairs", "peer"), ACCEPTED)
def test_documented_string_parses_as_its_library_documents(
    text: str, pairs: Pairs, peer: str
) -> None:
    assert accel.parse_rate(text) == pairs
    assert reference.parse_rate(text) == pairs
    assert [(rate.limit, rate.window_s) for rate in parse_rate(text)] == list(pairs)


@pytest.mark.parametrize(("text", "refused"), REFUSED)
def test_documented_string_is_refused_with_its_reason(text: str, refused: Refused) -> None:
    with pytest.raises(ValueError) as raised:
        accel.parse_rate(text)
    assert str(raised.value).startswith(f"invalid rate {text!r}: {refused.reason}")
    with pytest.raises(ValueError):
        reference.parse_rate(text)


# -- the peers' own parsers, where installed --------------------------------------------


def peer_module(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


limits_package = peer_module("limits")
throttled_parser = peer_module("throttled.rate_limiter.quota_parser")


def limits_pairs(text: str) -> Pairs:
    assert limits_package is not None
    return tuple((item.amount, item.get_expiry()) for item in limits_package.parse_many(text))


def throttled_pairs(text: str) -> Pairs:
    assert throttled_parser is not None
    return tuple(
        (quota.get_limit(), quota.get_period_sec()) for quota in throttled_parser.parse(text)
    )


@pytest.mark.skipif(limits_package is None, reason="limits is not installed (the bench extra)")
@pytest.mark.parametrize(
    ("text", "pairs"), [(text, pairs) for text, pairs, peer in ACCEPTED if peer == "limits"]
)
def test_limits_own_parser_agrees(text: str, pairs: Pairs) -> None:
    assert limits_pairs(text) == pairs


@pytest.mark.skipif(throttled_parser is None, reason="throttled-py is not installed")
@pytest.mark.parametrize(
    ("text", "pairs"), [(text, pairs) for text, pairs, peer in ACCEPTED if peer == "throttled"]
)
def test_throttled_own_parser_agrees(text: str, pairs: Pairs) -> None:
    assert throttled_pairs(text) == pairs


@pytest.mark.skipif(throttled_parser is None, reason="throttled-py is not installed")
def test_throttled_reads_burst_as_extra_capacity_which_moderato_takes_as_burst() -> None:
    quotas = throttled_parser.parse("100/s burst 200")  # type: ignore[union-attr]
    assert [(quota.get_limit(), quota.get_period_sec(), quota.burst) for quota in quotas] == [
        (100, 1, 200)
    ]


# -- generated strings of the grammar both sides accept ---------------------------------

LIMITS_UNITS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": DAY_S,
    "month": MONTH_S,
    "year": YEAR_S,
}
THROTTLED_UNITS_S = {
    **dict.fromkeys(["s", "sec", "secs", "second", "seconds"], 1),
    **dict.fromkeys(["m", "min", "mins", "minute", "minutes"], 60),
    **dict.fromkeys(["h", "hr", "hrs", "hour", "hours"], 3600),
    **dict.fromkeys(["d", "day", "days"], DAY_S),
    **dict.fromkeys(["w", "wk", "wks", "week", "weeks"], WEEK_S),
}


def mixed_case(draw: st.DrawFn, word: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    return "".join(c.upper() if flip else c for c, flip in zip(word, flips))


@st.composite
def limits_policy(draw: st.DrawFn) -> tuple[str, int, int]:
    """One policy in limits' grammar: text, limit, window_s."""
    unit = draw(st.sampled_from(sorted(LIMITS_UNITS)))
    limit = draw(st.integers(1, 9_007_199_254))
    multiple = draw(st.one_of(st.none(), st.integers(1, MAX_LONG_WINDOW_S // LIMITS_UNITS[unit])))
    separator = draw(st.sampled_from(["/", " / ", " per ", " PER "]))
    written_multiple = "" if multiple is None else f"{multiple}" + draw(st.sampled_from(["", " "]))
    plural = draw(st.sampled_from(["", "s"]))
    text = f"{limit}{separator}{written_multiple}{mixed_case(draw, unit)}{plural}"
    return text, limit, (multiple or 1) * LIMITS_UNITS[unit]


@st.composite
def throttled_policy(draw: st.DrawFn) -> tuple[str, int, int]:
    """One policy in throttled-py's grammar (no multiples, no burst): text, limit, window_s."""
    unit = draw(st.sampled_from(sorted(THROTTLED_UNITS_S)))
    limit = draw(st.integers(1, 9_007_199_254))
    separator = draw(st.sampled_from(["/", " / ", " per ", " Per "]))
    return f"{limit}{separator}{mixed_case(draw, unit)}", limit, THROTTLED_UNITS_S[unit]


@st.composite
def rate_strings(
    draw: st.DrawFn, policy: st.SearchStrategy[tuple[str, int, int]]
) -> tuple[str, Pairs]:
    """1-4 policies joined by any separator both sides accept, and the pairs they mean."""
    policies = draw(st.lists(policy, min_size=1, max_size=4))
    joiner = draw(st.sampled_from([";", ",", "|", "; ", " , "]))
    text = joiner.join(text for text, _, _ in policies)
    return text, tuple((limit, window_s) for _, limit, window_s in policies)


def assert_moderato_reads(text: str, pairs: Pairs) -> None:
    windows = [window_s for _, window_s in pairs]
    if len(set(windows)) < len(windows):
        # Two policies of one window would share one key: moderato refuses, saying so.
        with pytest.raises(ValueError, match="both have a window of"):
            accel.parse_rate(text)
        with pytest.raises(ValueError):
            reference.parse_rate(text)
        return
    assert accel.parse_rate(text) == pairs
    assert reference.parse_rate(text) == pairs


PEERS: dict[str, tuple[st.SearchStrategy[tuple[str, int, int]], bool, Callable[[str], Pairs]]] = {
    "limits": (limits_policy(), limits_package is not None, limits_pairs),
    "throttled": (throttled_policy(), throttled_parser is not None, throttled_pairs),
}


@pytest.mark.parametrize("peer", list(PEERS))
@given(data=st.data())
def test_generated_strings_read_as_the_peer_reads_them(peer: str, data: st.DataObject) -> None:
    policy, installed, peer_pairs = PEERS[peer]
    text, pairs = data.draw(rate_strings(policy), label="rate")
    if installed:
        assert peer_pairs(text) == pairs
    assert_moderato_reads(text, pairs)
