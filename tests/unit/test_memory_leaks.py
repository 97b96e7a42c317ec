"""Reference and memory leak checks of moderato._accel.MemoryStore.

Every method is called 100,000 times on its success and refusal paths, on a
table whose contents stay the same size (the clock moves a window per call, so
what is written expires and is overwritten). The reference counts of the
arguments (and of their items) must not move, and the process's resident
memory must not grow by more than allocator noise, nor the table (swept as
MemoryBackend sweeps it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tracemalloc
from collections.abc import Iterator
from typing import Any, Callable

import pytest

from moderato import _accel
from moderato.algorithms import RESET_SUFFIXES

CALLS = 100_000
WARM_UP_CALLS = 2_000
RSS_GROWTH_BOUND_BYTES = 2 << 20  # a leak of one small object per call is several MB
# The store allocates with PyMem_Malloc, which tracemalloc traces: a leak of even one
# byte per call shows over TRACED_CALLS calls.
TRACED_CALLS = 20_000
TRACED_GROWTH_BOUND_BYTES = 16 << 10
START_MS = 1_800_000_000_000
SHARED_REFCOUNT = 10**8  # static singletons start at 999,999,999 on 3.11
# Counts this high at the start mean an object the interpreter shares ("" on Python 3.9,
# ~24,000), which another thread of the test process may move by a few.
INTERPRETER_SHARED_REFCOUNT = 1_000


def text(value: str) -> str:
    """A fresh, non-interned copy: its reference count is this test's alone."""
    return "".join(list(value))


def blob(value: bytes) -> bytes:
    return bytes(bytearray(value))


class Clock:
    """A window (1 s) further on every call, so the table keeps its size."""

    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        self.now_ms += 1000
        return self.now_ms


def decide_args(algorithm: str, apply: int) -> list[Any]:
    extra = [text("")] if algorithm == "token_bucket" else []
    return [10**6, apply, 5 * 10**6, 1, *extra, 3 * 10**6, 60, *extra]


def decide_case(algorithm: str, apply: int) -> tuple[str, Callable[..., Any], list[Any]]:
    keys = [blob(b"leak:" + algorithm.encode() + b":{c}:1"), text("leak:{c}:60")]
    args = decide_args(algorithm, apply)

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        return store.decide(algorithm, keys, args, clock())

    return f"decide-{algorithm}-{apply}", run, [keys, args]


