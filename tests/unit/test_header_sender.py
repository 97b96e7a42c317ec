"""The headers middleware's send wrapper in C (csrc/fast_route.c, middleware.py's
``_SENDERS``) against its Python reference (tests/header_sender_reference.py): the
same messages sent, the same scope left, the same ``started`` and the same errors, for
random decisions in every header style and random response headers; its own legacy
headers against web/headers.py's ``legacy_for_one``; and no leak."""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
from header_sender_reference import HeaderSender
from test_headers_fast_path import random_result

from moderato import _accel
from moderato.integrations.decisions import DECISIONS, HEADERS_DONE
from moderato.integrations.middleware import _SENDERS, _decision_headers
from moderato.results import CheckResult, PolicyState

STYLES = ("legacy", "ietf", "both", None)
NOW_S = 1796160000.25


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """render()'s ``now`` the same for both wrappers."""
    monkeypatch.setattr(time, "time", lambda: NOW_S)


def run(
    make: Callable[[dict[str, Any], Any, Any], Any],
    scope: dict[str, Any],
    messages: list[Any],
    style: Any,
) -> tuple[Any, ...]:
    """What a wrapper sends for these messages and leaves in the scope (an error as
    its type and text, and where it happened)."""
    sent: list[Any] = []
    wrapper = make(scope, lambda message: sent.append(message) or "awaitable", style)
    returned = []
    for number, message in enumerate(messages):
        try:
            returned.append(wrapper(message))
        except Exception as error:
            returned.append((number, type(error), str(error)))
            break
    return sent, returned, scope, wrapper.started


def random_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    names = [b"content-type", b"X-RateLimit-Limit", b"x-ratelimit-remaining", b"retry-after"]
    count = rng.choice((0, 1, 2, 3, 17))  # past 16 names, C keeps them in a set
    return [(rng.choice(names), b"v%d" % n) for n in range(count)]


