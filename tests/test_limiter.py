"""RateLimiter's manual API against a real redis-server, with the documented numbers, exactly."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import pytest
from example_helpers import clear_of_boundary
from redis_servers import RedisServer

from moderato import (
    BackendError,
    CheckResult,
    RateLimitConfigError,
    RateLimiter,
    RateLimitExceeded,
    parse_rate,
)
from moderato.algorithms import ALGORITHMS as REGISTRY

ALGORITHMS = tuple(REGISTRY)


@pytest.fixture(params=["built-in", "redis-py"])
async def limiter(redis_url: str, request: pytest.FixtureRequest):
    """The limiter over moderato's own client, and over a user's redis-py client."""
    if request.param == "built-in":
        # Exactness under bursts of hundreds of concurrent checks is what these tests
        # check; a busy machine must not turn a late reply into a failed check.
        async with RateLimiter(redis_url, key_prefix="test", command_timeout_s=10) as limiter:
            yield limiter
        return
    import redis.asyncio

    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=32, timeout=5)
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        async with RateLimiter(client, key_prefix="test") as limiter:
            yield limiter
    finally:
        await client.aclose()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_only_admitted_requests_are_charged(limiter: RateLimiter, algorithm: str) -> None:
    # Seed: under 10/minute, after 8 units a cost-3 request is refused without
    # charge (2 remaining) and a cost-2 request still fits.
    first = await limiter.check_with_info("user:1", "10/minute", cost=8, algorithm=algorithm)
    assert (first.allowed, first.remaining, first.retry_after) == (True, 2, 0)
    denied = await limiter.check_with_info("user:1", "10/minute", cost=3, algorithm=algorithm)
    assert (denied.allowed, denied.remaining, denied.limit) == (False, 2, 10)
    assert denied.retry_after is not None and denied.retry_after >= 1
    assert denied.status_code == 429
    admitted = await limiter.check_with_info("user:1", "10/minute", cost=2, algorithm=algorithm)
    assert (admitted.allowed, admitted.remaining) == (True, 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_permanent_denial_has_no_retry_and_charges_nothing(
    limiter: RateLimiter, algorithm: str
) -> None:
    await limiter.check("user:2", "100/minute", cost=10, algorithm=algorithm)
    decision = await limiter.check_with_info("user:2", "100/minute", cost=101, algorithm=algorithm)
    assert not decision.allowed
    assert decision.retry_after is None and decision.reset_at is None
    assert decision.permanent and decision.status_code == 422
    assert decision.remaining == 90
    with pytest.raises(RateLimitExceeded) as info:
        await limiter.check("user:2", "100/minute", cost=101, algorithm=algorithm)
    assert (info.value.status_code, info.value.retry_after, info.value.reset_at) == (
        422,
        None,
        None,
    )
    assert info.value.limit == 100
    # Smaller requests still use the uncharged quota.
    usage = await limiter.get_usage("user:2", "100/minute", algorithm=algorithm)
    assert (usage["current"], usage["remaining"]) == (10, 90)


async def test_check_raises_429_with_retry_after(limiter: RateLimiter) -> None:
    for _ in range(3):
        assert await limiter.check("user:3", "3/minute") is True
    with pytest.raises(RateLimitExceeded) as info:
        await limiter.check("user:3", "3/minute")
    error = info.value
    assert (error.status_code, error.limit, error.remaining, error.window_seconds) == (
        429,
        3,
        0,
        60,
    )
    now = time.time()
    assert error.retry_after is not None and 1 <= error.retry_after <= 60
    assert error.reset_at is not None and now < error.reset_at <= now + 60.001
    # Fixed windows are aligned to wall-clock multiples of the window.
    assert error.reset_at % 60 == 0


async def test_fixed_window_reset_is_the_window_end(limiter: RateLimiter) -> None:
    result = await limiter.check_with_info("user:4", "5/second")
    assert result.reset_at is not None
    assert result.reset_at == int(result.reset_at)  # a whole second: the end of a 1 s window
    assert 0 < result.reset_at - time.time() <= 1.001


async def test_token_bucket_reset_on_admission_is_full_refill_time(limiter: RateLimiter) -> None:
    before = time.time()
    result = await limiter.check_with_info("user:5", "60/minute", cost=6, algorithm="token_bucket")
    # 6 of 60 tokens refill at one per second: full again 6 s later.
    assert result.reset_at is not None
    assert 5.9 <= result.reset_at - before <= 6.1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_usage_and_reset(limiter: RateLimiter, algorithm: str) -> None:
    for _ in range(3):
        await limiter.check("user:6", "10/hour", algorithm=algorithm, scope="api")
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["limit"], usage["current"], usage["remaining"]) == (10, 3, 7)
    assert usage["window_seconds"] == 3600
    # Other scopes and tenants are separate quotas.
    other = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="other")
    assert other["current"] == 0
    tenant = await limiter.get_usage(
        "user:6", "10/hour", algorithm=algorithm, scope="api", tenant_type="premium"
    )
    assert tenant["current"] == 0
    assert await limiter.reset("user:6", scope="api") == 1
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["current"], usage["remaining"]) == (0, 10)


async def test_reset_with_rate_deletes_exact_keys(limiter: RateLimiter) -> None:
    for algorithm in ALGORITHMS:
        await limiter.check("user:7", "10/minute;100/day", algorithm=algorithm)
    assert await limiter.reset("user:7", rate="10/minute;100/day") == 2 * len(ALGORITHMS)
    for algorithm in ALGORITHMS:
        usage = await limiter.get_usage("user:7", "10/minute;100/day", algorithm=algorithm)
        assert usage["current"] == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_several_policies_are_decided_atomically(
    limiter: RateLimiter, algorithm: str
) -> None:
    # The hourly policy runs out first; its denial must not charge the minute one.
    for _ in range(3):
        assert (await limiter.check_with_info("u8", "5/minute;3/hour", algorithm=algorithm)).allowed
    denied = await limiter.check_with_info("u8", "5/minute;3/hour", algorithm=algorithm)
    assert not denied.allowed
    assert (denied.limit, denied.window_seconds, denied.remaining) == (3, 3600, 0)
    assert [p.remaining for p in denied.policies] == [2, 0]
    minute = await limiter.get_usage("u8", "5/minute", algorithm=algorithm)
    assert minute["current"] == 3


async def test_admission_reports_the_policy_with_fewest_remaining(limiter: RateLimiter) -> None:
    result = await limiter.check_with_info("u9", "10/second;50/day", cost=5)
    assert (result.limit, result.remaining, result.window_seconds) == (10, 5, 1)
    result = await limiter.check_with_info("u10", "100/second;50/day", cost=5)
    assert (result.limit, result.remaining, result.window_seconds) == (50, 45, 86400)


async def test_algorithms_never_share_keys(limiter: RateLimiter) -> None:
    # A route switching algorithm must not meet a WRONGTYPE error or old state.
    for algorithm in ALGORITHMS:
        result = await limiter.check_with_info("same", "4/minute", cost=3, algorithm=algorithm)
        assert (result.allowed, result.remaining) == (True, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "0/minute"}, "0/minute"),
        ({"rate": "9007199255/second"}, "9007199255"),
        ({"rate": "10/fortnight"}, "fortnight"),
        ({"rate": 10}, "rate must be a string"),
        ({"cost": 0}, "cost"),
        ({"cost": -1}, "cost"),
        ({"cost": 1.5}, "float"),
        ({"cost": True}, "bool"),
        ({"cost": "1"}, "str"),
        ({"algorithm": "leaky"}, "unknown algorithm 'leaky'"),
        ({"key": 12}, "key must be a str or bytes"),
        ({"tenant_type": 3}, "tenant_type"),
    ],
)
async def test_bad_input_is_a_config_error_before_redis(kwargs: dict, message: str) -> None:
    # Port 1 refuses connections: a config error must win before any I/O.
    limiter = RateLimiter("redis://127.0.0.1:1", key_prefix="test")
    call = {"key": "user", "rate": "10/minute", **kwargs}
    key, rate = call.pop("key"), call.pop("rate")
    for method in (limiter.check, limiter.check_with_info):
        with pytest.raises(RateLimitConfigError, match=message):
            await method(key, rate, **call)


def test_parse_rate_is_public_and_raises_value_error() -> None:
    assert [(r.limit, r.window_s) for r in parse_rate("10/second;1000/day")] == [
        (10, 1),
        (1000, 86400),
    ]
    assert [(r.limit, r.window_s) for r in parse_rate("100 per 5 minutes")] == [(100, 300)]
    with pytest.raises(ValueError, match="fortnight"):
        parse_rate("1/fortnight")


def test_bad_constructor_options() -> None:
    with pytest.raises(RateLimitConfigError, match="algorithm"):
        RateLimiter("redis://localhost", default_algorithm="nope")
    with pytest.raises(RateLimitConfigError, match="prefix"):
        RateLimiter("redis://localhost", key_prefix="a{b}")
    with pytest.raises(RateLimitConfigError):
        RateLimiter("http://localhost")


async def test_backend_down_raises_backend_error() -> None:
    limiter = RateLimiter("redis://127.0.0.1:1", key_prefix="test")
    with pytest.raises(BackendError):
        await limiter.check("user", "10/minute")
    with pytest.raises(BackendError):
        await limiter.connect()
    with pytest.raises(BackendError):
        await limiter.get_usage("user", "10/minute")
    with pytest.raises(BackendError):
        await limiter.reset("user")


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


def _process_worker(url: str, algorithm: str, count: int, start_at: float, out) -> None:
    async def run() -> int:
        async with RateLimiter(url, key_prefix="test") as limiter:
            while time.time() < start_at:
                await asyncio.sleep(0.001)
            results = await asyncio.gather(
                *(
                    limiter.check_with_info("shared", "100/hour", algorithm=algorithm)
                    for _ in range(count)
                )
            )
            return sum(r.allowed for r in results)

    out.put(asyncio.run(run()))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_500_checks_from_4_processes_admit_exactly_100(redis_url: str, algorithm: str) -> None:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 1.5
    workers = [
        context.Process(target=_process_worker, args=(redis_url, algorithm, 125, start_at, out))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    admitted = [out.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
    assert sum(admitted) == 100


def test_one_limiter_from_several_event_loops(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="test")
    admitted: list[int] = []

    def worker() -> None:
        async def run() -> int:
            results = await asyncio.gather(
                *(limiter.check_with_info("loops", "40/hour") for _ in range(25))
            )
            return sum(r.allowed for r in results)

        admitted.append(asyncio.run(run()))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(admitted) and sum(admitted) == 40
    # A fresh loop after the others closed still works.
    assert asyncio.run(limiter.check_with_info("loops", "40/hour")).allowed is False


async def test_scripts_reload_after_flush_and_restart(own_redis_server: RedisServer) -> None:
    async with RateLimiter(own_redis_server.url, key_prefix="test") as limiter:
        assert await limiter.check("k", "10/minute")
        own_redis_server.command("SCRIPT", "FLUSH")
        results = await asyncio.gather(
            *(limiter.check_with_info("k", "10/minute") for _ in range(5))
        )
        assert sorted(r.remaining for r in results) == [4, 5, 6, 7, 8]
        own_redis_server.restart()
        deadline = time.monotonic() + 2
        result: CheckResult | None = None
        while time.monotonic() < deadline:
            try:
                result = await limiter.check_with_info("k", "10/minute")
                break
            except BackendError:
                await asyncio.sleep(0.05)
        # The restarted server kept nothing: a fresh quota, and the script loaded again.
        assert result is not None and result.remaining == 9


async def test_reset_leaves_a_longer_prefix_alone(redis_url: str) -> None:
    # "app" and "app:x" share a Redis: resetting under "app" must not reach "app:x".
    async with (
        RateLimiter(redis_url, key_prefix="app") as short,
        RateLimiter(redis_url, key_prefix="app:x") as longer,
    ):
        await short.check("user", "10/minute")
        await longer.check("user", "10/minute")
        assert await short.reset("user") == 1
        assert (await longer.get_usage("user", "10/minute"))["current"] == 1
        assert (await short.get_usage("user", "10/minute"))["current"] == 0


# -- per algorithm -----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_default_algorithm_selects_it(redis_url: str, algorithm: str) -> None:
    async with RateLimiter(redis_url, key_prefix="test", default_algorithm=algorithm) as limiter:
        result = await limiter.check_with_info("user:d", "10/minute", cost=4)
        assert (result.allowed, result.remaining) == (True, 6)
        usage = await limiter.get_usage("user:d", "10/minute")
        assert (usage["algorithm"], usage["current"]) == (algorithm, 4)


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
async def test_usage_and_reset_by_exact_keys(limiter: RateLimiter, algorithm: str) -> None:
    for _ in range(3):
        await limiter.check("user:6", "10/hour", algorithm=algorithm, scope="api")
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["limit"], usage["current"], usage["remaining"]) == (10, 3, 7)
    # by exact keys (the SCAN form is algorithm-blind and tested above)
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


def test_unknown_algorithm_lists_every_algorithm() -> None:
    with pytest.raises(RateLimitConfigError, match="'gcra', 'sliding_log', 'leaky_bucket'"):
        RateLimiter("redis://localhost:1", default_algorithm="gcra2")


async def test_tenant_is_an_alias_of_tenant_type_on_every_manual_call(
    limiter: RateLimiter,
) -> None:
    # The rules call it tenant=, the manual API tenant_type=: both name one counter.
    await clear_of_boundary(86_400, margin_s=30.0)  # one fixed day window throughout
    rate = "3/day"
    for _ in range(3):
        assert await limiter.check("user:7", rate, tenant="gold", scope="alias")
    denied = await limiter.check_with_info("user:7", rate, tenant_type="gold", scope="alias")
    assert (denied.allowed, denied.remaining) == (False, 0)
    denied = await limiter.check_with_info("user:7", rate, tenant="gold", scope="alias")
    assert (denied.allowed, denied.remaining) == (False, 0)
    other = await limiter.check_with_info("user:7", rate, scope="alias")  # no tenant
    assert (other.allowed, other.remaining) == (True, 2)
    usage = await limiter.get_usage("user:7", rate, tenant="gold", scope="alias")
    assert (usage["current"], usage["remaining"]) == (3, 0)
    assert await limiter.reset("user:7", rate=rate, tenant="gold", scope="alias") == 1
    usage = await limiter.get_usage("user:7", rate, tenant_type="gold", scope="alias")
    assert (usage["current"], usage["remaining"]) == (0, 3)
    usage = await limiter.get_usage("user:7", rate, scope="alias")  # untouched by the reset
    assert (usage["current"], usage["remaining"]) == (1, 2)


async def test_tenant_and_tenant_type_together_are_refused_before_anything_is_charged(
    limiter: RateLimiter,
) -> None:
    both = {"tenant": "gold", "tenant_type": "silver"}
    calls = {
        "check() or check_with_info()": lambda: limiter.check("user:8", "3/day", **both),
        "check() or check_with_info() ": lambda: limiter.check_with_info("user:8", "3/day", **both),
        "get_usage()": lambda: limiter.get_usage("user:8", "3/day", **both),
        "reset()": lambda: limiter.reset("user:8", **both),
    }
    for where, call in calls.items():
        with pytest.raises(RateLimitConfigError) as refused:
            await call()
        assert str(refused.value) == (
            f"{where.strip()} got both tenant_type= and tenant= (its alias); pass one of them"
        )
    for tenant in ("gold", "silver"):
        usage = await limiter.get_usage("user:8", "3/day", tenant=tenant)
        assert usage["current"] == 0