def broken_state_case() -> tuple[str, Callable[..., Any], list[Any]]:
    keys = [blob(b"broken")]
    args = [1000, 1, 5000, 1]

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        now_ms = clock()
        store.load(b"broken:" + str(now_ms // 1000).encode(), -1, now_ms)
        return store.decide("fixed_window", keys, args, now_ms)

    return "decide-state-refusal", run, [keys, args]


def refusal_case(name: str, args: list[Any], keys: list[Any]) -> tuple[str, Any, list[Any]]:
    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        return store.decide("token_bucket", keys, args, clock())

    return name, run, [keys, args]


def reset_case() -> tuple[str, Callable[..., Any], list[Any]]:
    keys = [blob(b"leak:fixed_window:{c}:1"), text("leak:{c}:60")]
    args = [1, text("60"), *(text(suffix) for suffix in RESET_SUFFIXES)]

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        now_ms = clock()
        store.decide("fixed_window", keys, [1000, 1, 5000, 1, 5000, 60], now_ms)
        return store.reset(keys, args, now_ms)

    return "reset", run, [keys, args]


def delete_matching_case() -> tuple[str, Callable[..., Any], list[Any]]:
    pattern = blob(b"leak:[a-z]*:{c}:?")

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        now_ms = clock()
        store.decide("gcra", [b"leak:gcra:{c}:1"], [1000, 1, 5000, 1], now_ms)
        return store.delete_matching(pattern, now_ms)

    return "delete_matching", run, [pattern]


def wall_clock_case() -> tuple[str, Callable[..., Any], list[Any]]:
    keys = [blob(b"leak:sliding_log:{c}:1")]
    args = [1000, 1, 5000, 1]

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        clock()
        return store.decide("sliding_log", keys, args, None)

    return "decide-wall-clock", run, [keys, args]


def introspection_case() -> tuple[str, Callable[..., Any], list[Any]]:
    log = [(text("0000000000001000:1000"), START_MS), (text("x"), START_MS + 1)]

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        now_ms = clock()
        store.load(b"leak:{c}:log", log, now_ms + 5000)
        store.load(b"leak:{c}:gcra", {"tat": 5, "frac": 1}, -1)
        store.sweep(now_ms, 64)
        return store.dump(now_ms)

    return "load-sweep-dump", run, [log, *log]


def table_stats_case() -> tuple[str, Callable[..., Any], list[Any]]:
    keys = [blob(b"leak:{:s:c}:1")]

    def run(store: _accel.MemoryStore, clock: Clock) -> Any:
        clock()
        return store.table_stats()

    return "table-stats", run, [keys]


CASES = [
    *(decide_case(name, apply) for name in _accel.MEMORY_ALGORITHMS for apply in (0, 1)),
    broken_state_case(),
    refusal_case(
        "decide-arg-refusal", [1000, 1, 5000, 1, text("fast"), 5000, 60, ""], [b"a", b"b"]
    ),
    refusal_case("decide-type-error", [1000, 1, 5000, 1, 2.5, 5000, 60, ""], [b"a", b"b"]),
    refusal_case("decide-duplicate-keys", [1000, 1, 5000, 1, "", 5000, 60, ""], [b"a", b"a"]),
    refusal_case("decide-key-type", [1000, 1, 5000, 1, ""], [text("a"), 5]),
    reset_case(),
    delete_matching_case(),
    wall_clock_case(),
    introspection_case(),
    table_stats_case(),
]


def watched(objects: list[Any]) -> list[Any]:
    """The objects and their items, but not those the whole interpreter shares.

    Small ints, and the statically allocated singletons ("", one-byte bytes) whose
    count starts near 10**9 (immortal from Python 3.12; on 3.11 still counted, so
    any other thread of the test process moves it).
    """
    found = list(objects)
    for value in objects:
        if isinstance(value, (list, tuple)):
            found.extend(value)
    return [
        v
        for v in found
        if not (isinstance(v, int) and -5 <= v <= 256) and sys.getrefcount(v) < SHARED_REFCOUNT
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def store() -> Iterator[_accel.MemoryStore]:
    # Swept as MemoryBackend's store sweeps itself, inside decide().
    yield _accel.MemoryStore(10_000, sweep_every=256, sweep_entries=1024)


def traced_from_here() -> int:
    """Bytes still allocated by calls made from this module's frames.

    What the store allocates is traced to the Python frame that called it, one of
    this module's; counting only those leaves out whatever another thread of the
    test process (a client left by an earlier test) allocates meanwhile.
    """
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, __file__)])
    return sum(trace.size for trace in snapshot.traces)


def assert_counts_kept(tracked: list[Any], refcounts: list[int]) -> None:
    """Each tracked object's reference count as it was (``refcounts``, taken after a
    gc.collect() too): the test's own objects exactly, one the interpreter shares
    within a hundredth of the calls."""
    counts = [sys.getrefcount(value) for value in tracked]  # before a loop holds any
    for index, (before, after) in enumerate(zip(refcounts, counts)):
        if before < INTERPRETER_SHARED_REFCOUNT:  # the test's own objects: exactly
            assert after == before, tracked[index]
        else:  # "" on 3.9 (~24,000): other threads move it; a leak per call adds CALLS
            assert abs(after - before) < CALLS // 100, tracked[index]


def traced_growth(calls: Callable[[int], None]) -> int:
    """Bytes that TRACED_CALLS calls leave allocated (traced_from_here), once warm."""
    tracemalloc.start()
    try:
        calls(WARM_UP_CALLS)
        gc.collect()
        traced_before = traced_from_here()
        calls(TRACED_CALLS)
        gc.collect()
        return traced_from_here() - traced_before
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize(
    ("run", "objects"), [pytest.param(*case[1:], id=case[0]) for case in CASES]
)
def test_no_leaks(store: _accel.MemoryStore, run: Callable[..., Any], objects: list[Any]) -> None:
    clock = Clock()
    tracked = watched(objects)

    def calls(times: int) -> None:
        for i in range(times):
            with contextlib.suppress(TypeError, ValueError):
                run(store, clock)
            if i % 256 == 0:  # what does not decide is swept here
                store.sweep(clock.now_ms, 2048)

    calls(WARM_UP_CALLS)
    gc.collect()
    refcounts = [sys.getrefcount(value) for value in tracked]
    entries = len(store)
    rss_before = rss_bytes()

    calls(CALLS)

    gc.collect()
    assert_counts_kept(tracked, refcounts)
    assert rss_bytes() - rss_before < RSS_GROWTH_BOUND_BYTES
    assert len(store) <= entries + 4

    assert traced_growth(calls) < TRACED_GROWTH_BOUND_BYTES


