"""Fail closed / fail open, the circuit breaker, shadow mode and metrics, on real servers."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer

from moderato import (
    BackendError,
    BackendUnavailableError,
    RateLimitConfigError,
    RateLimiter,
    RateLimitExceeded,
)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def until_recovered(limiter: RateLimiter, key: str, rate: str, timeout_s: float = 3.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await limiter.check_with_info(key, rate)
        except BackendError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_fail_closed_is_the_default(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="t")
    assert await limiter.check("k", "5/minute")
    own_redis_server.stop()
    with pytest.raises(BackendError):
        await limiter.check("k", "5/minute")
    with pytest.raises(BackendError):
        await limiter.check_with_info("k", "5/minute")
    await limiter.close()


async def test_fail_open_bypasses_and_counts(own_redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="t",
        fail_open=True,
        metrics_namespace="shop",
        metrics_registry=registry,
    )
    assert limiter.enable_metrics  # fail-open turns metrics on
    assert (await limiter.check_with_info("k", "5/minute")).remaining == 4
    own_redis_server.stop()

    assert await limiter.check("k", "5/minute") is True
    result = await limiter.check_with_info("k", "10/second;5/minute", algorithm="token_bucket")
    assert result.allowed and result.bypassed
    assert (result.remaining, result.retry_after, result.reset_at) == (None, None, None)
    assert (result.limit, result.window_seconds) == (5, 60)  # the configuration is still known
    assert [p.remaining for p in result.policies] == [None, None]

    assert sample(registry, "shop_fail_open_total", algorithm="fixed_window") == 1
    assert sample(registry, "shop_fail_open_total", algorithm="token_bucket") == 1
    assert sample(registry, "shop_checks_total", algorithm="fixed_window", result="bypassed") == 1
    assert sample(registry, "shop_checks_total", algorithm="fixed_window", result="allowed") == 1

    # Never bypassed: oversized costs, bad configuration, usage reads and resets.
    with pytest.raises(BackendError):
        await limiter.check_with_info("k", "5/minute", cost=6)
    with pytest.raises(RateLimitConfigError):
        await limiter.check_with_info("k", "5/fortnight")
    with pytest.raises(RateLimitConfigError):
        await limiter.check_with_info("k", "5/minute", cost=0)
    with pytest.raises(BackendError):
        await limiter.get_usage("k", "5/minute")
    with pytest.raises(BackendError):
        await limiter.reset("k")
    with pytest.raises(BackendError):
        await limiter.connect()

    # Redis returns (empty: it keeps nothing): normal decisions resume by themselves.
    own_redis_server.start()
    await asyncio.sleep(limiter.breaker.cooldown_s)
    recovered = await until_recovered(limiter, "k", "5/minute")
    assert (recovered.allowed, recovered.bypassed, recovered.remaining) == (True, False, 4)
    await limiter.close()


def test_fail_open_needs_the_metrics_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(RateLimitConfigError, match=r"moderato\[metrics\]"):
        RateLimiter("redis://127.0.0.1:1", fail_open=True, metrics_registry=CollectorRegistry())


async def test_app_can_start_during_an_outage(own_redis_server: RedisServer) -> None:
    own_redis_server.stop()
    limiter = RateLimiter(own_redis_server.url, key_prefix="t")  # no eager connect
    with pytest.raises(BackendError):
        await limiter.check("k", "5/minute")
    own_redis_server.start()
    await asyncio.sleep(limiter.breaker.cooldown_s)
    assert (await until_recovered(limiter, "k", "5/minute")).remaining == 4
    await limiter.close()


async def test_breaker_opens_fails_fast_and_closes_after_a_probe(
    own_redis_server: RedisServer,
) -> None:
    registry = CollectorRegistry()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="t",
        enable_metrics=True,
        metrics_registry=registry,
        breaker_failures=3,
        breaker_cooldown_s=0.3,
    )
    assert await limiter.check("k", "50/minute")
    own_redis_server.stop()
    for _ in range(3):
        with pytest.raises(BackendUnavailableError):  # no answer: what the breaker counts
            await limiter.check("k", "50/minute")
    assert limiter.breaker.state == "open"
    assert sample(registry, "moderato_circuit_breaker_state") == 1

    started = time.perf_counter()
    with pytest.raises(BackendError, match="circuit breaker is open"):
        await limiter.check("k", "50/minute")
    assert time.perf_counter() - started < 0.01  # no connect attempt, no timeout
    assert (
        sample(
            registry,
            "moderato_backend_operations_total",
            operation="decide",
            status="short_circuited",
        )
        == 1
    )

    own_redis_server.start()
    await asyncio.sleep(0.35)
    result = await limiter.check_with_info("k", "50/minute")  # the probe
    assert result.allowed and limiter.breaker.state == "closed"
    assert sample(registry, "moderato_circuit_breaker_state") == 0
    await limiter.close()


async def test_an_error_reply_fails_its_own_check_and_never_opens_the_breaker(
    redis_url: str, redis_server: RedisServer
) -> None:
    """One identity's state is of the wrong type: Redis answers its checks with an
    error. They fail, each with that error; the other identity is decided exactly
    in between, and the breaker (two failures would open it) stays closed."""
    registry = CollectorRegistry()
    limiter = RateLimiter(
        redis_url,
        key_prefix="poison",
        enable_metrics=True,
        metrics_registry=registry,
        breaker_failures=2,
    )
    rate = "5/day"
    assert (await limiter.check_with_info("broken", rate, algorithm="token_bucket")).allowed
    reply = redis_server.command("KEYS", "poison:*broken*")
    keys = [line for line in reply.split(b"\r\n") if line.startswith(b"poison:")]
    assert len(keys) == 1
    redis_server.command("DEL", keys[0].decode())
    redis_server.command("RPUSH", keys[0].decode(), "not a bucket")
    try:
        for number in range(8):
            failed = await asyncio.gather(
                *(
                    limiter.check_with_info("broken", rate, algorithm="token_bucket")
                    for _ in range(3)
                ),
                return_exceptions=True,
            )
            for error in failed:
                assert isinstance(error, BackendError), error
                assert not isinstance(error, BackendUnavailableError), error
                assert "MODERATO_STATE" in str(error) and "WRONGTYPE" in str(error), error
            result = await limiter.check_with_info("fine", rate, algorithm="token_bucket")
            assert (result.allowed, result.remaining) == (number < 5, max(4 - number, 0))
        assert limiter.breaker.state == "closed"
        assert sample(registry, "moderato_circuit_breaker_state") == 0
        assert (
            sample(
                registry, "moderato_backend_operations_total", operation="decide", status="error"
            )
            == 3 * 8
        )
        assert (
            sample(
                registry,
                "moderato_backend_operations_total",
                operation="decide",
                status="short_circuited",
            )
            == 0
        )
    finally:
        await limiter.close()


async def test_a_bad_identity_is_a_config_error_even_with_the_breaker_open(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="t",
        fail_open=True,
        metrics_registry=CollectorRegistry(),
        breaker_failures=1,
        breaker_cooldown_s=30,
    )
    own_redis_server.stop()
    assert (await limiter.check_with_info("k", "50/minute")).bypassed
    assert limiter.breaker.state == "open"
    # the open breaker short-circuits good checks (bypassed), never a bad key
    assert (await limiter.check_with_info("k", "50/minute")).bypassed
    with pytest.raises(RateLimitConfigError, match="key must be a str or bytes identity"):
        await limiter.check_with_info(42, "50/minute")  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match="tenant_type must be a string or None"):
        await limiter.check_with_info("k", "50/minute", tenant_type=7)  # type: ignore[arg-type]
    # refused before the backend was asked: the breaker stays as it was
    assert limiter.breaker.state == "open"
    await limiter.close()


async def test_hung_redis_never_hangs_a_check(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="t", command_timeout_s=0.2)
    assert await limiter.check("k", "50/minute")
    own_redis_server.pause()
    try:
        for _ in range(3):
            started = time.perf_counter()
            with pytest.raises(BackendError):
                await limiter.check("k", "50/minute")
            assert time.perf_counter() - started < 0.35
    finally:
        own_redis_server.resume()
    await limiter.close()


async def test_shadow_mode_decides_but_never_denies(redis_url: str) -> None:
    registry = CollectorRegistry()
    async with RateLimiter(
        redis_url, key_prefix="t", shadow=True, enable_metrics=True, metrics_registry=registry
    ) as limiter:
        outcomes = [await limiter.check_with_info("s", "3/minute") for _ in range(5)]
        assert [r.allowed for r in outcomes] == [True] * 5
        assert [r.shadow_denied for r in outcomes] == [False, False, False, True, True]
        assert [r.remaining for r in outcomes] == [2, 1, 0, 0, 0]
        assert await limiter.check("s", "3/minute") is True
        # Denied requests are not charged, in shadow as otherwise.
        assert (await limiter.get_usage("s", "3/minute"))["current"] == 3
        # Enforcing one call on a shadow limiter.
        with pytest.raises(RateLimitExceeded):
            await limiter.check("s", "3/minute", shadow=False)
    shadowed = sample(
        registry, "moderato_checks_total", algorithm="fixed_window", result="shadow_denied"
    )
    assert shadowed == 3
    assert sample(registry, "moderato_checks_total", algorithm="fixed_window", result="denied") == 1


async def test_per_call_shadow_on_an_enforcing_limiter(redis_url: str) -> None:
    async with RateLimiter(redis_url, key_prefix="t") as limiter:
        for _ in range(2):
            await limiter.check("p", "2/minute")
        assert await limiter.check("p", "2/minute", shadow=True) is True
        with pytest.raises(RateLimitExceeded):
            await limiter.check("p", "2/minute")


async def test_metrics_count_each_outcome(redis_url: str) -> None:
    registry = CollectorRegistry()
    async with RateLimiter(
        redis_url, key_prefix="t", enable_metrics=True, metrics_registry=registry
    ) as limiter:
        for _ in range(4):
            await limiter.check_with_info("m", "3/minute", algorithm="sliding_window")
        await limiter.get_usage("m", "3/minute", algorithm="sliding_window")
    labels = {"algorithm": "sliding_window"}
    assert sample(registry, "moderato_checks_total", result="allowed", **labels) == 3
    assert sample(registry, "moderato_checks_total", result="denied", **labels) == 1
    assert sample(registry, "moderato_limit_exceeded_total", **labels) == 1
    assert sample(registry, "moderato_check_duration_seconds_count", **labels) == 4
    assert (
        sample(registry, "moderato_backend_operations_total", operation="decide", status="ok") == 4
    )
    assert (
        sample(registry, "moderato_backend_operations_total", operation="usage", status="ok") == 1
    )
    # Labels never carry keys or identities.
    names = {s.name for m in registry.collect() for s in m.samples}
    labels_seen = {k for m in registry.collect() for s in m.samples for k in s.labels}
    assert labels_seen <= {"algorithm", "result", "operation", "status", "le"}
    assert "moderato_circuit_breaker_state" in names


@pytest.mark.parametrize("outage", ["killed", "frozen"])
async def test_a_returning_redis_is_used_within_the_breaker_cooldown(
    own_redis_server: RedisServer, outage: str
) -> None:
    # docs/operations.md: with the breaker open, the next probe finds Redis back
    # at most breaker_cooldown_s after it returns (plus the probe's own round trip).
    cooldown_s = 0.6
    limiter = RateLimiter(
        own_redis_server.url, key_prefix="t", breaker_cooldown_s=cooldown_s, command_timeout_s=0.2
    )
    assert await limiter.check("k", "100000/minute")
    if outage == "killed":
        own_redis_server.stop()
    else:
        own_redis_server.pause()
    failed_until = time.monotonic() + 1.5
    while time.monotonic() < failed_until:  # steady traffic: the breaker opens and probes
        with pytest.raises(BackendError):
            await limiter.check("k", "100000/minute")
        await asyncio.sleep(0.01)
    if outage == "killed":
        own_redis_server.start()
    else:
        own_redis_server.resume()
    back = time.monotonic()
    result = await until_recovered(limiter, "k", "100000/minute")
    recovered_after_s = time.monotonic() - back
    assert result.allowed and limiter.breaker.state == "closed"
    # Generous slack for a loaded machine; the bound that matters is the cool-down.
    assert recovered_after_s < cooldown_s + 0.3, recovered_after_s
    await limiter.close()