def random_scope(rng: random.Random) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http"}
    if rng.random() < 0.1:
        scope[HEADERS_DONE] = rng.choice((True, 1, False, 0, None))
    roll = rng.random()
    if roll < 0.1:
        scope[DECISIONS] = []
    elif roll < 0.15:
        scope[DECISIONS] = None
    elif roll > 0.2:
        scope[DECISIONS] = [random_result(rng) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
    return scope


def random_messages(rng: random.Random) -> list[Any]:
    start: dict[str, Any] = {"type": "http.response.start", "status": 200}
    if rng.random() < 0.8:
        start["headers"] = random_headers(rng)
        if rng.random() < 0.2:
            start["headers"] = tuple(start["headers"])
    body = {"type": "http.response.body", "body": b"{}"}
    return rng.choice(([start, body], [body], [start], [start, start, body]))


def random_cases(seed: int, count: int) -> Iterator[tuple[dict[str, Any], list[Any], Any]]:
    rng = random.Random(seed)
    for _ in range(count):
        yield random_scope(rng), random_messages(rng), rng.choice(STYLES)


def test_same_as_the_python_wrapper() -> None:
    added = 0
    for scope, messages, style in random_cases(31, 20_000):
        expected = run(HeaderSender, dict(scope), messages, style)
        got = run(_SENDERS, dict(scope), messages, style)
        assert got == expected, (scope, messages, style)
        added += any(
            message.get("headers", ()) != messages[0].get("headers", ()) for message in got[0][:1]
        )
    assert added > 5_000


def admitted(
    limit: Any = 5, remaining: Any = 4, reset_at: Any = 1796160000.2, **fields: Any
) -> CheckResult:
    return CheckResult(
        True, limit, remaining, 0, reset_at, 60, "5/minute", "fixed_window", **fields
    )


def unusual_decisions() -> list[CheckResult]:
    """Decisions whose fields C leaves to the fallback, or reads at their edges."""
    state = PolicyState(5, 60, 2, 0, 1796160000.5)
    return [
        admitted(),
        admitted(reset_at=None),
        admitted(reset_at=1796160000),  # an int
        admitted(reset_at=-0.5),
        admitted(reset_at=1e300),  # past a long long: the fallback's
        admitted(limit=2**80),
        admitted(limit=2**63 - 1, remaining=-(2**63)),  # a long long's ends
        admitted(limit=0, remaining=-3, reset_at=-(2.0**62)),
        admitted(limit=5.0),  # b"%d" % 5.0
        admitted(limit=True),
        admitted(remaining=None),
        admitted(bypassed=True),
        admitted(policies=(state, state)),  # the same state twice
        admitted(policies=(state, PolicyState(9, 3600, 2, 0, None))),  # a tie
        admitted(policies=(state, PolicyState(9, 3600, 1, 0, None))),  # fewer left
        admitted(policies=(state, PolicyState(9, 3600, None, 0, None))),
        admitted(policies=(PolicyState(5, 60, 2.5, 0, 10.5),)),
    ]


@pytest.mark.parametrize("style", STYLES)
def test_unusual_decisions(style: Any) -> None:
    for decision in unusual_decisions():
        start = {"type": "http.response.start", "headers": [(b"content-type", b"x")]}
        for scope in ({DECISIONS: [decision]}, {DECISIONS: [decision, decision]}):
            expected = run(HeaderSender, dict(scope), [start], style)
            assert run(_SENDERS, dict(scope), [start], style) == expected, decision


class Odd:
    """A decision that is no CheckResult: the fallback's (legacy_for_one reads it)."""

    allowed = True
    bypassed = False
    limit = 3
    remaining = 1
    reset_at = 20.5
    policies = ()


def test_odd_values_and_malformed_messages() -> None:
    start = {"type": "http.response.start"}
    cases: list[tuple[dict[str, Any], list[Any]]] = [
        ({DECISIONS: [Odd()]}, [start]),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": [(b"a",)]}]),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": [b"abc"]}]),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": [1]}]),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": [("A", b"")]}]),
        (
            {DECISIONS: [admitted()]},
            [{"type": "http.response.start", "headers": [(b"a", b""), ("X-RateLimit-Limit", b"")]}],
        ),
        (
            {DECISIONS: [admitted()]},
            [{"type": "http.response.start", "headers": [(b"a", b""), (bytearray(b"B"), b"")]}],
        ),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": [([1], b"")]}]),
        ({DECISIONS: [admitted()]}, [{"status": 200}]),
        ({DECISIONS: [admitted()]}, [{"type": "http.response.start", "headers": 5}]),
        ({DECISIONS: (admitted(),)}, [start]),
    ]
    for scope, messages in cases:
        for style in STYLES:
            expected = run(HeaderSender, dict(scope), messages, style)
            assert run(_SENDERS, dict(scope), messages, style) == expected, (scope, messages)


def test_legacy_headers_built_in_c_are_legacy_for_one_s() -> None:
    """The quick case C builds without the fallback: what legacy_for_one gives."""
    called: list[Any] = []

    def fallback(decisions: list[CheckResult], style: Any) -> Any:
        called.append(decisions)
        return _decision_headers(decisions, style)

    senders = _accel.HeaderSenders(
        headers_done=HEADERS_DONE, decisions=DECISIONS, fallback=fallback
    )
    rng = random.Random(3131)
    in_c = 0
    for _ in range(5_000):
        decision = random_result(rng)
        sent: list[Any] = []
        sender = senders({DECISIONS: [decision]}, sent.append, "legacy")
        before = len(called)
        sender({"type": "http.response.start"})
        expected = _decision_headers([decision], "legacy")
        assert sent[0].get("headers", []) == expected
        in_c += len(called) == before
    assert in_c > 2_500


def test_the_types() -> None:
    sender = _SENDERS({}, print, "legacy")
    assert type(sender) is _accel.HeaderSender and sender.started is False
    with pytest.raises(AttributeError):
        sender.started = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        _SENDERS({}, print)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        sender()
    with pytest.raises(TypeError):
        _accel.HeaderSenders(headers_done="a", decisions="b", fallback=3)  # type: ignore[arg-type]


