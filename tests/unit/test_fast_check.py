"""memory://'s commonest check in one C call (moderato/fast_check.py, csrc/fast_check.c).

Every check is compared with the Python method it stands for
(``check_with_info.__wrapped__``) on a twin limiter driven by the same clock: the
same results, the same state left in the store, the same errors. The conditions
that send a check to the Python path are each shown to, and a change of one after
the limiter was made to count from the next check.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from collections.abc import Awaitable
from typing import Any, Callable, Optional
from unittest.mock import MagicMock

import pytest

from moderato import RateLimiter, _accel
from moderato.algorithms import ALGORITHMS
from moderato.errors import BackendError, RateLimitConfigError, RateLimitExceeded
from moderato.recording import CheckRecorder
from moderato.sync import RateLimiter as BlockingRateLimiter

START_MS = 1_800_000_000_000
PYTHON_CHECK = RateLimiter.check_with_info.__wrapped__  # type: ignore[attr-defined]
PYTHON_BLOCKING_CHECK = BlockingRateLimiter.check_with_info.__wrapped__  # type: ignore[attr-defined]


class Clock:
    def __init__(self) -> None:
        self.now_ms = START_MS

    def __call__(self) -> int:
        return self.now_ms


def twins(clock: Clock, **options: Any) -> tuple[RateLimiter, RateLimiter]:
    limiters = (RateLimiter("memory://", **options), RateLimiter("memory://", **options))
    for limiter in limiters:
        limiter.backend.clock = clock  # type: ignore[attr-defined]
    return limiters


def state(limiter: Any) -> Any:
    return limiter.backend.store.dump(START_MS)


async def outcome(call: Callable[..., Awaitable[Any]], *args: Any, **keywords: Any) -> Any:
    try:
        return await call(*args, **keywords)
    except Exception as error:  # compared by type and text
        return (type(error), str(error))


CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("u1", "3/second"), {}),
    (("u1", "3/second"), {"scope": "GET /a"}),
    (("u2", "2/minute;5/hour"), {}),
    (("u1", "10/second"), {"cost": 1}),
    (("u1", "10/second"), {"cost": 2}),  # the Python path's
    (("u1", "10/second"), {"tenant": "t"}),  # the Python path's
    (("u1", "10/second"), {"tenant_type": "t"}),  # the Python path's
    ((b"u1", "10/second"), {}),  # the Python path's
    (("u1", "10/second"), {"scope": 5}),  # refused by the Python path
    (("u1", 10), {}),  # refused by the Python path
    (("u1", "10/potato"), {}),  # refused by the Python path
    (("u1", "10/second"), {"cost": 0}),  # refused by the Python path
    (("u1", "10/second"), {"shadow": True}),
    (("u\udc80", "10/second"), {}),  # a key C refuses: the Python path's KeyPartError
    (("u1", "10/second", "extra"), {}),  # a TypeError, as the method raises it
    (("u1", "10/second"), {"nonsense": 1}),
]


@pytest.mark.parametrize("algorithm", [None, *ALGORITHMS])
def test_the_same_results_state_and_errors_as_the_python_path(algorithm: Optional[str]) -> None:
    clock = Clock()
    fast, python = twins(clock)

    async def run() -> None:
        for step in range(40):
            clock.now_ms += 137 * (step % 5)
            for args, keywords in CASES:
                if algorithm is not None:
                    keywords = {**keywords, "algorithm": algorithm}
                ours = await outcome(fast.check_with_info, *args, **keywords)
                theirs = await outcome(PYTHON_CHECK, python, *args, **keywords)
                assert ours == theirs, (args, keywords)
        assert state(fast) == state(python)

    asyncio.run(run())


IDENTITIES = ["u\udc80", "u1", "a b/c@d", "é" * 5, "x" * 65, "%41{}:~!", ""]
SCOPES = ["global", "GET /items/{id}", "y" * 80, "s:1"]


@pytest.mark.parametrize("options", [{}, {"identity_secret": b"s" * 32, "key_prefix": "p.q"}])
@pytest.mark.parametrize("rate", ["4/second", "2/second;3/minute;9/hour"])
def test_the_keys_are_the_python_paths_for_every_identity_and_scope(
    options: dict[str, Any], rate: str
) -> None:
    """A plan's arguments are parsed on its first check here (a refused identity's, first:
    not kept) and reused by every identity after; the keys are built in place for each."""
    clock = Clock()
    fast, python = twins(clock, **options)
    fast.plan_for(rate)

    async def run() -> None:
        for step in range(6):
            clock.now_ms += 400 * step
            for identity in IDENTITIES:
                for scope in SCOPES:
                    ours = await outcome(fast.check_with_info, identity, rate, scope=scope)
                    theirs = await outcome(PYTHON_CHECK, python, identity, rate, scope=scope)
                    assert ours == theirs, (identity, scope)
        assert state(fast) == state(python)

    asyncio.run(run())
    assert fast._fast_check.compiled_count == 1  # type: ignore[attr-defined]


def test_the_fast_path_is_taken_for_the_common_check_only() -> None:
    limiter = RateLimiter("memory://")

    async def run() -> None:
        await limiter.check_with_info("k", "5/second")  # the plan is made here
        assert type(limiter.check_with_info("k", "5/second")) is _accel.ReadyCheck
        call = limiter.check_with_info("k", "5/second", scope="s", algorithm=None, cost=1)
        assert type(call) is _accel.ReadyCheck
        await call
        for uncommon in ({"cost": 2}, {"tenant": "t"}, {"burst": 3}, {"scope": b"s"}):
            other = limiter.check_with_info("k", "5/second", **uncommon)
            assert inspect.iscoroutine(other), uncommon
            await outcome(lambda: other)  # noqa: B023  # awaited at once
        first = limiter.check_with_info("k", "7/second")  # no plan yet
        assert inspect.iscoroutine(first)
        await first
        assert type(limiter.check_with_info("k", "7/second")) is _accel.ReadyCheck

    asyncio.run(run())


def test_what_is_attached_or_changed_later_counts_from_the_next_check() -> None:
    limiter = RateLimiter("memory://")
    seen: list[Any] = []

    class Recorder(CheckRecorder):
        def decided(self, *args: Any) -> None:
            seen.append(args)

        def failed(self, *args: Any) -> None:
            seen.append(args)

    def taken_fast() -> bool:
        call = limiter.check_with_info("k", "100/second")
        fast = type(call) is _accel.ReadyCheck
        asyncio.run(call)  # type: ignore[arg-type]
        return fast

    asyncio.run(limiter.check_with_info("k", "100/second"))
    assert taken_fast()
    limiter.recorder = Recorder()
    assert not taken_fast() and len(seen) == 1
    limiter.recorder = None
    assert taken_fast()
    limiter.breaker.failure()  # a failure counted: the breaker is not settled
    assert not taken_fast()  # ... and this success settles it again
    assert taken_fast()
    limiter.failure_log.active = True
    assert not taken_fast()
    limiter.failure_log.active = False
    limiter.metrics = MagicMock()
    assert not taken_fast()
    limiter.metrics = None
    limiter._plans._plans = {}  # the plan cache started over, as Plans.get starts it over
    limiter._plans.defaults.clear()
    assert not taken_fast()
    assert taken_fast()


def test_shadow_mode_on_the_fast_path() -> None:
    clock = Clock()
    fast, python = twins(clock, shadow=True)

    fast.plan_for("2/minute")  # the fast path takes rates with a plan made

    async def run() -> None:
        for _ in range(4):
            ours = fast.check_with_info("k", "2/minute")
            assert type(ours) is _accel.ReadyCheck
            assert await ours == await PYTHON_CHECK(python, "k", "2/minute")
        denied = await fast.check_with_info("k", "2/minute", shadow=False)
        assert denied.allowed is False
        assert (await fast.check_with_info("k", "2/minute")).shadow_denied is True

    asyncio.run(run())


def test_errors_are_raised_when_awaited_as_the_python_path_raises_them() -> None:
    clock = Clock()
    fast, python = twins(clock)

    async def run() -> None:
        await fast.check_with_info("k", "5/second")
        await PYTHON_CHECK(python, "k", "5/second")
        for limiter in (fast, python):  # a counter below zero
            (key,) = limiter.backend.decision_keys(  # type: ignore[attr-defined]
                limiter.plan_for("5/second"), "k", None, "global"
            )
            limiter.backend.store.load(  # type: ignore[attr-defined]
                key + b":" + str(START_MS // 1000).encode(), -1, -1
            )
        call = fast.check_with_info("k", "5/second")  # decided (and refused) here
        assert type(call) is _accel.ReadyCheck
        with pytest.raises(BackendError) as ours:
            await call
        with pytest.raises(BackendError) as theirs:
            await PYTHON_CHECK(python, "k", "5/second")
        assert str(ours.value) == str(theirs.value)
        assert type(ours.value) is type(theirs.value)
        assert fast.failure_log.active == python.failure_log.active

        def broken() -> int:
            raise OSError("no clock")

        fast.backend.clock = broken  # type: ignore[attr-defined]
        call = fast.check_with_info("k", "5/second")
        with pytest.raises(OSError, match="no clock"):
            await call
        fast.backend.clock = lambda: "soon"  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            await fast.check_with_info("k", "5/second")

    asyncio.run(run())


def test_a_ready_check_is_a_completed_coroutine() -> None:
    limiter = RateLimiter("memory://")
    asyncio.run(limiter.check_with_info("k", "100/second"))
    call = limiter.check_with_info("k", "100/second")
    assert asyncio.iscoroutine(call)
    assert not asyncio.isfuture(call) and call._asyncio_future_blocking is None
    result = asyncio.run(call)  # type: ignore[arg-type]
    assert result.allowed and result.remaining == 98

    async def tasks() -> None:
        task = asyncio.ensure_future(limiter.check_with_info("k", "100/second"))
        assert (await task).remaining == 97
        gathered = await asyncio.gather(
            *(limiter.check_with_info("k", "100/second") for _ in range(3))
        )
        assert [each.remaining for each in gathered] == [96, 95, 94]
        again = limiter.check_with_info("k", "100/second")
        await again
        with pytest.raises(RuntimeError, match="cannot reuse"):
            await again

    asyncio.run(tasks())
    call = limiter.check_with_info("k", "100/second")
    with pytest.raises(TypeError):
        call.send(1)
    with pytest.raises(StopIteration) as stop:
        call.send(None)
    assert stop.value.value.remaining == 92
    thrown = limiter.check_with_info("k", "100/second")
    with pytest.raises(KeyError):
        thrown.throw(KeyError("x"))
    with pytest.raises(RuntimeError):
        thrown.send(None)
    closed = limiter.check_with_info("k", "100/second")
    assert closed.close() is None
    with pytest.raises(RuntimeError):
        closed.send(None)


def test_the_method_still_reads_as_the_python_method() -> None:
    for limiter_class in (RateLimiter, BlockingRateLimiter):
        method: Any = limiter_class.check_with_info
        assert type(method) is _accel.FastMethod
        assert method.__name__ == "check_with_info"
        assert method.__doc__ == method.__wrapped__.__doc__
        assert inspect.signature(method) == inspect.signature(method.__wrapped__)
        bound = limiter_class("memory://").check_with_info
        assert list(inspect.signature(bound).parameters)[:2] == ["key", "rate"]
        # check: check_with_info's call and parameters, its own name, words and answer
        check: Any = limiter_class.check
        assert type(check) is _accel.FastMethod
        assert (check.__name__, check.__qualname__) == ("check", f"{limiter_class.__name__}.check")
        assert check.__doc__.startswith("Charge ``cost`` if every policy of ``rate`` admits it")
        assert check.__wrapped__ is method.__wrapped__
        signature = inspect.signature(check)
        assert signature.return_annotation == "bool"
        assert signature.parameters == inspect.signature(method).parameters
        assert list(inspect.signature(limiter_class("memory://").check).parameters)[:2] == [
            "key",
            "rate",
        ]


def test_check_answers_true_or_raises_the_denial_on_every_path() -> None:
    """The one-call path (no tenant) and the Python path (a tenant) alike."""
    limiter = BlockingRateLimiter("memory://")
    for tenant in (None, "gold"):
        assert [limiter.check("k", "2/minute", tenant=tenant) for _ in range(2)] == [True, True]
        with pytest.raises(RateLimitExceeded) as denied:
            limiter.check("k", "2/minute", tenant=tenant)
        assert (denied.value.limit, denied.value.remaining) == (2, 0)

    async def awaited() -> None:
        limiter = RateLimiter("memory://")
        for tenant in (None, "gold"):
            admitted = [await limiter.check("k", "2/minute", tenant=tenant) for _ in range(2)]
            assert admitted == [True, True]
            with pytest.raises(RateLimitExceeded) as denied:
                await limiter.check("k", "2/minute", tenant=tenant)
            assert (denied.value.limit, denied.value.remaining) == (2, 0)
            assert await limiter.check("k", "2/minute", tenant=tenant, shadow=True) is True

    asyncio.run(awaited())


def test_other_backends_and_subclasses_keep_the_python_path() -> None:
    remote = RateLimiter("redis://localhost:1")  # nothing connects until a check
    # The asyncio limiter over one Redis server has its own one-call path
    # (tests/redis/test_fast_aredis.py); over a cluster, none.
    assert type(remote._fast_check) is _accel.AsyncRedisFastCheck  # type: ignore[attr-defined]
    assert RateLimiter("redis+cluster://localhost:1")._fast_check is None  # type: ignore[attr-defined]
    # The blocking limiter over one Redis server has its own one-call path
    # (tests/redis/test_fast_redis.py); over a cluster, none.
    blocking = BlockingRateLimiter("redis://localhost:1")
    linux = sys.platform.startswith("linux")  # kernel timeouts: the path's condition
    wanted = _accel.RedisFastCheck if linux else type(None)
    assert type(blocking._fast_check) is wanted  # type: ignore[attr-defined]
    cluster = BlockingRateLimiter("redis+cluster://localhost:1")
    assert cluster._fast_check is None  # type: ignore[attr-defined]

    class Mine(RateLimiter):
        async def check_with_info(self, *args: Any, **keywords: Any) -> Any:  # type: ignore[override]
            return await super().check_with_info(*args, **keywords)

    mine = Mine("memory://")
    assert asyncio.run(mine.check_with_info("k", "3/second")).remaining == 2
    call = mine.check_with_info("k", "3/second")
    assert inspect.iscoroutine(call)  # its own method, which reaches the fast one
    assert asyncio.run(call).remaining == 1


def blocking_twins(clock: Clock) -> tuple[BlockingRateLimiter, BlockingRateLimiter]:
    limiters = (BlockingRateLimiter("memory://"), BlockingRateLimiter("memory://"))
    for limiter in limiters:
        limiter.backend.clock = clock  # type: ignore[attr-defined]
    return limiters


def blocking_outcome(call: Callable[..., Any], *args: Any, **keywords: Any) -> Any:
    try:
        return call(*args, **keywords)
    except Exception as error:
        return (type(error), str(error))


@pytest.mark.parametrize("algorithm", [None, *ALGORITHMS])
def test_the_blocking_limiter_gives_the_python_paths_results(algorithm: Optional[str]) -> None:
    clock = Clock()
    fast, python = blocking_twins(clock)
    assert fast._fast_check is not None  # type: ignore[attr-defined]
    for step in range(40):
        clock.now_ms += 137 * (step % 5)
        for args, keywords in CASES:
            if algorithm is not None:
                keywords = {**keywords, "algorithm": algorithm}
            ours = blocking_outcome(fast.check_with_info, *args, **keywords)
            theirs = blocking_outcome(PYTHON_BLOCKING_CHECK, python, *args, **keywords)
            assert ours == theirs, (args, keywords)
    assert state(fast) == state(python)


def test_the_blocking_limiter_from_many_threads_admits_exactly_the_quota() -> None:
    limiter = BlockingRateLimiter("memory://")
    limiter.check_with_info("warm", "1000/hour")
    admitted = []
    lock = threading.Lock()

    def work() -> None:
        mine = sum(limiter.check_with_info("shared", "1000/hour").allowed for _ in range(300))
        with lock:
            admitted.append(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 1000
    with pytest.raises(RateLimitConfigError):
        limiter.check_with_info("k", "1000/hour", cost=0)
