"""moderato/dashboard/recorder.py: what the limiter tells it, counted exactly and bounded."""

from __future__ import annotations

import math
import random
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis_servers import free_port

from moderato import RateLimiter
from moderato.dashboard.recorder import OTHER_SCOPES, OUTCOMES, DecisionRecorder
from moderato.dashboard.sketches import bucket_bounds, latency_bucket
from moderato.errors import BackendError
from moderato.results import CheckResult
from moderato.sync import RateLimiter as SyncRateLimiter
from moderato.together import Check


class Clock:
    """perf_counter and time.time for a recorder, moved by hand."""

    def __init__(self) -> None:
        self.now_s = 1000.25

    def perf(self) -> float:
        return self.now_s

    def wall(self) -> float:
        return self.now_s + 1_700_000_000.0


def counts(**by_outcome: int) -> list[int]:
    return [by_outcome.get(outcome, 0) for outcome in OUTCOMES]


def recorder_on(limiter: RateLimiter, clock: Clock, **options: int) -> DecisionRecorder:
    recorder = DecisionRecorder(clock=clock.perf, wall_clock=clock.wall, **options)
    limiter.recorder = recorder
    return recorder


async def test_every_outcome_is_counted_per_second_per_limit_and_per_identity() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder", shadow=False)
    clock = Clock()
    recorder = recorder_on(limiter, clock)
    start = recorder.now_second()
    for _ in range(5):
        await limiter.check_with_info("alice", "3/minute", scope="a")
    await limiter.check_with_info("bob", "3/minute", scope="a", cost=4)  # permanent
    clock.now_s += 1.0
    for _ in range(4):
        await limiter.check_with_info("carol", "2/minute", scope="b", shadow=True)
    await limiter.check_with_info("dave", "2/minute", scope="b", algorithm="token_bucket")

    assert recorder.counts_at(start) == counts(allowed=3, denied=2, permanent=1)
    assert recorder.counts_at(start + 1) == counts(allowed=3, shadow_denied=2)
    assert recorder.all_totals() == counts(allowed=6, denied=2, permanent=1, shadow_denied=2)
    rows = dict(recorder.limit_rows())
    assert rows == {
        ("3/minute", "fixed_window", "a", None): counts(allowed=3, denied=2, permanent=1),
        ("2/minute", "fixed_window", "b", None): counts(allowed=2, shadow_denied=2),
        ("2/minute", "token_bucket", "b", None): counts(allowed=1),
    }
    # Denials only; a shadow denial lets the request through and is not a limited identity.
    assert recorder.top_denied() == {"alice": 2, "bob": 1}
    assert sum(recorder.latency_buckets().values()) == 11
    series = recorder.series(start + 1, 3)
    assert series[OUTCOMES.index("allowed")] == [0, 3, 3]


async def test_no_recorder_means_nothing_is_called() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder-off")
    assert limiter.recorder is None
    assert (await limiter.check_with_info("x", "1/minute")).allowed


async def test_bypasses_and_errors_are_counted_with_their_last_messages() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}"  # nothing answers there
    clock = Clock()
    open_limiter = RateLimiter(url, fail_open=True, breaker_failures=1000, connect_timeout_s=0.2)
    closed_limiter = RateLimiter(url, breaker_failures=1000, connect_timeout_s=0.2)
    open_recorder = recorder_on(open_limiter, clock)
    closed_recorder = recorder_on(closed_limiter, clock)
    for _ in range(3):
        assert (await open_limiter.check_with_info("x", "5/minute")).bypassed
        with pytest.raises(BackendError):
            await closed_limiter.check_with_info("x", "5/minute")
    # A cost no quota holds is never bypassed: an error even under fail-open.
    with pytest.raises(BackendError):
        await open_limiter.check_with_info("x", "5/minute", cost=6)
    assert open_recorder.all_totals() == counts(bypassed=3, error=1)
    assert closed_recorder.all_totals() == counts(error=3)
    errors = open_recorder.last_errors()
    assert sum(error[3] for error in errors) == 4
    assert {error[1] for error in errors} <= {"BackendUnavailableError", "BackendError"}
    assert open_recorder.top_denied() == {}
    await open_limiter.close()
    await closed_limiter.close()


