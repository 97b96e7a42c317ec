"""The blocking limiter's commonest check over one Redis server in one C call
(moderato/fast_redis.py, csrc/fast_redis.c), against real redis-servers.

Every check is compared with the Python method it stands for
(``check_with_info.__wrapped__``) on a twin limiter over the same server: the same
results and the same state left in Redis, every algorithm. Then what happens after
the command is sent: a paused server (the command timeout), a killed one (fail
closed, fail open), NOSCRIPT after SCRIPT FLUSH, fork(), 32 threads on one limiter;
the checks sent to the Python path; and no leak in the C path.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from example_helpers import clear_of_boundary_blocking
from fork_helpers import in_child
from one_call_helpers import Counted, comparable, redis_state, twin_cases
from redis_servers import RedisServer

from moderato import _accel
from moderato.algorithms import ALGORITHMS
from moderato.errors import BackendError
from moderato.redis.blocking import RedisClient
from moderato.sync import RateLimiter

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the one-call path is Linux's (kernel timeouts)"
)

PYTHON_CHECK = RateLimiter.check_with_info.__wrapped__  # type: ignore[attr-defined]


def client_of(limiter: RateLimiter) -> RedisClient:
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert type(client) is RedisClient
    return client


def outcome(call: Callable[..., Any], *args: Any, **keywords: Any) -> Any:
    try:
        return comparable(call(*args, **keywords))
    except Exception as error:
        return (type(error), str(error))


@pytest.fixture
def limiters(redis_url: str) -> Iterator[tuple[RateLimiter, RateLimiter]]:
    fast = RateLimiter(redis_url, key_prefix="fast")
    slow = RateLimiter(redis_url, key_prefix="slow")
    try:
        yield fast, slow
    finally:
        fast.close()
        slow.close()


def test_one_server_takes_the_c_path(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="c-path")
    assert type(limiter._fast_check) is _accel.RedisFastCheck
    counted = Counted(client_of(limiter))
    for n in range(50):
        assert limiter.check_with_info(f"u{n % 5}", "100/minute").allowed
    assert counted.calls == 1  # the first: no idle connection yet
    assert limiter._fast_check.compiled_count == 1
    assert client_of(limiter).open_connections == 1
    assert client_of(limiter).idle_connections == 1
    limiter.close()


def test_other_backends_take_none(redis_url: str) -> None:
    assert RateLimiter("memory://")._fast_check is not None
    assert type(RateLimiter("memory://")._fast_check) is not _accel.RedisFastCheck
    tls = RateLimiter(redis_url.replace("redis://", "rediss://"))
    assert tls._fast_check is None


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_same_as_the_python_path(
    limiters: tuple[RateLimiter, RateLimiter], redis_server: RedisServer, algorithm: str
) -> None:
    fast, slow = limiters
    cases = twin_cases(algorithm)
    for limiter in limiters:
        limiter.check_with_info("warm", "1/minute", algorithm=algorithm)
    for _ in range(6):
        for args, keywords in cases:
            assert outcome(fast.check_with_info, *args, **keywords) == outcome(
                PYTHON_CHECK, slow, *args, **keywords
            ), (args, keywords)
    fast_state = redis_state(redis_server, "fast")
    slow_state = redis_state(redis_server, "slow")
    assert fast_state.keys() == slow_state.keys()
    if algorithm in ("fixed_window", "sliding_window", "sliding_log"):
        assert fast_state == slow_state  # counts: no clock in them


def test_default_algorithm_and_denials(limiters: tuple[RateLimiter, RateLimiter]) -> None:
    fast, slow = limiters
    for _ in range(5):
        assert outcome(fast.check_with_info, "d", "2/minute") == outcome(
            PYTHON_CHECK, slow, "d", "2/minute"
        )
    shadowed = fast.check_with_info("d", "2/minute", shadow=True)
    assert shadowed.allowed and shadowed.shadow_denied


def test_declined_checks_go_to_the_python_path(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="declined")
    limiter.check_with_info("w", "10/minute")
    counted = Counted(client_of(limiter))
    limiter.check_with_info("a", "10/minute", tenant="t")
    limiter.check_with_info("a", "10/minute", cost=2)
    limiter.check_with_info("a", "10/minute", algorithm="token_bucket", burst=3)
    limiter.check_with_info(b"a", "10/minute")
    limiter.check_with_info("a", "11/minute")  # no plan yet: made by the Python path
    assert counted.calls == 5
    limiter.check_with_info("a", "11/minute")
    assert counted.calls == 5
    metered = RateLimiter(redis_url, key_prefix="declined", enable_metrics=True)
    metered.check_with_info("w", "10/minute")
    counted = Counted(client_of(metered))
    metered.check_with_info("w", "10/minute")
    assert counted.calls == 1
    limiter.close()
    metered.close()


def test_noscript_after_script_flush(redis_url: str, redis_server: RedisServer) -> None:
    limiter = RateLimiter(redis_url, key_prefix="noscript")
    counted = Counted(client_of(limiter))
    assert limiter.check_with_info("n", "5/minute").remaining == 4
    redis_server.command("SCRIPT", "FLUSH")
    assert limiter.check_with_info("n", "5/minute").remaining == 3  # loaded, run once
    assert limiter.check_with_info("n", "5/minute").remaining == 2
    assert counted.calls == 1
    assert client_of(limiter).open_connections == 1
    limiter.close()


def test_paused_server_times_out_and_the_next_check_is_in_step(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="paused", command_timeout_s=0.3)
    # A timeout makes this test last about a second (more under the sanitizers): it
    # must not straddle a window's boundary, or the counts start again mid-test.
    clear_of_boundary_blocking(3600, margin_s=5.0)
    assert limiter.check_with_info("p", "100/hour").remaining == 99
    assert limiter.check_with_info("p", "100/hour").remaining == 98  # the C path
    own_redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError, match="command timeout"):
            limiter.check_with_info("p", "100/hour")
        took = time.monotonic() - started
    finally:
        own_redis_server.resume()
    assert 0.25 <= took < 1.0
    assert client_of(limiter).open_connections == 0  # closed, not given back
    # The resumed server ran the timed-out command: it counts.
    assert limiter.check_with_info("p", "100/hour").remaining == 96
    assert limiter.check_with_info("p", "100/hour").remaining == 95
    limiter.close()


@pytest.mark.parametrize("fail_open", [False, True])
def test_killed_server(own_redis_server: RedisServer, fail_open: bool) -> None:
    limiter = RateLimiter(
        own_redis_server.url, key_prefix="killed", fail_open=fail_open, command_timeout_s=0.3
    )
    limiter.check_with_info("k", "100/minute")
    limiter.check_with_info("k", "100/minute")
    own_redis_server.stop()
    if fail_open:
        result = limiter.check_with_info("k", "100/minute")
        assert result.allowed and result.bypassed
    else:
        with pytest.raises(BackendError):
            limiter.check_with_info("k", "100/minute")
    assert client_of(limiter).open_connections == 0
    limiter.close()


def test_fork_child_opens_its_own(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="forked")
    clear_of_boundary_blocking(3600, margin_s=5.0)  # a fork takes a while: one window
    assert limiter.check_with_info("f", "100/hour").remaining == 99
    assert limiter.check_with_info("f", "100/hour").remaining == 98

    def child() -> list[int]:
        client = client_of(limiter)
        assert client.open_connections == 0 and client.idle_connections == 0
        return [limiter.check_with_info("f", "100/hour").remaining for _ in range(3)]

    assert in_child(child) == [97, 96, 95]
    assert limiter.check_with_info("f", "100/hour").remaining == 94  # the parent's, in step
    assert client_of(limiter).open_connections == 1
    limiter.close()


def test_32_threads_count_exactly(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="threads")
    limiter.check_with_info("warm", "10/minute")
    admitted = [0] * 32

    def work(index: int) -> None:
        for _ in range(60):
            if limiter.check_with_info("shared", "1000/minute").allowed:
                admitted[index] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 1000  # 1,920 checks of a quota of 1,000
    assert limiter.check_with_info("shared", "1000/minute").remaining == 0
    assert client_of(limiter).open_connections <= limiter.max_connections
    limiter.close()


# -- no leak in the C path -----------------------------------------------------------

LEAK_CALLS = 20_000
LEAK_WARM_UP = 1_000
RSS_GROWTH_BOUND_BYTES = 2 << 20
TRACED_GROWTH_BOUND_BYTES = 16 << 10


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("rate", ["1000000/minute", "1/hour"], ids=["admitted", "denied"])
def test_no_leaks(redis_url: str, rate: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="leak")
    key, scope = "".join(["leak-", "key"]), "".join(["leak-", "scope"])
    rate = "".join([rate])  # counted: not an interned constant

    def calls(times: int) -> None:
        for _ in range(times):
            limiter.check_with_info(key, rate, scope=scope)

    calls(LEAK_WARM_UP)
    gc.collect()
    counts = [sys.getrefcount(value) for value in (key, scope, rate)]
    rss_before = rss_bytes()
    calls(LEAK_CALLS)
    gc.collect()
    assert [sys.getrefcount(value) for value in (key, scope, rate)] == counts
    assert rss_bytes() - rss_before < RSS_GROWTH_BOUND_BYTES
    tracemalloc.start()
    try:
        calls(LEAK_WARM_UP)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        calls(LEAK_CALLS // 4)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert after - before < TRACED_GROWTH_BOUND_BYTES
    with contextlib.suppress(Exception):
        limiter.close()
