"""The contenders of the limiter-only and in-process sections, behind one small interface.

A subject opens its client and returns a ``check(key)`` awaitable factory (or a
plain function, for a synchronous in-process store) plus a predicate telling
whether a result was an admission. Every subject is configured to the same
rate, :data:`RATE` (large enough that every check is an admission, so each
one is the library's full allowed path), and keeps its keys apart from the
others' so that no two share (or WRONGTYPE) a Redis key.

Peers are imported only when their subject opens: the peers live in the
``bench`` extra and are never runtime dependencies of moderato.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional

from moderato import RateLimiter
from moderato.algorithms import ALGORITHMS

RATE_LIMIT = 1_000_000
RATE = f"{RATE_LIMIT}/minute"

Check = Callable[[str], Any]  # returns an awaitable (async subjects) or the result
Close = Callable[[], Awaitable[None]]


@dataclass
class Opened:
    check: Check
    admitted: Callable[[Any], bool]
    close: Close
    is_async: bool = True


@dataclass
class Subject:
    name: str
    library: str  # "moderato" | "limits" | "fastapi-limiter"
    algorithm: str  # the rate law, in words: "fixed window", "sliding log", ...
    open: Callable[[], Awaitable[Opened]]
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# The rate law each moderato algorithm implements, to pair it with a peer's.
ALGORITHM_FAMILY = {
    "fixed_window": "fixed window",
    "sliding_window": "sliding window counter",
    "token_bucket": "token bucket",
    "gcra": "GCRA (token bucket)",
    "sliding_log": "sliding log",
    "leaky_bucket": "leaky bucket (policing)",
}


async def _nothing() -> None:
    return None


def _is_allowed(result: Any) -> bool:
    return bool(result.allowed)


def _is_true(result: Any) -> bool:
    return result is True


def _is_not_limited(result: Any) -> bool:
    return not result.limited


def _is_zero_wait(wait_ms: float) -> bool:
    return wait_ms == 0


def moderato_subjects(
    url: str, label: str = "moderato", rate: str = RATE, connections: Optional[int] = None
) -> list[Subject]:
    """One subject per registered algorithm (moderato.algorithms.ALGORITHMS)."""

    def opener(algorithm: str) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            # None: the limiter's default (two connections per loop).
            options = {} if connections is None else {"connections_per_loop": connections}
            limiter = RateLimiter(
                url, key_prefix=f"bench-lo-{connections}", connect_timeout_s=5.0, **options
            )
            await limiter.connect()
            check_with_info = limiter.check_with_info

            def check(key: str) -> Awaitable[Any]:
                return check_with_info(key, rate, algorithm=algorithm)

            return Opened(check, _is_allowed, limiter.close)

        return open_

    return [
        Subject(
            name=f"{label} {name}",
            library="moderato",
            algorithm=ALGORITHM_FAMILY.get(name, name.replace("_", " ")),
            open=opener(name),
            note="RateLimiter.check_with_info; the default auto-pipelined connections per loop",
            extra={"moderato_algorithm": name},
        )
        for name in ALGORITHMS
    ]


def moderato_tuned_subjects(url: str, algorithm: str = "token_bucket") -> list[Subject]:
    """Not the default: one connection per loop, to show what the second one buys."""
    subject = next(
        s
        for s in moderato_subjects(url, connections=1)
        if s.extra["moderato_algorithm"] == algorithm
    )
    subject.name = f"moderato {algorithm}, 1 connection"
    subject.library = "moderato (tuned)"
    subject.note = "RateLimiter(connections_per_loop=1): not the default; not in the targets"
    subject.extra["connections_per_loop"] = 1
    return [subject]


def bare_client_subjects(port: int, algorithm: str = "token_bucket") -> list[Subject]:
    """What any Python asyncio client can do: the least code that runs the same EVALSHA.

    Not a limiter and not a peer: a reference. It builds the same keys and
    arguments with moderato's C functions, writes each command at once (no
    batching, no timeouts, no reconnects, no NOSCRIPT recovery) on one
    connection and hands replies to futures in order. The gap between it and
    redis-benchmark is the price of the event loop itself; the gap between
    moderato and it is the price of the rest.
    """

    async def open_() -> Opened:
        import asyncio

        from moderato import _accel
        from moderato.policy import policy_for
        from moderato.scripts import load_script

        chosen = ALGORITHMS[algorithm]
        policy = policy_for(RATE)
        script = load_script(chosen.name)
        args = (1000, 1, *chosen.policy_args(policy.rates[0]))
        loop = asyncio.get_running_loop()
        transport, send = await bare_client(
            lambda protocol: loop.create_connection(protocol, "127.0.0.1", port), script.source
        )

        def check(key: str) -> Awaitable[Any]:
            keys = _accel.build_keys("bench-bare", chosen.key_tag, "", "global", key, (60,))
            return send(_accel.encode_evalsha(script.sha, keys, args))

        async def close() -> None:
            transport.close()

        return Opened(check, lambda reply: bool(reply[0]), close)

    return [
        Subject(
            name=f"bare asyncio client, {algorithm} script",
            library="reference",
            algorithm=ALGORITHM_FAMILY[algorithm],
            open=open_,
            note=(
                "asyncio.Protocol + hiredis, one connection, each EVALSHA written at once; "
                "not a limiter: the floor of any Python asyncio client (not in the targets)"
            ),
            extra={"moderato_algorithm": algorithm},
        )
    ]


async def bare_client(
    connect: Callable[[Any], Awaitable[Any]], script_source: str, per_turn: bool = False
) -> Any:
    """The bare client's connection: ``connect(protocol_factory)`` (the loop's
    create_connection or create_unix_connection), the script loaded; returns the
    transport and ``send(command) -> future of its reply`` (hiredis, replies in order).

    ``per_turn`` (benchmarks/sequential_floor.py only): each command is not written
    at once but with every other command of its loop turn, in one write made by a
    ``loop.call_soon`` callback the turn's first command schedules, as moderato's
    pipelining does."""
    import asyncio
    from collections import deque

    import hiredis

    from moderato import _accel

    loop = asyncio.get_running_loop()
    waiting: deque[asyncio.Future[Any]] = deque()

    class Protocol(asyncio.Protocol):
        def __init__(self) -> None:
            self.reader = hiredis.Reader()

        def data_received(self, data: bytes) -> None:
            self.reader.feed(data)
            reply = self.reader.gets()
            while reply is not False:
                waiting.popleft().set_result(reply)
                reply = self.reader.gets()

    transport, _ = await connect(Protocol)
    write = transport.write
    if per_turn:
        queued: list[bytes] = []
        write_now = transport.write

        def flush() -> None:
            write_now(b"".join(queued) if len(queued) > 1 else queued[0])
            queued.clear()

        def write(data: bytes) -> None:
            if not queued:
                loop.call_soon(flush)
            queued.append(data)

    def send(command: bytes) -> asyncio.Future[Any]:
        future = loop.create_future()
        waiting.append(future)
        write(command)
        return future

    await send(_accel.encode_command("SCRIPT", "LOAD", script_source))
    return transport, send


LIMITS_STRATEGIES = {
    # limits' strategy class name -> (its slug, the moderato algorithm of the same rate law)
    "MovingWindowRateLimiter": ("moving-window", "sliding_log"),
    "FixedWindowRateLimiter": ("fixed-window", "fixed_window"),
    "SlidingWindowCounterRateLimiter": ("sliding-window-counter", "sliding_window"),
}


def _both_apis(asynchronous_api: str, blocking_api: str) -> list[tuple[bool, str, str]]:
    """A peer's asyncio API and its blocking one: (asynchronous, its name, how a check is
    called, for the subject's note)."""
    return [(True, asynchronous_api, " (awaited)"), (False, blocking_api, " (plain call)")]


