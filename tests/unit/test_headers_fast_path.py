"""The legacy headers' shortcuts against report() + render(): legacy_for_one (one admitted
decision) and legacy_for_denial (a denial, whatever was decided before it)."""

from __future__ import annotations

import random
from typing import Optional

from moderato.errors import RateLimitExceeded, exceeded
from moderato.results import CheckResult, PolicyState
from moderato.web.headers import legacy_for_denial, legacy_for_one, render, report


def random_result(rng: random.Random) -> CheckResult:
    states = []
    for _ in range(rng.randint(0, 3)):
        limit = rng.choice((1, 5, 10, 100))
        remaining: Optional[int] = rng.randint(0, 3)  # small: ties are common
        if rng.random() < 0.05:
            remaining = None
        reset_at = rng.choice((None, 1796160000.0, 1796160000.2, 1796160059.999))
        states.append(PolicyState(limit, rng.choice((1, 60, 3600)), remaining, 0, reset_at))
    top = states[0] if states else PolicyState(7, 60, rng.randint(0, 3), 0, 1796160001.5)
    return CheckResult(
        allowed=rng.random() < 0.8,
        limit=top.limit,
        remaining=top.remaining if rng.random() < 0.95 else None,
        retry_after=rng.choice((None, 0, 3)),
        reset_at=top.reset_at,
        window_seconds=top.window_seconds,
        rate="r",
        algorithm="fixed_window",
        policies=tuple(states),
        bypassed=rng.random() < 0.05,
        shadow_denied=rng.random() < 0.05,
    )


def test_the_shortcut_renders_what_the_general_path_renders() -> None:
    rng = random.Random(18)
    taken = 0
    for _ in range(20_000):
        result = random_result(rng)
        quick = legacy_for_one(result)
        general = report([result])
        assert general is not None
        expected = render(general, "legacy", 1796160000.0)
        if quick is not None:
            taken += 1
            assert quick == expected, result
    assert taken > 10_000


def test_the_shortcut_declines_denials_and_bypasses() -> None:
    base = CheckResult(False, 5, 0, 3, 1796160000.0, 60, "5/minute", "fixed_window")
    assert legacy_for_one(base) is None
    bypass = CheckResult(True, 5, None, None, None, 60, "5/minute", "fixed_window", bypassed=True)
    assert legacy_for_one(bypass) is None
    admitted = CheckResult(True, 5, 4, 0, 1796160000.2, 60, "5/minute", "fixed_window")
    assert legacy_for_one(admitted) == [
        (b"x-ratelimit-limit", b"5"),
        (b"x-ratelimit-remaining", b"4"),
        (b"x-ratelimit-reset", b"1796160001"),
    ]


def test_the_denial_shortcut_renders_what_the_general_path_renders() -> None:
    rng = random.Random(1818)
    for _ in range(20_000):
        decisions = [random_result(rng) for _ in range(rng.randint(0, 3))]
        denied = random_result(rng)
        denial = exceeded(denied)
        general = report(decisions, denial)
        assert general is not None
        expected = render(general, "legacy", 1796160000.0)
        assert legacy_for_denial(decisions, denial) == expected, (decisions, denied)


def test_the_denial_shortcut_of_an_application_s_own_exception() -> None:
    own = RateLimitExceeded(
        limit=10, remaining=2, retry_after=7, reset_at=1796160000.5, window_seconds=60, rate="r"
    )
    assert legacy_for_denial([], own) == [
        (b"x-ratelimit-limit", b"10"),
        (b"x-ratelimit-remaining", b"2"),
        (b"x-ratelimit-reset", b"1796160001"),
        (b"retry-after", b"7"),
    ]