def test_no_leaks() -> None:
    decision = admitted(reset_at="".join(["x"]) and 1796160000.2)
    style = "".join(["leg", "acy"])
    send_returns = object()

    def send(message: Any) -> Any:
        return send_returns

    def requests(times: int) -> None:
        for _ in range(times):
            scope: dict[str, Any] = {DECISIONS: [decision]}
            sender = _SENDERS(scope, send, style)
            sender({"type": "http.response.start", "headers": [(b"content-type", b"x")]})
            sender({"type": "http.response.body", "body": b""})
            _SENDERS({DECISIONS: [decision, decision]}, send, "ietf")(
                {"type": "http.response.start"}
            )

    requests(1_000)
    gc.collect()
    counts = [sys.getrefcount(value) for value in (decision, style, send, send_returns)]
    requests(20_000)
    gc.collect()
    assert [sys.getrefcount(value) for value in (decision, style, send, send_returns)] == counts


def test_none_found_when_unset() -> None:
    optional: Optional[int] = None
    assert _SENDERS({}, lambda message: optional, None)({"type": "x"}) is None


def test_wrong_calls_are_refused_by_name() -> None:
    """Each C callable names what it takes when called any other way."""
    from moderato.integrations.stack import alone_arguments

    sender = _SENDERS({}, lambda message: None, "legacy")
    cases: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str]] = [
        (sender, (), {}, "HeaderSender takes one message"),
        (sender, ({}, {}), {}, "HeaderSender takes one message"),
        (sender, (), {"message": {}}, "HeaderSender takes one message"),
        (_SENDERS, ({}, None), {}, "HeaderSenders takes scope, send and style"),
        (_SENDERS, ({}, None), {"style": None}, "HeaderSenders takes scope, send and style"),
        (alone_arguments, (None,), {}, "RouteArguments takes rule and scope"),
        (alone_arguments, (None, {}), {"x": 1}, "RouteArguments takes rule and scope"),
    ]
    for function, arguments, keywords, message in cases:
        with pytest.raises(TypeError) as raised:
            function(*arguments, **keywords)
        assert str(raised.value) == message


# Made only by moderato's C: a HeaderSenders' sender, a connection's batched call, a
# check decided when called (ReadyCheck) or sent over Redis (PendingCheck).
ONLY_C_MAKES = ["HeaderSender", "BatchedReply", "ReadyCheck", "PendingCheck"]
# A base class whose Python subclass's __init__ sets it up (its methods refuse until then).
SUBCLASSED = ["ConnectionCore"]


@pytest.mark.parametrize("name", ONLY_C_MAKES)
def test_the_types_only_c_makes_refuse_to_be_called(name: str) -> None:
    """Calling the type (or its __new__) is a TypeError on every version, never an
    instance with its fields unset (Python 3.9 has no
    Py_TPFLAGS_DISALLOW_INSTANTIATION; a PendingCheck made so crashed when stepped)."""
    made = getattr(_accel, name)
    with pytest.raises(TypeError, match=f"cannot create 'moderato._accel.{name}' instances"):
        made()
    with pytest.raises(TypeError, match=f"cannot create 'moderato._accel.{name}' instances"):
        made.__new__(made)


def test_no_type_is_made_with_its_fields_unset() -> None:
    """Every type of moderato._accel called bare is refused: its own tp_new wants its
    arguments, or it is one only the C makes; a type added without either shows here."""
    types = {name for name, value in vars(_accel).items() if isinstance(value, type)}
    assert set(ONLY_C_MAKES) | set(SUBCLASSED) <= types
    for name in sorted(types - set(SUBCLASSED)):
        with pytest.raises(TypeError):
            getattr(_accel, name)()
    core = _accel.ConnectionCore()
    with pytest.raises(RuntimeError, match="used before its __init__"):
        core._flush()