def limits_redis_subjects(port: int, implementations: tuple[str, ...]) -> list[Subject]:
    """limits' async Redis storage (``async+redis://``), each strategy and client library."""

    # One storage per client library, shared by its strategies as in an app: its
    # connection pool fills once (a thousand connections take about a second).
    storages: dict[str, Any] = {}

    def opener(
        implementation: str, strategy_name: str, slug: str
    ) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            from limits import RateLimitItemPerMinute
            from limits.aio import strategies
            from limits.aio.storage import RedisStorage

            storage = storages.get(implementation)
            if storage is None:
                storage = RedisStorage(
                    f"async+redis://127.0.0.1:{port}", implementation=implementation
                )
                storages[implementation] = storage
            strategy = getattr(strategies, strategy_name)(storage)
            item = RateLimitItemPerMinute(RATE_LIMIT)
            hit = strategy.hit
            prefix = f"{implementation}-{slug}:"

            def check(key: str) -> Awaitable[bool]:
                return hit(item, prefix + key)

            return Opened(check, _is_true, _nothing)

        return open_

    subjects = []
    for implementation in implementations:
        for strategy_name, (slug, pair) in LIMITS_STRATEGIES.items():
            default = " (the default client)" if implementation == "coredis" else ""
            subjects.append(
                Subject(
                    name=f"limits {slug} ({implementation})",
                    library="limits",
                    algorithm=ALGORITHM_FAMILY[pair],
                    open=opener(implementation, strategy_name, slug),
                    note=(
                        f"limits.aio.strategies.{strategy_name} over "
                        f"limits.aio.storage.RedisStorage, implementation={implementation!r}"
                        f"{default}"
                    ),
                )
            )
    return subjects


