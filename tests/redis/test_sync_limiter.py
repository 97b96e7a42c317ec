"""moderato.sync.RateLimiter: the asyncio limiter's API and rules, blocking, on memory:// and a
real redis-server, from threads. Exact counts throughout."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis_servers import PATIENT_TIMEOUT_S, RedisServer

import moderato
from moderato import (
    BackendError,
    BackendUnavailableError,
    CheckResult,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
)
from moderato.algorithms import ALGORITHMS
from moderato.errors import UnknownOptionError
from moderato.sync import ALL_CALLS, RateLimiter

NOW_MS = 1_800_000_000_000  # a fixed memory:// clock: no window boundary inside a test


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture
def memory() -> Iterator[RateLimiter]:
    limiter = RateLimiter("memory://", key_prefix="m")
    limiter.backend.clock = lambda: NOW_MS  # type: ignore[attr-defined]
    yield limiter
    limiter.close()


@pytest.fixture
def on_redis(redis_url: str) -> Iterator[RateLimiter]:
    limiter = RateLimiter(redis_url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="s")
    yield limiter
    limiter.close()


# -- the same API ---------------------------------------------------------------------


def test_the_same_constructor_and_methods_as_the_asyncio_limiter() -> None:
    asynchronous = inspect.signature(moderato.RateLimiter.__init__).parameters
    blocking = inspect.signature(RateLimiter.__init__).parameters
    # One difference: the connections (per event loop there, a pool per server here).
    assert set(asynchronous) - {"connections_per_loop"} == set(blocking) - {"max_connections"}
    for name in set(asynchronous) & set(blocking):
        assert asynchronous[name].default == blocking[name].default, name
    for method in ("check", "check_with_info", "get_usage", "reset"):
        theirs = inspect.signature(getattr(moderato.RateLimiter, method)).parameters
        ours = inspect.signature(getattr(RateLimiter, method)).parameters
        assert list(theirs) == list(ours), method
        assert [p.default for p in theirs.values()] == [p.default for p in ours.values()]
        assert not inspect.iscoroutinefunction(getattr(RateLimiter, method))
    with pytest.raises(UnknownOptionError, match="pool is max_connections="):
        RateLimiter("memory://", connections_per_loop=2)  # type: ignore[call-arg]
    with pytest.raises(RateLimitConfigError, match="denial cache is the asyncio RateLimiter's"):
        RateLimiter("memory://", denial_cache_size=10)
    with pytest.raises(UnknownOptionError, match="storage_uri= is slowapi's"):
        RateLimiter(storage_uri="memory://")  # type: ignore[call-arg]
    with pytest.raises(RateLimitConfigError, match="max_connections must be at least 1"):
        RateLimiter("redis://localhost", max_connections=0)
    with pytest.raises(RateLimitConfigError, match="the asyncio RateLimiter takes"):
        moderato.RateLimiter(redis.Redis())


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_every_algorithm_admits_exactly_the_limit(
    memory: RateLimiter, on_redis: RateLimiter, algorithm: str
) -> None:
    for limiter in (memory, on_redis):
        results = [limiter.check_with_info("u", "5/hour", algorithm=algorithm) for _ in range(8)]
        assert [r.allowed for r in results] == [True] * 5 + [False] * 3
        assert [r.remaining for r in results] == [4, 3, 2, 1, 0, 0, 0, 0]
        assert all(isinstance(r, CheckResult) and r.algorithm == algorithm for r in results)
        assert results[-1].retry_after is not None and results[-1].retry_after > 0
        with pytest.raises(RateLimitExceeded) as raised:
            limiter.check("u", "5/hour", algorithm=algorithm)
        assert raised.value.status_code == 429
        usage = limiter.get_usage("u", "5/hour", algorithm=algorithm)
        assert (usage["current"], usage["remaining"], usage["limit"]) == (5, 0, 5)


def test_multi_policy_tenants_costs_and_a_permanent_denial(on_redis: RateLimiter) -> None:
    limiter = on_redis
    result = limiter.check_with_info("u", "3/minute;5/hour", cost=2)
    assert (result.allowed, result.remaining, result.limit) == (True, 1, 3)
    assert [p.remaining for p in result.policies] == [1, 3]
    denied = limiter.check_with_info("u", "3/minute;5/hour", cost=2)
    assert not denied.allowed and denied.remaining == 1
    assert limiter.check_with_info("u", "3/minute;5/hour", cost=1).allowed
    # Tenants are separate quotas; tenant= is tenant_type='s alias.
    assert limiter.check_with_info("u", "1/hour", tenant_type="free").allowed
    assert not limiter.check_with_info("u", "1/hour", tenant="free").allowed
    assert limiter.check_with_info("u", "1/hour", tenant="pro").allowed
    with pytest.raises(RateLimitConfigError, match="both tenant_type= and tenant="):
        limiter.check("u", "1/hour", tenant_type="a", tenant="b")
    # A cost above capacity: denied for good, nothing charged, no retry hint.
    big = limiter.check_with_info("v", "10/minute", cost=11)
    assert (big.allowed, big.retry_after, big.reset_at, big.remaining) == (False, None, None, 10)
    with pytest.raises(RateLimitExceeded) as raised:
        limiter.check("v", "10/minute", cost=11)
    assert raised.value.status_code == 422 and raised.value.permanent
    with pytest.raises(RateLimitConfigError):
        limiter.check("v", "10/fortnight")
    with pytest.raises(RateLimitConfigError):
        limiter.check("v", "10/minute", cost=0)


def test_shadow_mode_and_identity_secret(redis_server: RedisServer, redis_url: str) -> None:
    shadow = RateLimiter(redis_url, key_prefix="sh", shadow=True)
    results = [shadow.check_with_info("u", "2/hour") for _ in range(4)]
    assert all(r.allowed for r in results)
    assert [r.shadow_denied for r in results] == [False, False, True, True]
    enforced = shadow.check_with_info("u", "2/hour", shadow=False)
    assert not enforced.allowed
    secret = RateLimiter(redis_url, key_prefix="sec", identity_secret=b"k" * 32)
    assert secret.check("alice@example.com", "2/hour")
    keys = [key.decode() for key in redis.Redis(port=redis_server.port).keys("sec:*")]
    assert len(keys) == 1 and "alice" not in keys[0]


def test_reset_by_scope_rate_and_everything(on_redis: RateLimiter) -> None:
    limiter = on_redis
    for scope in ("a", "b"):
        for algorithm in ("fixed_window", "token_bucket"):
            limiter.check("u", "2/hour", scope=scope, algorithm=algorithm)
    assert limiter.reset("u", rate="2/hour", scope="a", algorithm="token_bucket") == 1
    assert limiter.get_usage("u", "2/hour", scope="a", algorithm="token_bucket")["current"] == 0
    assert limiter.get_usage("u", "2/hour", scope="a")["current"] == 1
    assert limiter.reset("u", scope="a") == 1
    assert limiter.reset("u") == 2  # every scope: b's two
    assert limiter.get_usage("u", "2/hour", scope="b")["current"] == 0


# -- threads ---------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["memory://", "redis"])
def test_32_threads_on_one_key_admit_exactly_the_limit_on_every_algorithm(
    url: str, redis_url: str
) -> None:
    limiter = RateLimiter(redis_url if url == "redis" else url, key_prefix="threads")
    counts: dict[str, int] = {}
    for algorithm in ALGORITHMS:
        start = threading.Barrier(32)

        def hammer(_: int, algorithm: str = algorithm, start: threading.Barrier = start) -> int:
            start.wait()
            return sum(
                limiter.check_with_info("hot", "100/hour", algorithm=algorithm).allowed
                for _ in range(10)
            )

        with ThreadPoolExecutor(32) as pool:
            counts[algorithm] = sum(pool.map(hammer, range(32)))
    assert counts == dict.fromkeys(ALGORITHMS, 100)
    limiter.close()


# -- failure policy, breaker, metrics ----------------------------------------------------


def test_fail_closed_fail_open_and_the_breaker(own_redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    closed = RateLimiter(own_redis_server.url, key_prefix="f", breaker_failures=3)
    opened = RateLimiter(
        own_redis_server.url,
        key_prefix="f",
        fail_open=True,
        metrics_namespace="syncshop",
        metrics_registry=registry,
    )
    assert closed.check("k", "5/minute") and opened.check("k", "5/minute")
    assert sample(registry, "syncshop_checks_total", algorithm="fixed_window", result="allowed")
    own_redis_server.stop()
    for _ in range(3):
        with pytest.raises(BackendUnavailableError):
            closed.check("k", "5/minute")
    assert closed.breaker.state == "open"
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="circuit breaker is open"):
        closed.check("k", "5/minute")
    assert time.monotonic() - started < 0.05  # failing fast

    result = opened.check_with_info("k", "10/second;5/minute", algorithm="token_bucket")
    assert result.allowed and result.bypassed
    assert (result.remaining, result.retry_after, result.reset_at) == (None, None, None)
    assert sample(registry, "syncshop_fail_open_total", algorithm="token_bucket") == 1
    assert (
        sample(registry, "syncshop_checks_total", algorithm="token_bucket", result="bypassed") == 1
    )
    with pytest.raises(BackendError):
        opened.check_with_info("k", "5/minute", cost=6)  # never bypassed: no quota holds it
    with pytest.raises(BackendError):
        opened.get_usage("k", "5/minute")  # nor reads

    own_redis_server.start()
    deadline = time.monotonic() + 5
    while True:
        try:
            # The restarted server kept nothing (no persistence): a fresh quota.
            assert closed.check_with_info("k", "5/minute").remaining == 4
            break
        except BackendError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert closed.breaker.state == "closed"


# -- the decorator ---------------------------------------------------------------------


def test_limit_decorates_a_plain_function(memory: RateLimiter) -> None:
    calls: list[tuple[str, int]] = []

    @memory.limit("2/minute", key=lambda user, amount=1: f"user:{user}", cost=lambda *a, **k: 1)
    def pay(user: str, amount: int = 1) -> int:
        calls.append((user, amount))
        return amount

    assert pay("ann", 5) == 5 and pay("ann", amount=6) == 6
    with pytest.raises(RateLimitExceeded) as raised:
        pay("ann", 7)
    assert raised.value.retry_after is not None
    assert pay("bob") == 1  # a quota per user
    assert calls == [("ann", 5), ("ann", 6), ("bob", 1)]
    assert pay.__name__ == "pay"
    scope = f"{__name__}.test_limit_decorates_a_plain_function.<locals>.pay"
    assert memory.get_usage("user:ann", "2/minute", scope=scope)["current"] == 2

    @memory.limit("1/minute", tenant=lambda plan: plan)
    def report(plan: str) -> str:
        return plan

    assert report("free") == "free" and report("pro") == "pro"
    with pytest.raises(RateLimitExceeded):
        report("free")
    # Without key=, one quota for every call.
    scope = f"{__name__}.{report.__qualname__}"
    assert memory.get_usage(ALL_CALLS, "1/minute", tenant="pro", scope=scope)["current"] == 1


def test_limit_refuses_what_it_can_refuse_at_decoration(memory: RateLimiter) -> None:
    with pytest.raises(RateLimitConfigError, match="cost 11 exceeds capacity 10"):
        memory.limit("10/minute", cost=11)
    with pytest.raises(RateLimitConfigError):
        memory.limit("10/fortnight")
    with pytest.raises(RateLimitConfigError, match="unknown algorithm"):
        memory.limit("10/minute", algorithm="nope")
    # A keyword it does not take (a TypeError too), named with its options.
    with pytest.raises(UnknownOptionError, match=r"tennant= \(did you mean tenant=\?\); its"):
        memory.limit("10/minute", tennant="pro")  # type: ignore[call-arg]
    with pytest.raises(RateLimitConfigError, match="coroutine function"):

        @memory.limit("10/minute")
        async def fetch() -> None:
            pass

    @memory.limit("10/minute", key=lambda: 1 / 0)  # type: ignore[arg-type,misc]
    def broken() -> None:
        raise AssertionError("never runs")

    with pytest.raises(RateLimitCallbackError) as raised:
        broken()
    assert isinstance(raised.value.error, ZeroDivisionError)

    @memory.limit("10/minute", cost=lambda: 0)
    def free() -> None:
        raise AssertionError("never runs")

    with pytest.raises(RateLimitCallbackError, match="cost"):
        free()


def test_the_limiters_defaults_are_the_decorators(memory: RateLimiter) -> None:
    limiter = RateLimiter("memory://", key=lambda n: f"n{n}", cost=2, key_prefix="d")
    limiter.backend.clock = lambda: NOW_MS  # type: ignore[attr-defined]

    @limiter.limit("4/minute", scope="shared")
    def work(n: int) -> int:
        return n

    assert work(1) == 1 and work(1) == 1
    with pytest.raises(RateLimitExceeded):
        work(1)
    assert limiter.get_usage("n1", "4/minute", scope="shared")["current"] == 4


# -- one quota with the asyncio limiter --------------------------------------------------


def test_sync_and_async_limiters_share_one_quota_and_resets(redis_url: str) -> None:
    blocking = RateLimiter(redis_url, key_prefix="both")

    async def asynchronous(checks: int) -> list[bool]:
        limiter = moderato.RateLimiter(redis_url, key_prefix="both")
        try:
            return [(await limiter.check_with_info("u", "6/hour")).allowed for _ in range(checks)]
        finally:
            await limiter.close()

    assert [blocking.check_with_info("u", "6/hour").allowed for _ in range(3)] == [True] * 3
    assert asyncio.run(asynchronous(4)) == [True, True, True, False]
    assert not blocking.check_with_info("u", "6/hour").allowed
    assert blocking.reset("u") == 1
    assert asyncio.run(asynchronous(1)) == [True]
    assert blocking.get_usage("u", "6/hour")["current"] == 1


def test_a_reset_here_reaches_an_asyncio_limiters_denial_cache(redis_url: str) -> None:
    blocking = RateLimiter(redis_url, key_prefix="dc")

    async def scenario() -> list[bool]:
        limiter = moderato.RateLimiter(redis_url, key_prefix="dc", denial_cache_size=100)
        cache: Any = limiter.backend.cache  # type: ignore[attr-defined]
        try:
            for _ in range(2):
                await limiter.check_with_info("u", "1/hour")
            deadline = time.monotonic() + 5
            while not cache.subscribed:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert not (await limiter.check_with_info("u", "1/hour")).allowed
            assert len(cache) == 1
            await asyncio.get_running_loop().run_in_executor(None, blocking.reset, "u")
            while len(cache):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            return [(await limiter.check_with_info("u", "1/hour")).allowed]
        finally:
            await limiter.close()

    assert asyncio.run(scenario()) == [True]


def test_a_users_own_redis_py_client(redis_server: RedisServer, redis_url: str) -> None:
    own = redis.Redis(port=redis_server.port)
    limiter = RateLimiter(own, key_prefix="own")
    assert [limiter.check_with_info("u", "2/hour").allowed for _ in range(3)] == [True, True, False]
    own.script_flush()
    assert limiter.check_with_info("v", "2/hour").allowed  # loaded again after NOSCRIPT
    assert limiter.reset("u") == 1
    limiter.close()
    assert own.ping()  # still the user's, still open

    async def asyncio_client() -> redis.asyncio.Redis:
        # Python 3.9's asyncio locks need a running loop when redis.asyncio creates them.
        return redis.asyncio.Redis(port=redis_server.port)

    with pytest.raises(RateLimitConfigError, match="the blocking RateLimiter takes"):
        RateLimiter(asyncio.run(asyncio_client()))


def test_the_exceptions_survive_pickling_whole(memory: RateLimiter) -> None:
    """Celery and multiprocessing pickle a task's exception to send it to another process."""
    memory.check("p", "1/hour")
    with pytest.raises(RateLimitExceeded) as raised:
        memory.check("p", "1/hour")
    copy = pickle.loads(pickle.dumps(raised.value))
    assert type(copy) is RateLimitExceeded and str(copy) == str(raised.value)
    assert (copy.limit, copy.retry_after, copy.status_code) == (1, 3600, 429)
    callback = pickle.loads(pickle.dumps(RateLimitCallbackError("key", ValueError("bad"))))
    assert callback.callback == "key" and repr(callback.error) == "ValueError('bad')"