async def test_the_tables_stay_bounded_whatever_the_traffic() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder-bounds")
    clock = Clock()
    recorder = recorder_on(limiter, clock, max_limit_rows=4, top_capacity=8, history_s=60)
    for n in range(50):
        await limiter.check_with_info(f"client-{n}", "1/minute", scope=f"scope-{n % 10}")
        await limiter.check_with_info(f"client-{n}", "1/minute", scope=f"scope-{n % 10}")
        clock.now_s += 7.0
    rows = dict(recorder.limit_rows())
    assert len(rows) == 5  # four scopes, then the overflow row
    assert rows[("1/minute", "fixed_window", OTHER_SCOPES, None)] == counts(allowed=30, denied=30)
    assert sum(sum(row) for row in rows.values()) == 100
    assert len(recorder.top_denied()) <= 16  # two epochs of eight counters
    assert len(recorder._ring) == 60 * len(OUTCOMES)
    assert recorder.all_totals() == counts(allowed=50, denied=50)
    # Seconds older than the ring's span read as zero; so does the future.
    assert recorder.counts_at(recorder.current_second - 60) == counts()
    assert recorder.counts_at(recorder.current_second + 1) == counts()


async def test_epochs_turn_over_the_heavy_hitters_and_the_latency() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder-epochs")
    clock = Clock()
    recorder = recorder_on(limiter, clock, hitters_epoch_s=10, latency_epoch_s=10)
    for _ in range(3):
        await limiter.check_with_info("old", "1/minute")
    clock.now_s += 10.0
    await limiter.check_with_info("new", "1/minute")
    await limiter.check_with_info("new", "1/minute")
    assert recorder.top_denied() == {"old": 2, "new": 1}  # previous epoch and this one
    assert sum(recorder.latency_buckets().values()) == 5
    clock.now_s += 10.0
    await limiter.check_with_info("new", "1/minute")
    assert recorder.top_denied() == {"new": 2}
    assert sum(recorder.latency_buckets().values()) == 3


async def test_a_forked_child_counts_afresh_under_its_own_id() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder-fork")
    recorder = recorder_on(limiter, Clock())
    await limiter.check_with_info("x", "1/minute")
    parent_id = recorder.process_id
    recorder.after_fork_in_child()  # what os.register_at_fork runs in a child
    assert recorder.process_id != parent_id
    assert recorder.all_totals() == counts()
    assert recorder.limit_rows() == []


def test_the_inlined_latency_bucket_is_the_histograms() -> None:
    limiter = RateLimiter("memory://", key_prefix="recorder-latency")
    clock = Clock()
    recorder = recorder_on(limiter, clock)
    plan = limiter._plans.get("1/minute", None)
    result = CheckResult(True, 1, 0, 0, None, 60, "1/minute", "fixed_window")
    durations = [0.0, 1e-9, 3e-6, 0.00042, 0.0042, 0.0081919, 0.0081921, 0.25, 1.0, 63.9, 1e4]
    durations += [n * 1.7e-6 for n in range(5000)]
    for elapsed in durations:
        recorder.decided(plan, "k", "global", result, clock.now_s - elapsed)
    # (The recorder sees the duration as a difference of two clock readings.)
    expected = Counter(latency_bucket(clock.now_s - (clock.now_s - e)) for e in durations)
    assert recorder.latency_buckets() == dict(expected)
    # The tables are bucket_of to within the microsecond the durations are read to
    # (and, scaled past FAST_LATENCY_US, to within 1/8192 of the duration).
    rng = random.Random(5)
    durations += [math.exp(rng.uniform(math.log(1e-6), math.log(60.0))) for _ in range(5000)]
    for elapsed in durations:
        if 1e-6 <= elapsed < 64.0:  # beyond the ends, the end buckets
            low, high = bucket_bounds(latency_bucket(elapsed))
            slack = max(1e-6, elapsed / 8192)
            assert low - slack <= elapsed < high + slack, elapsed


