"""memory://'s table holds no call for long: bounded work per call, asserted by count.

The store's table (csrc/store_table.c) grows and shrinks a bounded number of
slots per call, finds an identity's keys through its identity index instead
of walking every entry, and sweeps look at entries from the least recently
used on, in slices (``MemoryBackend.sweep()`` lets the event loop run between
them). These tests hold each to
its bound by counting what the table reports (``table_stats()``), slots and
entries, never by timing; benchmarks/memory_pauses.py measures the times.
"""

from __future__ import annotations

import asyncio
import fnmatch
import threading

import accel_reference as reference
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moderato import RateLimitConfigError, RateLimiter, _accel
from moderato.backends.memory import MemoryBackend

START_MS = 1_800_000_000_000
CHARGE = (1000, 1, 5000, 60)  # cost 1 of 5 per minute, charged
PEEK = (0, 0, 5000, 60)
# csrc/store_table.h: a resize moves RESIZE_STEP_SLOTS old slots per call that makes
# room, plus its pace per entry added: at most 3 slots while growing (the old array
# and its entries over the half of the new one left to fill), at most 33 while
# shrinking (by at most 8 times, to a quarter full).
RESIZE_STEP_SLOTS = 64
GROWTH_SLOTS_PER_ADDED = 3
SHRINK_SLOTS_PER_ADDED = 33


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


def key(i: int, prefix: str = "t") -> bytes:
    return f"{prefix}:fw:{{:GET%3A%2F:client-{i}}}".encode()


def remaining_scaled(store: _accel.MemoryStore, base: bytes, now_ms: int = START_MS) -> int:
    return store.decide("fixed_window", [base], PEEK, now_ms)[2]