def fastapi_limiter_subjects(url: str) -> list[Subject]:
    """fastapi-limiter 0.2's check path: pyrate-limiter's ``Limiter.try_acquire_async``.

    fastapi-limiter's dependency computes ``"<ip>:<path>"`` and calls exactly
    this (non-blocking); the route scan it does first is in the end-to-end
    section. Two Redis setups: the RedisBucket (sorted-set log) and the
    constant-state GCRA bucket over RedisStateStore.
    """

    def opener(kind: str) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            import redis.asyncio as aioredis
            from pyrate_limiter import (
                GCRA,
                Duration,
                Limiter,
                Rate,
                RedisBucket,
                RedisStateStore,
                StateBucket,
            )

            client = aioredis.from_url(url)
            rate = Rate(RATE_LIMIT, Duration.MINUTE)
            bucket: Any
            if kind == "log":
                bucket = await RedisBucket.init([rate], client, "bench-lo-pyrate:log")
            else:
                store = RedisStateStore(client, "bench-lo-pyrate:gcra")
                bucket = StateBucket([rate], algorithm=GCRA(), store=store)
            limiter = Limiter(bucket)
            acquire = limiter.try_acquire_async

            def check(key: str) -> Awaitable[bool]:
                return acquire(key, blocking=False)

            async def close() -> None:
                limiter.close()
                await client.aclose()

            return Opened(check, _is_true, close)

        return open_

    common = (
        "pyrate_limiter.Limiter.try_acquire_async(blocking=False), as fastapi-limiter's "
        "RateLimiter dependency calls it; redis-py asyncio client. One bucket = one Redis "
        "key: every identity shares one quota (no per-client buckets without a custom "
        "BucketFactory); acquisitions in one process are serialised by an asyncio.Lock"
    )
    return [
        Subject(
            name="fastapi-limiter RedisBucket",
            library="fastapi-limiter",
            algorithm="sliding log",
            open=opener("log"),
            note=f"RedisBucket (sorted-set log, client clock). {common}",
        ),
        Subject(
            name="fastapi-limiter GCRA",
            library="fastapi-limiter",
            algorithm="GCRA (token bucket)",
            open=opener("gcra"),
            note=f"StateBucket(GCRA) over RedisStateStore. {common}",
        ),
    ]


def in_process_subjects(rate: str = RATE) -> list[Subject]:
    """memory:// (each algorithm) against limits' MemoryStorage (async and sync APIs)."""
    subjects = moderato_subjects("memory://", label="moderato memory://", rate=rate)
    for subject in subjects:
        subject.note = "RateLimiter('memory://').check_with_info (C store, awaited)"

    def limits_opener(strategy_name: str, asynchronous: bool) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            from limits import parse

            item = parse(rate)
            if asynchronous:
                from limits.aio import strategies as aio_strategies
                from limits.aio.storage import MemoryStorage as AsyncMemoryStorage

                strategy: Any = getattr(aio_strategies, strategy_name)(AsyncMemoryStorage())
            else:
                from limits import strategies
                from limits.storage import MemoryStorage

                strategy = getattr(strategies, strategy_name)(MemoryStorage())
            hit = strategy.hit

            def check(key: str) -> Any:
                return hit(item, key)

            return Opened(check, _is_true, _nothing, is_async=asynchronous)

        return open_

    for asynchronous, api, called in _both_apis("limits.aio", "limits"):
        for strategy_name, (slug, pair) in LIMITS_STRATEGIES.items():
            subjects.append(
                Subject(
                    name=f"{api} MemoryStorage {slug}",
                    library="limits",
                    algorithm=ALGORITHM_FAMILY[pair],
                    open=limits_opener(strategy_name, asynchronous),
                    note=f"{api}.strategies.{strategy_name} over {api}.storage.MemoryStorage"
                    + called,
                    extra={"strategy": strategy_name, "api": api, "moderato_pair": pair},
                )
            )
    return subjects + throttled_memory_subjects(rate) + traffik_memory_subjects(rate)