# -- the blocking limiter, from many threads ------------------------------------------------

THREADS = 16
CHECKS_PER_THREAD = 400
THREAD_LIMIT = 250


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Threads switch every microsecond instead of every 5 ms: an increment left
    unguarded between its read and its store is then soon lost."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_sixteen_threads_of_the_blocking_limiter_are_counted_exactly(
    frequent_thread_switches: None,
) -> None:
    limiter = SyncRateLimiter("memory://", key_prefix="recorder-threads")
    recorder = DecisionRecorder()
    limiter.recorder = recorder
    start = threading.Barrier(THREADS)

    def work(thread: int) -> None:
        start.wait()
        for n in range(CHECKS_PER_THREAD):
            # Its own identity on a shared limit, and every 4th check one quota all share.
            limiter.check_with_info(f"t{thread}", f"{THREAD_LIMIT}/hour", scope="own")
            if n % 4 == 0:
                limiter.check_with_info("shared", "1000/hour", scope="shared")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, range(THREADS)))

    own_denied = CHECKS_PER_THREAD - THREAD_LIMIT
    shared = THREADS * CHECKS_PER_THREAD // 4  # 1,600 checks: 1,000 admitted
    assert recorder.all_totals() == counts(
        allowed=THREADS * THREAD_LIMIT + 1000, denied=THREADS * own_denied + shared - 1000
    )
    assert dict(recorder.limit_rows()) == {
        (f"{THREAD_LIMIT}/hour", "fixed_window", "own", None): counts(
            allowed=THREADS * THREAD_LIMIT, denied=THREADS * own_denied
        ),
        ("1000/hour", "fixed_window", "shared", None): counts(allowed=1000, denied=shared - 1000),
    }
    assert recorder.top_denied() == {
        **{f"t{thread}": own_denied for thread in range(THREADS)},
        "shared": shared - 1000,
    }
    # Misra-Gries' bound (denials / 65 counters): every count above is exact all the same.
    assert recorder.denial_error_bound() == (THREADS * own_denied + shared - 1000) // 65
    assert sum(recorder.latency_buckets().values()) == THREADS * CHECKS_PER_THREAD + shared


def test_the_blocking_limiter_records_bypasses_errors_and_checks_decided_together() -> None:
    url = f"redis://127.0.0.1:{free_port()}"  # nothing answers there
    clock = Clock()
    open_limiter = SyncRateLimiter(
        url, fail_open=True, breaker_failures=1000, connect_timeout_s=0.2
    )
    open_recorder = recorder_on(open_limiter, clock)
    for _ in range(3):
        assert open_limiter.check_with_info("x", "5/minute").bypassed
    with pytest.raises(BackendError):
        open_limiter.check_with_info("x", "5/minute", cost=6)
    assert open_recorder.all_totals() == counts(bypassed=3, error=1)
    assert sum(error[3] for error in open_recorder.last_errors()) == 4

    limiter = SyncRateLimiter("memory://", key_prefix="recorder-together")
    recorder = recorder_on(limiter, clock)
    checks = [
        Check("u", "2/minute", "a"),
        Check("u", "5/minute", "b"),
    ]
    outcomes = [limiter._check_together(checks).allowed for _ in range(3)]
    assert outcomes == [True, True, False]
    # Admitted twice by both; the third time "a" refused, and "b" was not charged.
    rows = dict(recorder.limit_rows())
    assert rows[("2/minute", "fixed_window", "a", None)] == counts(allowed=2, denied=1)
    assert sum(rows[("5/minute", "fixed_window", "b", None)]) == 3