def test_growth_is_spread_over_the_calls_that_add_entries() -> None:
    store = _accel.MemoryStore(1_000_000)
    calls_during_a_resize = 0
    for i in range(150_000):
        store.decide("fixed_window", [key(i)], CHARGE, START_MS)
        calls_during_a_resize += store.table_stats()["resize_slots_left"] > 0
        if i % 97 == 0:  # an earlier key, in whichever array it sits, decides as charged once
            assert remaining_scaled(store, key(i // 2)) == 4000
    stats = store.table_stats()
    assert len(store) == 150_000 and stats["slot_count"] == 524_288
    assert stats["identities"] == 150_000 and stats["unindexed"] == 0
    assert calls_during_a_resize > 10_000  # the arrays of 8,192 slots and up moved in steps
    assert stats["longest_resize_step"] <= RESIZE_STEP_SLOTS + GROWTH_SLOTS_PER_ADDED
    assert stats["whole_resizes"] == 0


def test_a_call_adding_sixteen_keys_moves_sixteen_paces() -> None:
    store = _accel.MemoryStore(1_000_000)
    windows_s = range(1, 17)
    args = [1000, 1]
    for window_s in windows_s:
        args += [5000, window_s]
    for i in range(20_000):
        bases = [f"t:fw:{{::client-{i}}}:{window_s}".encode() for window_s in windows_s]
        store.decide("fixed_window", bases, args, START_MS)
    stats = store.table_stats()
    assert len(store) == 320_000 and stats["identities"] == 20_000
    assert stats["longest_resize_step"] <= RESIZE_STEP_SLOTS + 16 * GROWTH_SLOTS_PER_ADDED
    assert stats["whole_resizes"] == 0


def test_shrinking_is_spread_too() -> None:
    store = _accel.MemoryStore(1_000_000)
    for i in range(100_000):
        store.decide("fixed_window", [key(i)], CHARGE, START_MS)
    assert store.table_stats()["slot_count"] == 262_144
    later_ms = START_MS + 120_000  # every key above has expired
    # Sweeps in slices (as decide() runs them) while new keys keep coming.
    for i in range(60_000):
        store.sweep(later_ms, 2048)
        store.decide("fixed_window", [key(i, "new")], CHARGE, later_ms)
    stats = store.table_stats()
    assert len(store) == 60_000
    assert stats["slot_count"] <= 262_144
    assert stats["longest_resize_step"] <= RESIZE_STEP_SLOTS + SHRINK_SLOTS_PER_ADDED
    assert stats["whole_resizes"] == 0
    assert remaining_scaled(store, key(59_999, "new"), later_ms) == 4000


def test_a_whole_sweep_finishes_a_resize_and_looks_at_every_entry() -> None:
    store = _accel.MemoryStore(1_000_000)
    i = 0
    while store.table_stats()["resize_slots_left"] == 0 or len(store) < 50_000:
        store.decide("fixed_window", [key(i)], CHARGE, START_MS)
        i += 1
    assert store.table_stats()["slot_count"] == 262_144
    assert store.sweep(START_MS + 120_000) == i
    # Empty, and shrinking (by 8 at most, the empty old array walked as calls come).
    stats = store.table_stats()
    assert len(store) == 0
    assert (stats["slot_count"], stats["resize_slots_left"]) == (32_768, 262_144)


async def test_unscoped_reset_looks_at_that_identitys_entries_only() -> None:
    limiter = RateLimiter("memory://", key_prefix="t")
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    backend.clock = FakeClock()
    store = backend.store
    for i in range(20_000):
        await limiter.check(f"client-{i}", "5/minute", scope="GET:/")
    for scope in ("GET:/a", "GET:/b", "POST:/a"):
        for algorithm in ("fixed_window", "token_bucket"):
            await limiter.check("victim", "5/minute", scope=scope, algorithm=algorithm)
    await limiter.check("victim", "5/minute", scope="GET:/a", tenant_type="gold")
    assert len(store) == 20_007

    # One scope without a rate: the identity's six entries are looked at, two match.
    assert await limiter.reset("victim", scope="GET:/a") == 2
    assert store.table_stats()["last_match_examined"] == 6
    assert await limiter.reset("victim") == 4
    assert store.table_stats()["last_match_examined"] == 4
    assert await limiter.reset("victim", tenant_type="gold") == 1
    assert store.table_stats()["last_match_examined"] == 1
    assert await limiter.reset("nobody") == 0
    assert store.table_stats()["last_match_examined"] == 0
    assert len(store) == 20_000


async def test_hashed_identities_are_indexed_too() -> None:
    limiter = RateLimiter("memory://", key_prefix="t", identity_secret=b"s" * 32)
    backend = limiter.backend
    assert isinstance(backend, MemoryBackend)
    backend.clock = FakeClock()
    for i in range(1000):
        await limiter.check(f"client-{i}", "5/minute", scope="GET:/")
    for scope in ("GET:/a", "GET:/b"):
        await limiter.check("victim", "5/minute", scope=scope)
    assert await limiter.reset("victim") == 2
    assert backend.store.table_stats()["last_match_examined"] == 2


def test_keys_of_other_shapes_are_matched_from_the_unindexed_list() -> None:
    store = _accel.MemoryStore(1000)
    odd = [b"t:fw:{:a:b:victim}:60", b"t:fw:{:a}b:victim}:60", b"t:{x:fw:{:a:victim}:60"]
    shaped = [b"t:fw:{:a:victim}:60", b"t:fw:{:b:victim}:60:1", b"t:fw:{:a:other}:60"]
    for each in odd + shaped:
        store.load(each, 1, -1)
    stats = store.table_stats()
    assert (stats["unindexed"], stats["identities"]) == (3, 2)
    # Every key matching the pattern goes, whichever list it is on.
    assert store.delete_matching(b"t:??:{:*:victim}:*") == 4
    assert store.table_stats()["last_match_examined"] == 2 + 3
    assert set(store.dump(START_MS)) == {b"t:{x:fw:{:a:victim}:60", b"t:fw:{:a:other}:60"}


def test_other_patterns_look_at_every_entry() -> None:
    store = _accel.MemoryStore(1000)
    for i in range(10):
        store.load(key(i), 1, -1)
    assert store.delete_matching(b"t:fw:{:*:client-[12]}") == 2
    assert store.table_stats()["last_match_examined"] == 10


IDENTITY_BYTES = st.sampled_from([b"a", b"b", b":", b"{", b"}", b""])
shaped_keys = st.builds(
    lambda tenant, scope, identity, tail: b"p:fw:{" + tenant + b":" + scope + b":" + identity
    + b"}" + tail,
    IDENTITY_BYTES, IDENTITY_BYTES, IDENTITY_BYTES, st.sampled_from([b"", b":60", b":60:1"]),
)  # fmt: skip
any_keys = st.one_of(shaped_keys, st.binary(min_size=1, max_size=8).map(lambda b: b + b"{:x:}"))


@settings(max_examples=150, deadline=None)
@given(
    keys=st.lists(any_keys, min_size=1, max_size=24, unique=True),
    removals=st.lists(st.integers(0, 23), max_size=12),
    patterns=st.lists(
        st.sampled_from([b"p:??:{:*:a}*", b"p:fw:{a:*:}:60", b"p:*{::b}*", b"*", b"p:fw:{:?:a}"]),
        max_size=3,
    ),
)
def test_the_index_holds_what_the_reference_says(
    keys: list[bytes], removals: list[int], patterns: list[bytes]
) -> None:
    store = _accel.MemoryStore(1000)
    for each in keys:
        store.load(each, 1, -1)
    present = set(keys)
    for index in removals:
        if index < len(keys):
            # Every byte escaped: the key itself, found by a walk of every entry.
            literal = b"".join(b"\\" + bytes([byte]) for byte in keys[index])
            assert store.delete_matching(literal) == (keys[index] in present)
            present.discard(keys[index])
    for pattern in patterns:
        # Without "[" and "\\", Redis's glob is fnmatch's.
        matched = {k for k in present if fnmatch.fnmatchcase(k, pattern)}
        pinned = reference.store_pattern_identity(pattern)
        looked_at = [
            k
            for k in present
            if pinned is None or reference.store_key_identity(k) in (None, pinned)
        ]
        assert store.delete_matching(pattern) == len(matched)
        assert store.table_stats()["last_match_examined"] == len(looked_at)
        present -= matched
    assert set(store.dump(START_MS)) == present
    identities = {reference.store_key_identity(k) for k in present} - {None}
    unindexed = [k for k in present if reference.store_key_identity(k) is None]
    stats = store.table_stats()
    assert (stats["identities"], stats["unindexed"]) == (len(identities), len(unindexed))


@pytest.mark.parametrize(
    ("pattern", "identity"),
    [
        (b"p:??:{:*:a}:*", (b"", b"a")),
        (b"p:fw:{gold:GET:a}:60", (b"gold", b"a")),
        (b"p:??:{t:x:y:z}:*", (b"t", b"z")),
        (b"p:??:{t:*:a*}:*", None),
        (b"p:??:{t?:*:a}:*", None),
        (b"p:??:{:a}:*", None),
        (b"p:[a]:{:*:a}:*", None),
        (b"p:??:{:*:a}:*}", None),
        (b"p:??:}{:*:a}:*", None),
        (b"p\\:{:*:a}", None),
    ],
)
def test_which_patterns_pin_an_identity(pattern: bytes, identity: object) -> None:
    assert reference.store_pattern_identity(pattern) == identity
    store = _accel.MemoryStore(100)
    for i in range(5):
        store.load(f"p:fw:{{:s{i}:other}}:60".encode(), 1, -1)
    store.delete_matching(pattern)
    assert store.table_stats()["last_match_examined"] == (0 if identity else 5)


async def test_the_backend_sweeps_in_slices_between_which_the_loop_runs() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    store = backend.store
    for i in range(50_000):
        store.decide("fixed_window", [key(i)], CHARGE, START_MS)
    slot_count = store.table_stats()["slot_count"]
    assert (len(store), slot_count) == (50_000, 131_072)
    clock.now_ms += 120_000
    seen: list[int] = []
    sweeping = True

    async def watch() -> None:
        while sweeping:
            seen.append(len(store))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)
    assert await backend.sweep(slice_entries=4096) == 50_000
    sweeping = False
    await watcher
    assert len(store) == 0
    # The watcher ran between every two slices, and no slice dropped more than the
    # 4,096 entries it looked at.
    assert len(seen) >= 50_000 // 4096
    assert all(before - after <= 4096 for before, after in zip(seen, seen[1:]))


async def test_a_backend_sweep_sees_what_traffic_moves_ahead_of_it() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    store = backend.store
    short = (1000, 1, 5000, 1)  # a one-second window
    for i in range(5000):  # in order of use: short, long, short, long, ...
        store.decide("fixed_window", [key(i, "short")], short, START_MS)
        store.decide("fixed_window", [key(i, "long")], CHARGE, START_MS)
    clock.now_ms += 2000  # the short windows are over, the long ones are not
    assert store.sweep(clock.now_ms, 3000) == 1500  # a pass under way

    async def traffic() -> None:
        # Reads move long keys the pass has not reached yet to the end of the
        # order of use, ahead of the pass; new keys join there too.
        for i in range(1500, 5000, 35):
            assert remaining_scaled(store, key(i, "long"), clock.now_ms) == 4000
            store.decide("fixed_window", [key(i, "new")], CHARGE, clock.now_ms)
            await asyncio.sleep(0)

    task = asyncio.create_task(traffic())
    assert await backend.sweep(slice_entries=100) == 3500
    await task
    assert len(store) == 5000 + 100  # every short key gone; the long and new ones stay


def test_the_blocking_sweep_lets_other_threads_decide_between_slices() -> None:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    store = backend.store
    for i in range(20_000):
        store.decide("fixed_window", [key(i)], CHARGE, START_MS)
    clock.now_ms += 120_000
    decided = []

    def traffic() -> None:
        for i in range(200):
            decided.append(store.decide("fixed_window", [key(i, "new")], CHARGE, clock.now_ms))

    thread = threading.Thread(target=traffic)
    thread.start()
    assert backend.sweep_now(slice_entries=500) == 20_000
    thread.join()
    assert len(decided) == 200 and len(store) == 200  # every old key gone, every new one kept


@pytest.mark.parametrize("slice_entries", [0, -1, True, 2.5])
async def test_the_sweep_slice_must_be_a_positive_int(slice_entries: object) -> None:
    backend = MemoryBackend(clock=FakeClock())
    with pytest.raises(RateLimitConfigError, match="slice_entries must be a positive integer"):
        await backend.sweep(slice_entries=slice_entries)  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match="slice_entries must be a positive integer"):
        backend.sweep_now(slice_entries=slice_entries)  # type: ignore[arg-type]


def test_sweeps_go_from_the_least_recently_used_entry_on() -> None:
    store = _accel.MemoryStore(100)
    for i in range(10):
        store.decide("fixed_window", [f"k{i}".encode()], (1000, 1, 5000, 1), START_MS)
    later_ms = START_MS + 1001  # all ten have expired
    store.decide("fixed_window", [b"k0"], (0, 0, 5000, 1), START_MS)  # k0: most recently used
    passes = store.table_stats()["sweep_passes"]
    assert store.sweep(later_ms, 3) == 3
    index = START_MS // 1000
    assert sorted(store.dump(START_MS)) == [f"k{i}:{index}".encode() for i in (0, *range(4, 10))]
    assert store.table_stats()["sweep_passes"] == passes
    # On from there; the pass ends at the most recently used entry, k0.
    assert store.sweep(later_ms, 100) == 7
    assert len(store) == 0 and store.table_stats()["sweep_passes"] == passes + 1
    # The next pass starts from the least recently used entry again.
    store.decide("fixed_window", [b"a"], (1000, 1, 5000, 1), START_MS)
    assert store.sweep(later_ms, 1) == 1