# Each in-process peer's algorithm -> the moderato algorithm with the same rate law.
THROTTLED_PAIRS = {
    "fixed_window": "fixed_window",
    "sliding_window": "sliding_window",
    "token_bucket": "token_bucket",
    "leaking_bucket": "leaky_bucket",
    "gcra": "gcra",
}
TRAFFIK_PAIRS = {
    "FixedWindowStrategy": "fixed_window",
    "SlidingWindowCounterStrategy": "sliding_window",
    "SlidingWindowLogStrategy": "sliding_log",
    "TokenBucketStrategy": "token_bucket",
    "LeakyBucketStrategy": "leaky_bucket",
    "GCRAStrategy": "gcra",
}


def _limit_and_window_s(rate: str) -> tuple[int, int]:
    """'1000/second' -> (1000, 1): the scenarios' rates, for the peers' own rate types."""
    from limits import parse

    item = parse(rate)
    return item.amount, item.get_expiry()


def throttled_memory_subjects(rate: str) -> list[Subject]:
    """throttled-py's MemoryStore, its sync and asyncio Throttled, every algorithm."""
    if importlib.util.find_spec("throttled") is None:  # Python 3.9: it needs 3.10
        return []

    def opener(algorithm: str, asynchronous: bool) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            import throttled
            import throttled.asyncio as throttled_asyncio

            limit, window_s = _limit_and_window_s(rate)
            package: Any = throttled_asyncio if asynchronous else throttled
            throttle = package.Throttled(
                using=algorithm,
                quota=package.per_duration(timedelta(seconds=window_s), limit=limit),
                store=package.MemoryStore(),
            )
            return Opened(throttle.limit, _is_not_limited, _nothing, is_async=asynchronous)

        return open_

    subjects = []
    for asynchronous, api, called in _both_apis("throttled-py asyncio", "throttled-py"):
        for algorithm, pair in THROTTLED_PAIRS.items():
            subjects.append(
                Subject(
                    name=f"{api} MemoryStore {algorithm}",
                    library="throttled-py",
                    algorithm=ALGORITHM_FAMILY[pair],
                    open=opener(algorithm, asynchronous),
                    note=f"{api} Throttled(using={algorithm!r}, store=MemoryStore()).limit"
                    + called,
                    extra={"api": api, "strategy": algorithm, "moderato_pair": pair},
                )
            )
    return subjects


def traffik_memory_subjects(rate: str) -> list[Subject]:
    """traffik's InMemoryBackend under each strategy, awaited as its throttles await it."""
    if importlib.util.find_spec("traffik") is None:
        return []

    def opener(strategy_name: str) -> Callable[[], Awaitable[Opened]]:
        async def open_() -> Opened:
            import traffik
            from traffik import strategies as traffik_strategies
            from traffik.backends.inmemory import InMemoryBackend

            limit, window_s = _limit_and_window_s(rate)
            backend = InMemoryBackend()
            await backend.initialize()
            strategy = getattr(traffik_strategies, strategy_name)()
            traffik_rate = traffik.Rate(limit=limit, seconds=window_s)

            def check(key: str) -> Awaitable[float]:
                return strategy(key, traffik_rate, backend)  # type: ignore[no-any-return]

            return Opened(check, _is_zero_wait, backend.close)

        return open_

    return [
        Subject(
            name=f"traffik InMemoryBackend {strategy_name.removesuffix('Strategy')}",
            library="traffik",
            algorithm=ALGORITHM_FAMILY[pair],
            open=opener(strategy_name),
            note=f"traffik.strategies.{strategy_name}()(key, rate, InMemoryBackend()) (awaited)",
            extra={"api": "traffik", "strategy": strategy_name, "moderato_pair": pair},
        )
        for strategy_name, pair in TRAFFIK_PAIRS.items()
    ]


def best(values: dict[str, float], names: Optional[list[str]] = None) -> tuple[str, float]:
    """The name and value of the largest entry (restricted to ``names`` if given)."""
    pool = {k: v for k, v in values.items() if names is None or k in names}
    name = max(pool, key=lambda k: pool[k])
    return name, pool[name]
