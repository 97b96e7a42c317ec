"""RateLimiter on memory://: the manual API's documented numbers, the in-process burst checks,
threads, the bounded table, and the store's own operations.

Time is an injected clock (``MemoryBackend.clock``), so every number is exact.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from moderato import (
    BackendError,
    RateLimitConfigError,
    RateLimiter,
    RateLimitExceeded,
    _accel,
)
from moderato.algorithms import ALGORITHMS
from moderato.backends import memory as memory_module
from moderato.backends.memory import MemoryBackend
from moderato.backends.redis import RedisBackend

ALGORITHM_NAMES = tuple(ALGORITHMS)
# A minute boundary (and an hour one): windows line up with the numbers below.
START_MS = 1_800_000_000_000


class FakeClock:
    """Unix milliseconds that only move when a test says so."""

    def __init__(self, now_ms: int = START_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, delta_ms: int) -> int:
        self.now_ms += delta_ms
        return self.now_ms


def memory_backend(limiter: RateLimiter) -> MemoryBackend:
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    return backend


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> RateLimiter:
    limiter = RateLimiter("memory://", key_prefix="test")
    memory_backend(limiter).clock = clock
    return limiter


def test_the_backend_is_public_and_its_clock_drives_decisions() -> None:
    limiter = RateLimiter("memory://")
    assert isinstance(limiter.backend, MemoryBackend)
    assert isinstance(RateLimiter("redis://127.0.0.1:1").backend, RedisBackend)
    with pytest.raises(AttributeError):
        limiter.backend = MemoryBackend()  # type: ignore[misc]


async def test_a_replaced_clock_decides_windows(limiter: RateLimiter, clock: FakeClock) -> None:
    # limiter.backend.clock, as a user's test would set it (the fixture does).
    clock.now_ms = 28_333_334 * 60_000 - 1  # the last millisecond of a minute
    assert (await limiter.check_with_info("u", "1/minute")).allowed
    assert not (await limiter.check_with_info("u", "1/minute")).allowed
    clock.advance(1)
    result = await limiter.check_with_info("u", "1/minute")
    assert result.allowed
    assert result.reset_at == 28_333_335 * 60


def test_the_store_is_the_compiled_one() -> None:
    assert set(ALGORITHMS) <= set(_accel.MEMORY_ALGORITHMS)
    assert _accel.MemoryStore.__module__ == "moderato._accel"


# -- the manual API, with test_limiter.py's numbers --------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_only_admitted_requests_are_charged(limiter: RateLimiter, algorithm: str) -> None:
    first = await limiter.check_with_info("user:1", "10/minute", cost=8, algorithm=algorithm)
    assert (first.allowed, first.remaining, first.retry_after) == (True, 2, 0)
    denied = await limiter.check_with_info("user:1", "10/minute", cost=3, algorithm=algorithm)
    assert (denied.allowed, denied.remaining, denied.limit) == (False, 2, 10)
    assert denied.retry_after is not None and denied.retry_after >= 1
    assert denied.status_code == 429
    admitted = await limiter.check_with_info("user:1", "10/minute", cost=2, algorithm=algorithm)
    assert (admitted.allowed, admitted.remaining) == (True, 0)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
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
    usage = await limiter.get_usage("user:2", "100/minute", algorithm=algorithm)
    assert (usage["current"], usage["remaining"]) == (10, 90)


async def test_check_raises_429_with_exact_retry_after(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    clock.advance(15_250)  # 15.25 s into the minute
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
    assert error.retry_after == 45  # 44.75 s, rounded up
    assert error.reset_at == (START_MS + 60_000) / 1000


async def test_fixed_window_reset_is_the_window_end(limiter: RateLimiter, clock: FakeClock) -> None:
    clock.advance(400)
    result = await limiter.check_with_info("user:4", "5/second")
    assert result.reset_at == (START_MS + 1000) / 1000


async def test_token_bucket_reset_on_admission_is_full_refill_time(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    result = await limiter.check_with_info("user:5", "60/minute", cost=6, algorithm="token_bucket")
    # 6 of 60 tokens refill at one per second: full again exactly 6 s later.
    assert result.reset_at == (START_MS + 6000) / 1000


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_usage_and_reset_with_rate(limiter: RateLimiter, algorithm: str) -> None:
    for _ in range(3):
        await limiter.check("user:6", "10/hour", algorithm=algorithm, scope="api")
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["limit"], usage["current"], usage["remaining"]) == (10, 3, 7)
    assert usage["window_seconds"] == 3600
    other = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="other")
    assert other["current"] == 0
    tenant = await limiter.get_usage(
        "user:6", "10/hour", algorithm=algorithm, scope="api", tenant_type="premium"
    )
    assert tenant["current"] == 0
    assert await limiter.reset("user:6", rate="10/hour", scope="api", algorithm=algorithm) == 1
    usage = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="api")
    assert (usage["current"], usage["remaining"]) == (0, 10)


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_reset_without_rate_deletes_every_window(
    limiter: RateLimiter, algorithm: str
) -> None:
    await limiter.check("user:6", "10/hour;20/day", algorithm=algorithm, scope="api")
    await limiter.check("user:6", "10/hour", algorithm=algorithm, scope="other")
    assert await limiter.reset("user:6", scope="api") == 2
    usage = await limiter.get_usage("user:6", "10/hour;20/day", algorithm=algorithm, scope="api")
    assert usage["current"] == 0
    other = await limiter.get_usage("user:6", "10/hour", algorithm=algorithm, scope="other")
    assert other["current"] == 1


async def test_delete_matching_takes_the_key_pattern_form(limiter: RateLimiter) -> None:
    backend = memory_backend(limiter)
    for algorithm in ALGORITHM_NAMES:
        await limiter.check("a", "10/minute;100/day", algorithm=algorithm, scope="api")
        await limiter.check("ab", "10/minute", algorithm=algorithm, scope="api")
    # <prefix>:??:{<tenant>:<scope>:<identity>}:*, as _accel.key_pattern documents it.
    assert await backend.delete_matching(b"test:??:{:api:a}:*") == 2 * len(ALGORITHM_NAMES)
    usage = await limiter.get_usage("ab", "10/minute", scope="api")
    assert usage["current"] == 1


async def test_reset_with_rate_deletes_exact_keys(limiter: RateLimiter) -> None:
    for algorithm in ALGORITHM_NAMES:
        await limiter.check("user:7", "10/minute;100/day", algorithm=algorithm)
    assert await limiter.reset("user:7", rate="10/minute;100/day") == 2 * len(ALGORITHM_NAMES)
    for algorithm in ALGORITHM_NAMES:
        usage = await limiter.get_usage("user:7", "10/minute;100/day", algorithm=algorithm)
        assert usage["current"] == 0


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_several_policies_are_decided_atomically(
    limiter: RateLimiter, algorithm: str
) -> None:
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
    for algorithm in ALGORITHM_NAMES:
        result = await limiter.check_with_info("same", "4/minute", cost=3, algorithm=algorithm)
        assert (result.allowed, result.remaining) == (True, 1)


async def test_windows_roll_over_on_the_injected_clock(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    for _ in range(2):
        assert (await limiter.check_with_info("u11", "2/second")).allowed
    assert not (await limiter.check_with_info("u11", "2/second")).allowed
    clock.advance(999)
    assert not (await limiter.check_with_info("u11", "2/second")).allowed
    clock.advance(1)
    assert (await limiter.check_with_info("u11", "2/second")).allowed


# -- configuration and refusals ---------------------------------------------------------------


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
async def test_bad_input_is_a_config_error(
    limiter: RateLimiter, kwargs: dict[str, object], message: str
) -> None:
    call: dict[str, object] = {"key": "user", "rate": "10/minute", **kwargs}
    key, rate = call.pop("key"), call.pop("rate")
    for method in (limiter.check, limiter.check_with_info):
        with pytest.raises(RateLimitConfigError, match=message):
            await method(key, rate, **call)  # type: ignore[arg-type]
    assert len(memory_backend(limiter).store) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1000, 2, 5000, 60), r'^fixed_window: MODERATO_ARG ARGV\[2\] \(apply\) .* got "2"$'),
        ((0, 1, 5000, 60), r"^fixed_window: MODERATO_ARG ARGV\[1\] \(cost_scaled\)"),
        (
            (1000, 1, 0, 60),
            r"^fixed_window: MODERATO_ARG ARGV\[3\] \(capacity_scaled of policy 1\)",
        ),
        (
            (1000, 1, 5000, 311_040_001),
            r"^fixed_window: MODERATO_ARG ARGV\[4\] \(window_s of policy 1\)",
        ),
        ((1000, 1, 5000), r"^fixed_window: MODERATO_ARG expected 4 arguments for 1 policies"),
    ],
)
async def test_bad_backend_arguments_are_config_errors(
    limiter: RateLimiter, args: tuple[object, ...], message: str
) -> None:
    backend = memory_backend(limiter)
    with pytest.raises(RateLimitConfigError, match=message):
        backend.decide_now(ALGORITHMS["fixed_window"], [b"k"], args)  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match=r"^reset: MODERATO_ARG ARGV\[1\]"):
        await backend.reset([b"k"], [0])
    assert len(backend.store) == 0


async def test_unusable_state_is_a_backend_error_and_writes_nothing(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    backend = memory_backend(limiter)
    key = b"k:" + str(clock.now_ms // 60_000).encode()
    backend.store.load(key, -5, -1)
    before = backend.store.dump(clock.now_ms)
    with pytest.raises(BackendError, match=r'^fixed_window: MODERATO_STATE key "k:\d+" holds "-5"'):
        await backend.decide(b"k", capacity_scaled=5000, window_s=60)
    backend.store.load(b"t:bucket:v2", 7, -1)
    with pytest.raises(BackendError, match=r"MODERATO_STATE .* cannot be read: WRONGTYPE"):
        await backend.decide(b"t", capacity_scaled=5000, window_s=60, algorithm="token_bucket")
    assert backend.store.dump(clock.now_ms) == {**before, b"t:bucket:v2": (7, -1)}


@pytest.mark.parametrize(
    ("url", "max_entries"),
    [("memory://", 1_000_000), ("memory:///", 1_000_000), ("memory://?max_entries=7", 7)],
)
def test_memory_urls(url: str, max_entries: int) -> None:
    backend = memory_backend(RateLimiter(url))
    assert backend.store.max_entries == max_entries


@pytest.mark.parametrize(
    "url",
    [
        "memory://host",
        "memory://?max_entries=0",
        "memory://?max_entries=-1",
        "memory://?max_entries=x",
        "memory://?size=3",
        "memory:/path",
    ],
)
def test_bad_memory_urls(url: str) -> None:
    with pytest.raises(RateLimitConfigError, match="memory"):
        RateLimiter(url)


def test_the_per_process_warning_is_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_module, "_announced", threading.Lock())
    with caplog.at_level(logging.INFO, logger="moderato"):
        RateLimiter("memory://")
        RateLimiter("memory://?max_entries=10")
        MemoryBackend()
    records = [r for r in caplog.records if "memory://" in r.getMessage()]
    assert len(records) == 1
    assert records[0].name == "moderato" and records[0].levelno == logging.WARNING
    assert "each one enforces its own quota" in records[0].getMessage()


# -- the in-process checks: burst, second key, paced client --------------------------------

SEED_BURST = 20
SEED_RATE_PER_S = 50


async def seed_decide(backend: MemoryBackend, key: bytes) -> tuple[bool, int]:
    """One seed-004 token-bucket decision: (allowed, retry ms).

    Burst 20 refilled at 50 per second: a direct backend call with a custom refill rate.
    """
    result = await backend.decide(
        key,
        capacity_scaled=SEED_BURST * 1000,
        window_s=1,
        algorithm="token_bucket",
        refill_scaled_per_s=SEED_RATE_PER_S * 1000,
    )
    return result.allowed, result.retry_after


async def test_seed_004_a_200_request_burst_admits_exactly_the_bucket(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    backend = memory_backend(limiter)
    start_ms = clock.now_ms
    admitted, retry_after = 0, set()
    for i in range(200):
        clock.now_ms = start_ms + i * 18 // 200  # 200 requests within 18 ms
        allowed, retry_ms = await seed_decide(backend, b"key-a")
        if allowed:
            admitted += 1
        else:
            retry_after.add(-(-retry_ms // 1000))  # seconds, rounded up
        if i == 100:  # another key in the middle of the burst
            other, _ = await seed_decide(backend, b"key-b")
            assert other
    assert admitted == SEED_BURST
    assert retry_after == {1}


async def test_seed_004_a_client_paced_at_80_percent_is_never_limited(
    limiter: RateLimiter, clock: FakeClock
) -> None:
    backend = memory_backend(limiter)
    # 40 requests per second for 80 requests, after a burst that emptied the bucket.
    for _ in range(SEED_BURST):
        assert (await seed_decide(backend, b"paced"))[0]
    for _ in range(80):
        clock.advance(1000 // 40)
        allowed, _ = await seed_decide(backend, b"paced")
        assert allowed


async def test_seed_004_on_the_public_api(limiter: RateLimiter, clock: FakeClock) -> None:
    # "50/second" as a token bucket: burst 50, refill 50 per second.
    results = [
        await limiter.check_with_info("api-key-a", "50/second", algorithm="token_bucket")
        for _ in range(200)
    ]
    assert sum(r.allowed for r in results) == 50
    assert {r.retry_after for r in results if not r.allowed} == {1}
    other = await limiter.check_with_info("api-key-b", "50/second", algorithm="token_bucket")
    assert other.allowed
    clock.advance(1000)
    for _ in range(80):
        clock.advance(25)
        assert (
            await limiter.check_with_info("api-key-a", "50/second", algorithm="token_bucket")
        ).allowed


# -- threads and event loops --------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
def test_threads_with_their_own_loops_admit_exactly_the_limit(algorithm: str) -> None:
    limiter = RateLimiter("memory://", key_prefix="threads")
    memory_backend(limiter).clock = FakeClock()
    threads, per_thread, limit = 8, 400, 1000
    admitted = [0] * threads
    start = threading.Barrier(threads)

    def worker(index: int) -> None:
        async def run() -> None:
            for _ in range(per_thread):
                result = await limiter.check_with_info(
                    "shared", f"{limit}/minute;{limit * 2}/hour", algorithm=algorithm
                )
                admitted[index] += result.allowed

        start.wait()
        asyncio.run(run())

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert sum(admitted) == limit


# -- the bounded table --------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
async def test_a_million_identities_stay_within_the_cap() -> None:
    cap = 100_000
    limiter = RateLimiter("memory://?max_entries=100000", key_prefix="flood")
    backend = memory_backend(limiter)
    clock = FakeClock()
    backend.clock = clock
    gc.collect()
    before = rss_bytes()
    started_s = time.perf_counter()
    for i in range(cap):
        await limiter.check_with_info(f"client-{i}", "10/minute")
    gc.collect()
    at_cap = rss_bytes()
    for i in range(cap, 1_000_000):
        await limiter.check_with_info(f"client-{i}", "10/minute")
    gc.collect()
    after = rss_bytes()
    elapsed_s = time.perf_counter() - started_s
    store = backend.store
    assert len(store) == cap
    assert store.evictions == 1_000_000 - cap
    # The first cap entries cost what they cost (keys of ~40 bytes; 300 bytes each is
    # generous); the next 900,000 identities evict as they come and add nothing.
    assert at_cap - before < cap * 300 + store.slot_count * 8 + (4 << 20), (before, at_cap)
    assert after - at_cap < 4 << 20, (at_cap, after)
    # The most recent identity is still there, the first one was evicted.
    assert (await limiter.get_usage("client-999999", "10/minute"))["current"] == 1
    assert (await limiter.get_usage("client-0", "10/minute"))["current"] == 0
    print(
        f"\n1,000,000 identities, cap {cap}: RSS +{(at_cap - before) / 2**20:.1f} MiB to the cap, "
        f"+{(after - at_cap) / 2**20:.1f} MiB after; {elapsed_s:.1f} s"
    )


def test_least_recently_used_entries_are_evicted_first() -> None:
    store = _accel.MemoryStore(3)
    now = START_MS
    args = (1000, 1, 5000, 60)
    for key in (b"a", b"b", b"c"):
        store.decide("fixed_window", [key], args, now)
    store.decide("fixed_window", [b"a"], (0, 0, 5000, 60), now)  # a peek is a use too
    store.decide("fixed_window", [b"d"], args, now)
    index = now // 60_000
    assert sorted(store.dump(now)) == [f"{k}:{index}".encode() for k in "acd"]
    assert (len(store), store.evictions) == (3, 1)


def test_sweep_drops_expired_entries_and_full_buckets() -> None:
    store = _accel.MemoryStore(1000)
    now = START_MS
    store.decide("fixed_window", [b"fw"], (1000, 1, 5000, 1), now)
    store.decide("sliding_window", [b"sw"], (1000, 1, 5000, 1), now)
    store.decide("token_bucket", [b"tb"], (1000, 1, 5000, 10, ""), now)
    store.decide("token_bucket", [b"slow"], (1000, 1, 5000, 86_400, ""), now)
    assert len(store) == 4
    assert store.sweep(now + 1000) == 0  # the fixed window ends at now + 1000 inclusive
    assert store.sweep(now + 1001) == 1
    # One of 5 tokens refills in 2 s: full, hence gone, at now + 2000.
    assert store.sweep(now + 1999) == 0
    assert store.sweep(now + 2000) == 1
    assert store.sweep(now + 2001) == 1  # the sliding counter outlives the next window
    assert sorted(store.dump(now + 2001)) == [b"slow:bucket:v2"]
    assert len(store) == 1


def test_sweep_in_slices_covers_the_whole_table() -> None:
    store = _accel.MemoryStore(100_000)
    now = START_MS
    for i in range(5000):
        store.decide("fixed_window", [f"k{i}".encode()], (1000, 1, 5000, 1), now)
    # Slices of 1024 entries: one pass over the table takes 5 calls, the table
    # shrinking as it empties.
    calls, most_calls = 0, 5
    while len(store) > 0 and calls < most_calls:
        store.sweep(now + 1001, 1024)
        calls += 1
    assert len(store) == 0 and store.slot_count == 16


def test_decide_sweeps_a_slice_every_so_many_decisions() -> None:
    store = _accel.MemoryStore(1000, sweep_every=3, sweep_entries=1_000_000)
    now = START_MS
    for i in range(5):
        store.decide("fixed_window", [f"old{i}".encode()], (1000, 1, 5000, 1), now)
    # Decisions 1..5 ran; the sweep at decision 3 found nothing expired.
    assert len(store) == 5
    later = now + 1001  # every window above has ended
    store.decide("fixed_window", [b"new"], (1000, 1, 5000, 1), later)  # decision 6: sweeps
    assert sorted(store.dump(later)) == [b"new:" + str(later // 1000).encode()]
    assert len(store) == 1
    # A refusal is not a decision: it neither sweeps nor counts toward one.
    for i in range(4):
        store.decide("fixed_window", [f"x{i}".encode()], (1000, 1, 5000, 1), later)
    with pytest.raises(ValueError, match="MODERATO_ARG"):
        store.decide("fixed_window", [b"bad"], (1000, 1, 0, 1), later + 5000)
    assert len(store) == 5


def test_decide_without_now_reads_the_wall_clock() -> None:
    store = _accel.MemoryStore(10)
    before_ms = time.time_ns() // 1_000_000
    reply = store.decide("fixed_window", [b"k"], (1000, 1, 5000, 1), None)
    after_ms = time.time_ns() // 1_000_000
    # The window's end, reset_ms, is the next whole second after the clock read.
    assert (before_ms // 1000 + 1) * 1000 <= reply[4] <= (after_ms // 1000 + 1) * 1000
    (key,) = store.dump(after_ms)
    assert before_ms // 1000 <= int(key.split(b":")[1]) <= after_ms // 1000


@pytest.mark.parametrize("options", [{"sweep_every": -1}, {"sweep_entries": -1}])
def test_sweep_options_must_not_be_negative(options: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="sweep_every and sweep_entries must be 0 or more"):
        _accel.MemoryStore(10, **options)


def test_the_backend_sweeps_as_it_decides(clock: FakeClock) -> None:
    backend = MemoryBackend(clock=clock)
    assert (backend.store.sweep_every, backend.store.sweep_entries) == (
        memory_module.SWEEP_EVERY,
        memory_module.SWEEP_ENTRIES,
    )


def test_the_table_grows_and_shrinks() -> None:
    store = _accel.MemoryStore(1_000_000)
    now = START_MS
    for i in range(10_000):
        store.decide("fixed_window", [f"k{i}".encode()], (1000, 1, 5000, 1), now)
    assert len(store) == 10_000 and store.slot_count >= 20_000
    for i in range(0, 10_000, 2):
        assert store.decide("fixed_window", [f"k{i}".encode()], (0, 0, 5000, 1), now)[2] == 4000
    assert store.delete_matching(b"k*") == 10_000
    assert len(store) == 0 and store.slot_count == 16


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (b"*", {b"a:1", b"a:2", b"ab:1", b"b*:1", b"[x]"}),
        (b"a:?", {b"a:1", b"a:2"}),
        (b"a*", {b"a:1", b"a:2", b"ab:1"}),
        (b"[ab]*:1", {b"a:1", b"ab:1", b"b*:1"}),
        (b"[^a]*", {b"b*:1", b"[x]"}),
        (b"[a-b]:[1-1]", {b"a:1"}),
        (b"b\\*:1", {b"b*:1"}),
        (b"\\[x\\]", {b"[x]"}),
        (b"a:[2", {b"a:2"}),
        (b"", set()),
    ],
)
def test_delete_matching_is_redis_glob(pattern: bytes, expected: set[bytes]) -> None:
    store = _accel.MemoryStore(100)
    for key in (b"a:1", b"a:2", b"ab:1", b"b*:1", b"[x]"):
        store.load(key, 1, -1)
    assert store.delete_matching(pattern) == len(expected)
    assert set(store.dump(START_MS)) == {b"a:1", b"a:2", b"ab:1", b"b*:1", b"[x]"} - expected


def test_expired_keys_read_as_absent_and_are_not_counted() -> None:
    store = _accel.MemoryStore(100)
    now = START_MS
    index = now // 1000
    store.load(f"k:{index}".encode(), 5000, now - 1)
    assert store.decide("fixed_window", [b"k"], (0, 0, 5000, 1), now)[2] == 5000
    store.load(f"k:{index}".encode(), 5000, now)
    assert store.decide("fixed_window", [b"k"], (0, 0, 5000, 1), now)[2] == 0
    assert store.delete_matching(b"k:*", now + 1) == 0
    assert len(store) == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.decide("fixed_window", [b"k"], (1000, 1, 5000, 1.5), START_MS), TypeError),
        (lambda s: s.decide("fixed_window", [b"k"], (1000, True, 5000, 1), START_MS), TypeError),
        (lambda s: s.decide("fixed_window", [3], (1000, 1, 5000, 1), START_MS), TypeError),
        (lambda s: s.decide("fixed_window", [b"k"], (1000, 1, 5000, 1), -1), ValueError),
        (lambda s: s.decide("fixed_window", [b"k"], (1000, 1, 5000, 1), 2**53), ValueError),
        (lambda s: s.decide("nope", [b"k"], (1000, 1, 5000, 1), START_MS), ValueError),
        (lambda s: s.decide(b"fixed_window", [b"k"], (1000, 1, 5000, 1), START_MS), TypeError),
        (lambda s: s.decide("fixed_window", b"k", (1000, 1, 5000, 1), START_MS), TypeError),
        (lambda s: s.decide("fixed_window", [b"k"], 5, START_MS), TypeError),
        (lambda s: s.reset([b"k"], [1.0, ":#"], START_MS), TypeError),
        (lambda s: s.load(b"k", {"tokens": 1}, -1), ValueError),
        (lambda s: s.load(b"k", 1, -2), ValueError),
        (lambda s: s.sweep(START_MS, "all"), TypeError),
        (lambda s: _accel.MemoryStore(0), ValueError),
    ],
)
def test_store_rejects_wrong_types_and_values(call: object, error: type[Exception]) -> None:
    store = _accel.MemoryStore(10)
    with pytest.raises(error):
        call(store)  # type: ignore[operator]
    assert len(store) == 0


def test_keys_and_args_may_be_str_or_bytes() -> None:
    store = _accel.MemoryStore(10)
    assert store.decide(
        "token_bucket", ["k"], ("1000", b"1", "05000", "1", b"2500.0"), START_MS
    ) == (store.decide("token_bucket", [b"k2"], (1000, 1, 5000, 1, "2.5e3"), START_MS))
    assert set(store.dump(START_MS)) == {b"k:bucket:v2", b"k2:bucket:v2"}


@pytest.fixture
def fresh_limiter() -> Iterator[RateLimiter]:
    yield RateLimiter("memory://", key_prefix="x")


async def test_connect_and_close_are_no_ops(fresh_limiter: RateLimiter) -> None:
    async with fresh_limiter as limiter:
        assert await limiter.check("u", "1/second")