def test_stores_are_freed() -> None:
    gc.collect()
    rss_before = rss_bytes()
    for _ in range(200):
        store = _accel.MemoryStore(100_000)
        for i in range(2000):
            store.decide("sliding_log", [f"k{i}".encode()], [1000, 1, 5000, 60], START_MS)
        del store
    gc.collect()
    assert rss_bytes() - rss_before < 8 << 20


def test_resizes_give_their_memory_back() -> None:
    # Large slot arrays come from mmap and are given back piecewise while a resize
    # walks them (csrc/store_table.c): grow past them and empty the table, again and
    # again; what stays must not grow.
    store = _accel.MemoryStore(1_000_000)
    clock = Clock()

    def cycle() -> None:
        now_ms = clock()
        for i in range(100_000):
            store.decide("fixed_window", [f"leak:{{:s:{i}}}".encode()], [1000, 1, 5000, 1], now_ms)
        later_ms = clock() + 1  # past the end of now_ms's window: every key expired
        while len(store) > 0 or store.table_stats()["resize_slots_left"] > 0:
            store.sweep(later_ms, 2048)

    cycle()
    gc.collect()
    rss_before = rss_bytes()
    for _ in range(8):
        cycle()
    gc.collect()
    assert len(store) == 0
    assert rss_bytes() - rss_before < RSS_GROWTH_BOUND_BYTES


# -- the one-call check (csrc/fast_check.c) -------------------------------------------


def fast_check_cases() -> list[Any]:
    """The one-call path of both limiters on memory://: admissions and denials, a
    store refusal met when awaited, and a check it hands to the Python path."""
    from moderato import RateLimiter
    from moderato.errors import BackendError
    from moderato.sync import RateLimiter as BlockingRateLimiter

    def asyncio_case(name: str, rate: str, **keywords: Any) -> Any:
        key, scope = text("leak-key"), text("leak-scope")

        def run(limiter: Any, clock: Clock) -> Any:
            clock()
            call = limiter.check_with_info(key, rate, scope=scope, **keywords)
            try:
                call.send(None)
            except StopIteration as stop:
                return stop.value
            except BackendError:
                return None
            raise AssertionError("a check that did not end at once")

        return pytest.param(RateLimiter, run, [key, scope, rate], id=f"fast-check-{name}")

    def blocking_case(name: str, rate: str) -> Any:
        key, scope = text("leak-key"), text("leak-scope")

        def run(limiter: Any, clock: Clock) -> Any:
            clock()
            return limiter.check_with_info(key, rate, scope=scope)

        return pytest.param(BlockingRateLimiter, run, [key, scope, rate], id=f"fast-check-{name}")

    def refused(limiter: Any, clock: Clock) -> Any:
        now_ms = clock()
        (base,) = limiter.backend.decision_keys(
            limiter.plan_for("1/second"), "broken", None, "global"
        )
        limiter.backend.store.load(base + b":" + str(now_ms // 1000).encode(), -1, now_ms)
        # A success first ends the outage the last refusal logged, so that this one
        # takes the one-call path again.
        with contextlib.suppress(StopIteration):
            limiter.check_with_info("fine", "1000000/second").send(None)
        call = limiter.check_with_info("broken", "1/second")
        assert type(call) is _accel.ReadyCheck
        with contextlib.suppress(BackendError):
            call.send(None)

    return [
        asyncio_case("admitted", text("1000000/second")),
        asyncio_case("denied", text("1/hour")),
        asyncio_case("algorithm", text("5/second;100/minute"), algorithm="gcra"),
        asyncio_case("python-path", text("1000000/second"), tenant="t"),
        blocking_case("blocking", text("1000000/second")),
        pytest.param(RateLimiter, refused, [], id="fast-check-refused"),
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize(("limiter_class", "run", "objects"), fast_check_cases())
def test_fast_check_no_leaks(
    limiter_class: Any, run: Callable[..., Any], objects: list[Any]
) -> None:
    clock = Clock()
    limiter = limiter_class("memory://?max_entries=10000")
    limiter.backend.clock = clock
    tracked = watched(objects)

    def calls(times: int) -> None:
        for _ in range(times):
            with contextlib.suppress(StopIteration):
                run(limiter, clock)

    calls(WARM_UP_CALLS)
    gc.collect()
    refcounts = [sys.getrefcount(value) for value in tracked]
    rss_before = rss_bytes()
    calls(CALLS)
    gc.collect()
    assert_counts_kept(tracked, refcounts)
    assert rss_bytes() - rss_before < RSS_GROWTH_BOUND_BYTES
    assert traced_growth(calls) < TRACED_GROWTH_BOUND_BYTES
