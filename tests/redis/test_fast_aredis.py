"""The asyncio limiter's commonest check over one Redis server in one C call
(moderato/fast_aredis.py, csrc/fast_aredis.c), against real redis-servers.

Every check is compared with the Python method it stands for
(``check_with_info.__wrapped__``) on a twin limiter over the same server: the same
results and the same state left in Redis, every algorithm. Then what happens once
the command is queued: a paused server (the command timeout), a killed one (fail
closed, fail open), NOSCRIPT after SCRIPT FLUSH, a cancelled task, a check never
awaited, 300 tasks on one quota; the checks sent to the Python path; the
awaitable's coroutine protocol; and no leak in the C path.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any, Callable

import pytest
import pytest_asyncio
from one_call_helpers import Counted, comparable, redis_state, twin_cases
from redis_servers import RedisServer

from moderato import RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.errors import BackendError
from moderato.redis import RedisClient

PYTHON_CHECK = RateLimiter.check_with_info.__wrapped__  # type: ignore[attr-defined]


def client_of(limiter: RateLimiter) -> RedisClient:
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert type(client) is RedisClient
    return client


async def outcome(call: Callable[..., Any], *args: Any, **keywords: Any) -> Any:
    try:
        return comparable(await call(*args, **keywords))
    except Exception as error:
        return (type(error), str(error))


@pytest_asyncio.fixture
async def limiters(redis_url: str) -> AsyncIterator[tuple[RateLimiter, RateLimiter]]:
    fast = RateLimiter(redis_url, key_prefix="afast")
    slow = RateLimiter(redis_url, key_prefix="aslow")
    try:
        yield fast, slow
    finally:
        await fast.close()
        await slow.close()


async def test_one_server_takes_the_c_path(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="ac-path")
    assert type(limiter._fast_check) is _accel.AsyncRedisFastCheck
    counted = Counted(client_of(limiter))
    assert (await limiter.check_with_info("u0", "100/minute")).allowed  # makes the pool
    calls = [limiter.check_with_info(f"u{n % 5}", "100/minute") for n in range(1, 50)]
    assert all(type(call) is _accel.PendingCheck for call in calls)
    results = await asyncio.gather(*calls)
    assert [result.remaining for result in results[:5]] == [99, 99, 99, 99, 98]
    assert counted.calls == 1
    assert limiter._fast_check.compiled_count == 1
    await limiter.close()


async def test_other_backends_take_none(redis_url: str) -> None:
    assert type(RateLimiter("memory://")._fast_check) is _accel.FastCheck
    assert RateLimiter(redis_url, denial_cache_size=10)._fast_check is None
    tls = RateLimiter(redis_url.replace("redis://", "rediss://"))
    assert type(tls._fast_check) is _accel.AsyncRedisFastCheck  # through the transport


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_same_as_the_python_path(
    limiters: tuple[RateLimiter, RateLimiter], redis_server: RedisServer, algorithm: str
) -> None:
    fast, slow = limiters
    cases = twin_cases(algorithm)
    for limiter in limiters:
        await limiter.check_with_info("warm", "1/minute", algorithm=algorithm)
    for _ in range(6):
        for args, keywords in cases:
            assert await outcome(fast.check_with_info, *args, **keywords) == await outcome(
                PYTHON_CHECK, slow, *args, **keywords
            ), (args, keywords)
    fast_state = redis_state(redis_server, "afast")
    slow_state = redis_state(redis_server, "aslow")
    assert fast_state.keys() == slow_state.keys()
    if algorithm in ("fixed_window", "sliding_window", "sliding_log"):
        assert fast_state == slow_state  # counts: no clock in them


async def test_default_algorithm_denials_and_shadow(
    limiters: tuple[RateLimiter, RateLimiter],
) -> None:
    fast, slow = limiters
    for _ in range(5):
        assert await outcome(fast.check_with_info, "d", "2/minute") == await outcome(
            PYTHON_CHECK, slow, "d", "2/minute"
        )
    shadowed = await fast.check_with_info("d", "2/minute", shadow=True)
    assert shadowed.allowed and shadowed.shadow_denied
    fast.shadow = True
    assert (await fast.check_with_info("d", "2/minute")).shadow_denied
    denied = await fast.check_with_info("d", "2/minute", shadow=False)
    assert not denied.allowed and not denied.shadow_denied


async def test_declined_checks_go_to_the_python_path(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="adeclined")
    await limiter.check_with_info("w", "10/minute")
    counted = Counted(client_of(limiter))
    await limiter.check_with_info("a", "10/minute", tenant="t")
    await limiter.check_with_info("a", "10/minute", cost=2)
    await limiter.check_with_info("a", "10/minute", algorithm="token_bucket", burst=3)
    await limiter.check_with_info(b"a", "10/minute")  # type: ignore[arg-type]
    await limiter.check_with_info("a", "11/minute")  # no plan yet: made by the Python path
    assert counted.calls == 5
    await limiter.check_with_info("a", "11/minute")
    assert counted.calls == 5
    metered = RateLimiter(redis_url, key_prefix="adeclined", enable_metrics=True)
    await metered.check_with_info("w", "10/minute")
    counted = Counted(client_of(metered))
    await metered.check_with_info("w", "10/minute")
    assert counted.calls == 1
    await limiter.close()
    await metered.close()


async def test_no_running_loop_declines() -> None:
    limiter = RateLimiter("redis://127.0.0.1:1", key_prefix="aloop")
    call = limiter.check_with_info("x", "1/minute")  # the loop's first command: Python's
    assert type(call) is not _accel.PendingCheck
    call.close()


async def test_noscript_after_script_flush(redis_url: str, redis_server: RedisServer) -> None:
    limiter = RateLimiter(redis_url, key_prefix="anoscript")
    assert (await limiter.check_with_info("n", "5/minute")).remaining == 4
    counted = Counted(client_of(limiter))
    redis_server.command("SCRIPT", "FLUSH")
    first, second = await asyncio.gather(
        limiter.check_with_info("n", "5/minute"), limiter.check_with_info("n", "5/minute")
    )
    assert (first.remaining, second.remaining) == (3, 2)  # loaded once, both run once
    assert (await limiter.check_with_info("n", "5/minute")).remaining == 1
    assert counted.calls == 0
    await limiter.close()


async def test_paused_server_times_out_and_the_next_check_is_in_step(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="apaused", command_timeout_s=0.3)
    assert (await limiter.check_with_info("p", "100/minute")).remaining == 99
    assert (await limiter.check_with_info("p", "100/minute")).remaining == 98  # the C path
    own_redis_server.pause()
    try:
        started = time.monotonic()
        call = limiter.check_with_info("p", "100/minute")
        assert type(call) is _accel.PendingCheck
        with pytest.raises(BackendError, match="command timeout"):
            await call
        took = time.monotonic() - started
    finally:
        own_redis_server.resume()
    assert 0.25 <= took < 1.0
    # The resumed server ran the timed-out command: it counts, and its late reply
    # went to nobody else.
    assert (await limiter.check_with_info("p", "100/minute")).remaining == 96
    assert (await limiter.check_with_info("p", "100/minute")).remaining == 95
    await limiter.close()


@pytest.mark.parametrize("fail_open", [False, True])
async def test_killed_server(own_redis_server: RedisServer, fail_open: bool) -> None:
    limiter = RateLimiter(
        own_redis_server.url, key_prefix="akilled", fail_open=fail_open, command_timeout_s=0.3
    )
    await limiter.check_with_info("k", "100/minute")
    await limiter.check_with_info("k", "100/minute")
    calls = [limiter.check_with_info("k", "100/minute") for _ in range(3)]
    # fail_open turns metrics on: those checks are the Python path's.
    assert all((type(call) is _accel.PendingCheck) is not fail_open for call in calls)
    own_redis_server.stop()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for result in outcomes:
        if fail_open:
            assert not isinstance(result, BaseException)
            assert result.allowed and result.bypassed
        else:
            assert isinstance(result, BackendError)


async def test_cancelled_task_leaves_the_stream_in_step(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="acancel", command_timeout_s=2.0)
    await limiter.check_with_info("c", "100/minute")
    own_redis_server.pause()
    try:
        task = asyncio.ensure_future(limiter.check_with_info("c", "100/minute"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        own_redis_server.resume()
    # The cancelled command ran; its reply freed its slot and reached nobody.
    results = await asyncio.gather(*(limiter.check_with_info("c", "100/minute") for _ in range(3)))
    assert [result.remaining for result in results] == [97, 96, 95]
    await limiter.close()


async def test_a_check_never_awaited_was_sent(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="aunawaited")
    await limiter.check_with_info("u", "10/minute")
    call = limiter.check_with_info("u", "10/minute")
    assert type(call) is _accel.PendingCheck
    call.close()  # sent when called, as memory://'s is decided when called
    del call
    assert (await limiter.check_with_info("u", "10/minute")).remaining == 7
    await limiter.close()


async def test_the_awaitable_is_a_coroutine(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="acoro")
    await limiter.check_with_info("u", "10/minute")
    call = limiter.check_with_info("u", "10/minute")
    assert asyncio.iscoroutine(call)
    task = asyncio.create_task(call)  # type: ignore[arg-type]
    assert (await task).remaining == 8
    with pytest.raises(RuntimeError, match="already awaited"):
        call.send(None)
    thrown = limiter.check_with_info("u", "10/minute")
    with pytest.raises(ValueError, match="thrown"):
        thrown.throw(ValueError("thrown"))
    await limiter.close()


async def test_300_tasks_count_exactly(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="atasks")
    await limiter.check_with_info("warm", "10/minute")

    async def work() -> int:
        admitted = 0
        for _ in range(4):
            if (await limiter.check_with_info("shared", "1000/minute")).allowed:
                admitted += 1
        return admitted

    assert sum(await asyncio.gather(*(work() for _ in range(300)))) == 1000  # 1,200 checks
    assert (await limiter.check_with_info("shared", "1000/minute")).remaining == 0
    await limiter.close()


async def test_metrics_attached_in_flight_are_told(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="ametrics")
    await limiter.check_with_info("m", "10/minute")
    call = limiter.check_with_info("m", "10/minute")
    assert type(call) is _accel.PendingCheck
    told: list[Any] = []
    limiter.recorder = type(  # type: ignore[assignment]
        "Recorder", (), {"decided": lambda self, *args: told.append(args)}
    )()
    result = await call
    assert result.remaining == 8
    assert len(told) == 1 and told[0][1] == "m" and told[0][3] is result
    await limiter.close()


# -- no leak in the C path -----------------------------------------------------------

LEAK_CALLS = 20_000
LEAK_WARM_UP = 1_000
TRACED_GROWTH_BOUND_BYTES = 16 << 10


@pytest.mark.parametrize("rate", ["1000000/minute", "1/hour"], ids=["admitted", "denied"])
async def test_no_leaks(redis_url: str, rate: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="aleak")
    key, scope = "".join(["leak-", "key"]), "".join(["leak-", "scope"])
    rate = "".join([rate])  # counted: not an interned constant

    async def calls(times: int) -> None:
        for _ in range(times):
            await limiter.check_with_info(key, rate, scope=scope)

    await calls(LEAK_WARM_UP)
    gc.collect()
    counts = [sys.getrefcount(value) for value in (key, scope, rate)]
    await calls(LEAK_CALLS)
    gc.collect()
    assert [sys.getrefcount(value) for value in (key, scope, rate)] == counts
    tracemalloc.start()
    try:
        await calls(LEAK_WARM_UP)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await calls(LEAK_CALLS // 4)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < TRACED_GROWTH_BOUND_BYTES
    with contextlib.suppress(Exception):
        await limiter.close()
