"""The direct backend contract (moderato/backends/base.py: ``decide`` and ``BackendResult``).

Direct callers bring their own keys and scaled numbers: integer windows of
1 to 86,400 seconds, anything else refused before a key is touched, and a
low-level result whose permanent denial is ``retry_after == -1`` with
``reset_at is None``. Both backends, Redis (the suite's own server) and
memory://, hold the same contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis_servers import PATIENT_TIMEOUT_S, RedisServer

from moderato import RateLimitConfigError, RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.base import BackendResult
from moderato.backends.memory import MemoryBackend

WINDOW_REFUSAL = r"^window_s must be a whole number of seconds from 1 to 86400 \(the direct"


def script_calls(server: RedisServer) -> int:
    calls = 0
    for line in server.command("INFO", "commandstats").decode().splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls


class Store:
    """One backend under test, and what it holds."""

    def __init__(self, limiter: RateLimiter, server: Any) -> None:
        self.limiter = limiter
        self.backend: Any = limiter.backend
        self.server: Any = server

    def key_count(self) -> int:
        if isinstance(self.backend, MemoryBackend):
            return len(self.backend.store)
        reply = self.server.command("DBSIZE")
        return int(reply.decode().strip().lstrip(":"))

    def calls(self) -> int:
        """Script calls so far (memory://: none to count, so always 0)."""
        return 0 if self.server is None else script_calls(self.server)


@pytest.fixture(params=["redis", "memory"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "redis":
        url, server = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_server")
    else:
        url, server = "memory://", None
    async with RateLimiter(
        url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="direct"
    ) as limiter:
        yield Store(limiter, server)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("window_s", [86_401, 0, -60, 604_800, 311_040_000, 60.0, True, "60"])
async def test_a_window_outside_the_contract_is_refused_before_any_key(
    store: Store, algorithm: str, window_s: Any
) -> None:
    assert (await store.backend.decide(b"warm", capacity_scaled=5000, window_s=60)).allowed
    keys, calls = store.key_count(), store.calls()
    with pytest.raises(RateLimitConfigError, match=WINDOW_REFUSAL):
        await store.backend.decide(
            b"k", capacity_scaled=5000, window_s=window_s, algorithm=algorithm
        )
    # Refused in Python: not one script call, not one key.
    assert (store.key_count(), store.calls()) == (keys, calls)


async def test_the_error_names_the_window_and_the_way_to_longer_ones(store: Store) -> None:
    with pytest.raises(RateLimitConfigError) as refused:
        await store.backend.decide(b"k", capacity_scaled=5000, window_s=86_401)
    assert str(refused.value) == (
        "window_s must be a whole number of seconds from 1 to 86400 (the direct backend "
        "contract), got 86401; longer windows are for RateLimiter's rates, "
        "e.g. check(key, '100/week')"
    )
    assert store.key_count() == 0


async def test_a_day_is_the_longest_direct_window(store: Store) -> None:
    result = await store.backend.decide(b"day", capacity_scaled=2000, window_s=86_400)
    assert (result.allowed, result.remaining_scaled, result.retry_after) == (True, 1000, 0)
    assert result.reset_at is not None and result.reset_at % 86_400_000 == 0


async def test_the_limiters_rates_keep_their_longer_windows(store: Store) -> None:
    """The public grammar's week goes through the limiter's own path, not the direct one."""
    results = [await store.limiter.check_with_info("w", "2/week") for _ in range(3)]
    assert [r.allowed for r in results] == [True, True, False]
    assert {r.window_seconds for r in results} == {604_800}
    assert results[2].reset_at is not None and results[2].reset_at % 604_800 == 0  # a week's end


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_permanent_denial_is_minus_one_and_none(store: Store, algorithm: str) -> None:
    result = await store.backend.decide(
        b"p", capacity_scaled=5000, window_s=60, cost_scaled=5001, algorithm=algorithm
    )
    assert result == BackendResult(
        allowed=False, remaining_scaled=5000, retry_after=-1, reset_at=None
    )
    assert result.permanent
    # Nothing was charged: the whole capacity still fits.
    whole = await store.backend.decide(
        b"p", capacity_scaled=5000, window_s=60, cost_scaled=5000, algorithm=algorithm
    )
    assert (whole.allowed, whole.remaining_scaled, whole.retry_after) == (True, 0, 0)
    assert whole.reset_at is not None and not whole.permanent


async def test_a_fixed_window_in_the_contracts_units(store: Store) -> None:
    decide = store.backend.decide
    first = await decide("user:1", capacity_scaled=2500, window_s=60, cost_scaled=1000)
    second = await decide("user:1", capacity_scaled=2500, window_s=60, cost_scaled=1000)
    denied = await decide("user:1", capacity_scaled=2500, window_s=60, cost_scaled=1000)
    half = await decide("user:1", capacity_scaled=2500, window_s=60, cost_scaled=500)
    assert [(r.allowed, r.remaining_scaled) for r in (first, second, denied, half)] == [
        (True, 1500),
        (True, 500),
        (False, 500),  # a denial charges nothing
        (True, 0),
    ]
    assert first.retry_after == 0 and first.reset_at is not None
    assert first.reset_at % 60_000 == 0  # the window's end, on the backend's clock
    assert denied.reset_at == first.reset_at
    assert 0 < denied.retry_after <= 60_000


async def test_a_peek_answers_and_writes_nothing(store: Store) -> None:
    peek = await store.backend.decide(b"q", capacity_scaled=3000, window_s=10, apply=False)
    assert (peek.allowed, peek.remaining_scaled) == (True, 2000)
    assert store.key_count() == 0


async def test_a_custom_refill_rate_is_the_token_buckets_alone(store: Store) -> None:
    # 3 requests of burst, refilled at one per second: the fourth waits 1 s.
    results = [
        await store.backend.decide(
            b"t",
            capacity_scaled=3000,
            window_s=60,
            algorithm="token_bucket",
            refill_scaled_per_s=1000,
        )
        for _ in range(4)
    ]
    assert [r.allowed for r in results] == [True, True, True, False]
    assert 0 < results[3].retry_after <= 1000
    with pytest.raises(RateLimitConfigError, match="refill_scaled_per_s does not apply to gcra"):
        await store.backend.decide(
            b"g", capacity_scaled=3000, window_s=60, algorithm="gcra", refill_scaled_per_s=1000
        )
    # Slower than one capacity a day: refused by the script, before its key.
    keys = store.key_count()
    with pytest.raises(RateLimitConfigError, match="MODERATO_ARG"):
        await store.backend.decide(
            b"slow",
            capacity_scaled=86_400_000,
            window_s=60,
            algorithm="token_bucket",
            refill_scaled_per_s=999.5,
        )
    assert store.key_count() == keys


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"capacity_scaled": 5000.0}, r"^capacity_scaled must be an int \(1/1000 units"),
        ({"capacity_scaled": True}, r"^capacity_scaled must be an int"),
        ({"cost_scaled": "1000"}, r"^cost_scaled must be an int"),
        ({"algorithm": "fixed"}, r"^unknown algorithm 'fixed'"),
        ({"algorithm": "token_bucket", "refill_scaled_per_s": float("nan")}, "finite number"),
        ({"capacity_scaled": 0}, r"MODERATO_ARG ARGV\[3\] \(capacity_scaled of policy 1\)"),
        ({"cost_scaled": 0}, r"MODERATO_ARG ARGV\[1\] \(cost_scaled\)"),
    ],
)
async def test_bad_direct_arguments_are_config_errors_and_write_nothing(
    store: Store, arguments: dict[str, Any], message: str
) -> None:
    call = {"capacity_scaled": 5000, "window_s": 60, **arguments}
    with pytest.raises(RateLimitConfigError, match=message):
        await store.backend.decide(b"bad", **call)
    assert store.key_count() == 0
