"""RateLimiter with the GCRA, sliding log and leaky bucket algorithms, on a real redis-server."""

from __future__ import annotations

import asyncio
import time

import pytest

from moderato import RateLimitConfigError, RateLimiter
from moderato.algorithms import ALGORITHMS as REGISTRY

ALGORITHMS = ("gcra", "sliding_log", "leaky_bucket")


@pytest.fixture
async def limiter(redis_url: str):
    async with RateLimiter(redis_url, key_prefix="test") as limiter:
        yield limiter


def test_the_registry_names_tags_and_scripts() -> None:
    rows = {(a.name, a.key_tag, a.script) for a in REGISTRY.values()}
    assert {
        ("gcra", "gc", "gcra"),
        ("sliding_log", "sl", "sliding_log"),
        ("leaky_bucket", "lb", "leaky_bucket"),
    } <= rows
    assert len({a.key_tag for a in REGISTRY.values()}) == len(REGISTRY)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_500_concurrent_checks_admit_exactly_100(
    limiter: RateLimiter, algorithm: str
) -> None:
    results = await asyncio.gather(
        *(limiter.check_with_info("hot", "100/hour", algorithm=algorithm) for _ in range(500))
    )
    assert sum(r.allowed for r in results) == 100
    assert sorted(r.remaining for r in results if r.allowed) == list(range(100))
    denied = [r for r in results if not r.allowed]
    assert all(r.status_code == 429 and r.retry_after is not None for r in denied)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_default_algorithm_selects_it(redis_url: str, algorithm: str) -> None:
    async with RateLimiter(redis_url, key_prefix="test", default_algorithm=algorithm) as limiter:
        result = await limiter.check_with_info("user:d", "10/minute", cost=4)
        assert (result.allowed, result.remaining) == (True, 6)
        usage = await limiter.get_usage("user:d", "10/minute")
        assert (usage["algorithm"], usage["current"]) == (algorithm, 4)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_only_admitted_requests_are_charged(limiter: RateLimiter, algorithm: str) -> None:
    first = await limiter.check_with_info("user:1", "10/minute", cost=8, algorithm=algorithm)
    assert (first.allowed, first.remaining, first.retry_after) == (True, 2, 0)
    denied = await limiter.check_with_info("user:1", "10/minute", cost=3, algorithm=algorithm)
    assert (denied.allowed, denied.remaining, denied.limit) == (False, 2, 10)
    assert denied.retry_after is not None and denied.retry_after >= 1
    admitted = await limiter.check_with_info("user:1", "10/minute", cost=2, algorithm=algorithm)
    assert (admitted.allowed, admitted.remaining) == (True, 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_permanent_denial(limiter: RateLimiter, algorithm: str) -> None:
    await limiter.check("user:2", "100/minute", cost=10, algorithm=algorithm)
    decision = await limiter.check_with_info("user:2", "100/minute", cost=101, algorithm=algorithm)
    assert (decision.allowed, decision.permanent, decision.status_code) == (False, True, 422)
    assert decision.retry_after is None and decision.reset_at is None
    assert decision.remaining == 90


@pytest.mark.parametrize(
    ("algorithm", "reset_after_s"),
    # 6 of 60 units: drained again in 6 s (GCRA, leaky); the log recovers in a window.
    [("gcra", 6), ("leaky_bucket", 6), ("sliding_log", 60)],
)
async def test_reset_at(limiter: RateLimiter, algorithm: str, reset_after_s: int) -> None:
    before = time.time()
    result = await limiter.check_with_info("user:5", "60/minute", cost=6, algorithm=algorithm)
    assert result.reset_at is not None
    assert reset_after_s - 0.1 <= result.reset_at - before <= reset_after_s + 0.1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_usage_and_reset(limiter: RateLimiter, algorithm: str) -> None:
    for _ in range(3):
        await limiter.check("user:6", "10/hour", algorithm=algorithm, scope="api")
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["limit"], usage["current"], usage["remaining"]) == (10, 3, 7)
    # by exact keys (the SCAN form is algorithm-blind and tested in test_limiter.py)
    assert await limiter.reset("user:6", rate="10/hour", scope="api", algorithm=algorithm) == 1
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["current"], usage["remaining"]) == (0, 10)


async def test_reset_with_rate_covers_every_algorithm(limiter: RateLimiter) -> None:
    """Three policies of six algorithms: 18 base keys in one reset call."""
    rate = "10/second;100/minute;1000/hour"
    for algorithm in REGISTRY:
        await limiter.check("user:7", rate, algorithm=algorithm)
    # three counters each for the windowed algorithms' current windows, one key per
    # policy for the others
    assert await limiter.reset("user:7", rate=rate) == 3 * len(REGISTRY)
    for algorithm in REGISTRY:
        usage = await limiter.get_usage("user:7", rate, algorithm=algorithm)
        assert usage["current"] == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_several_policies_are_decided_atomically(
    limiter: RateLimiter, algorithm: str
) -> None:
    for _ in range(3):
        assert await limiter.check("user:8", "5/minute;3/hour", algorithm=algorithm)
    result = await limiter.check_with_info("user:8", "5/minute;3/hour", algorithm=algorithm)
    assert not result.allowed and result.limit == 3
    usage = await limiter.get_usage("user:8", "5/minute;3/hour", algorithm=algorithm)
    minute = usage["policies"][0]
    assert (minute["limit"], minute["current"]) == (5, 3)


def test_unknown_algorithm_lists_the_new_ones() -> None:
    with pytest.raises(RateLimitConfigError, match="'gcra', 'sliding_log', 'leaky_bucket'"):
        RateLimiter("redis://localhost:1", default_algorithm="gcra2")
