"""burst=: a bucket that holds more (or fewer) requests than the limit it refills per window,
for token_bucket, gcra and leaky_bucket, everywhere a rate is given: check(),
check_with_info(), get_usage(), reset(), the decorator, the dependency, the middlewares,
install(rate=...), websocket message limits and the blocking limiter.

On memory:// time is driven by hand and every count is exact; on Redis time is real, and
a count over a stretch of real time is held to the bounds that stretch measured.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Callable

import pytest
import pytest_asyncio
from fastapi import Depends, FastAPI, WebSocket
from http_helpers import client
from uvicorn_helpers import running
from websockets.asyncio.client import connect

from moderato import RateLimitConfigError, RateLimiter, install
from moderato import sync as blocking
from moderato.integrations import RateLimitMiddleware
from moderato.results import CheckResult

BUCKETS = ("token_bucket", "gcra", "leaky_bucket")
WINDOWS = ("fixed_window", "sliding_window", "sliding_log")
NOW_MS = 1_800_000_000_000  # a whole second


class Clock:
    """memory://'s clock, moved by hand."""

    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


def memory_limiter(algorithm: str = "token_bucket") -> tuple[RateLimiter, Clock]:
    limiter = RateLimiter("memory://", key_prefix="burst", default_algorithm=algorithm)
    clock = Clock()
    limiter.backend.clock = clock  # type: ignore[attr-defined]
    return limiter, clock


async def admitted(calls: int, check: Callable[[], Awaitable[CheckResult]]) -> int:
    """How many of ``calls`` checks issued together (one write to Redis) are admitted."""
    results = await asyncio.gather(*(check() for _ in range(calls)))
    return sum(result.allowed for result in results)


# -- the rate: 50 at once, then 10 per second --------------------------------------------------


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_fifty_at_once_then_ten_per_second_on_memory(algorithm: str) -> None:
    limiter, clock = memory_limiter()

    def check() -> Awaitable[CheckResult]:
        return limiter.check_with_info("u", "10/second", burst=50, algorithm=algorithm)

    assert await admitted(60, check) == 50
    refused = await check()
    assert (refused.allowed, refused.limit, refused.refill, refused.remaining) == (
        False,
        50,
        10,
        0,
    )
    # The next request fits in 100 ms: Retry-After rounds that up to a second.
    assert (refused.retry_after, refused.reset_at) == (1, (NOW_MS + 100) / 1000)
    for second in range(1, 6):
        clock.now_ms = NOW_MS + 1000 * second
        assert await admitted(20, check) == 10
    # At the second's edge: 9 of the next second's 10 are in by 999 ms.
    clock.now_ms += 999
    assert await admitted(20, check) == 9
    clock.now_ms += 1
    assert await admitted(20, check) == 1
    # Idle for 5 s: the burst is whole again, and no more.
    clock.now_ms += 5000
    assert await admitted(60, check) == 50


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_fifty_at_once_then_ten_per_second_on_redis(redis_url: str, algorithm: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="burst")
    try:

        def check() -> Awaitable[CheckResult]:
            return limiter.check_with_info("u", "10/second", burst=50, algorithm=algorithm)

        await limiter.connect()
        burst_start_s = time.monotonic()
        assert await admitted(60, check) == 50
        burst_end_s = time.monotonic()
        # Then the refill alone: poll faster than it (every 20 ms) for about 3 s, then
        # take whatever is left in one batch, so every unit credited is counted.
        polled = 0
        while time.monotonic() - burst_end_s < 3:
            polled += (await check()).allowed
            await asyncio.sleep(0.02)
        drain_start_s = time.monotonic()
        polled += await admitted(20, check)
        drain_end_s = time.monotonic()
        # Credited between the burst and the drain, on Redis's clock: 10 per second of a
        # stretch that lies between these two, give or take the unit at each edge.
        shortest_s, longest_s = drain_start_s - burst_end_s, drain_end_s - burst_start_s
        assert math.floor(10 * shortest_s) - 1 <= polled <= math.floor(10 * longest_s) + 1, (
            polled,
            shortest_s,
            longest_s,
        )
    finally:
        await limiter.close()


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_three_per_second_with_a_burst_of_ten(algorithm: str) -> None:
    """Not expressible as a rate of its own ("10/3.33 seconds"): 10 at once, then 3/s."""
    limiter, clock = memory_limiter(algorithm)

    def check() -> Awaitable[CheckResult]:
        return limiter.check_with_info("u", "3/second", burst=10)

    assert await admitted(12, check) == 10
    clock.now_ms = NOW_MS + 333
    assert await admitted(2, check) == 0
    clock.now_ms = NOW_MS + 334  # the first unit is credited at ceil(1000 / 3) ms
    assert await admitted(2, check) == 1
    clock.now_ms = NOW_MS + 9334  # 9 more seconds: 27 units' worth, capped at the 10
    assert await admitted(12, check) == 10


@pytest.mark.parametrize("algorithm", BUCKETS)
async def test_a_burst_below_the_limit(algorithm: str) -> None:
    """10/second with burst=5: at most 5 at once, one more every 100 ms, 10 per second."""
    limiter, clock = memory_limiter(algorithm)

    def check() -> Awaitable[CheckResult]:
        return limiter.check_with_info("u", "10/second", burst=5)

    assert await admitted(8, check) == 5
    total = 0
    for step in range(1, 11):
        clock.now_ms = NOW_MS + 100 * step
        total += await admitted(3, check)
    assert total == 10
    clock.now_ms += 60_000
    assert await admitted(8, check) == 5
    # A cost above the burst can never fit: a permanent denial, 422.
    too_big = await limiter.check_with_info("v", "10/second", burst=5, cost=6)
    assert (too_big.allowed, too_big.retry_after, too_big.status_code) == (False, None, 422)


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", WINDOWS)
async def test_a_window_algorithm_takes_no_burst(algorithm: str) -> None:
    limiter, _ = memory_limiter(algorithm)
    message = rf"^burst= needs an algorithm that refills a bucket .*; {algorithm} counts requests"
    calls: list[Callable[[], Any]] = [
        lambda: limiter.check("u", "10/second", burst=50),
        lambda: limiter.check_with_info("u", "10/second", burst=50),
        lambda: limiter.get_usage("u", "10/second", burst=50),
        lambda: limiter.reset("u", rate="10/second", burst=50, algorithm=algorithm),
        # Even a burst equal to the limit: the option itself is meaningless here.
        lambda: limiter.check("u", "10/second", burst=10),
    ]
    for call in calls:
        with pytest.raises(RateLimitConfigError, match=message):
            await call()
    for declare in (limiter.limit, limiter.dependency, limiter.message_limit):
        with pytest.raises(RateLimitConfigError, match=message):
            declare("10/second", burst=50)
    with pytest.raises(RateLimitConfigError, match=message):
        RateLimitMiddleware(FastAPI(), limiter=limiter, rate="10/second", burst=50)
    with pytest.raises(RateLimitConfigError, match=message):
        install(FastAPI(), limiter, rate="10/second", burst=50)
    sync_limiter = blocking.RateLimiter("memory://", default_algorithm=algorithm)
    with pytest.raises(RateLimitConfigError, match=message):
        sync_limiter.check("u", "10/second", burst=50)
    with pytest.raises(RateLimitConfigError, match=message):
        sync_limiter.limit("10/second", burst=50)


@pytest.mark.parametrize(
    ("rate", "burst", "algorithm", "message"),
    [
        ("10/second", 0, "token_bucket", r"^burst must be 1\.\.9007199254, got 0$"),
        ("10/second", -5, "gcra", r"^burst must be 1\.\.9007199254, got -5$"),
        ("10/second", 9_007_199_255, "gcra", r"^burst must be 1\.\.9007199254, got"),
        ("10/second", 2.5, "token_bucket", r"^burst must be a positive integer .*float 2\.5$"),
        ("10/second", True, "token_bucket", r"^burst must be a positive integer .*bool True$"),
        ("10/second", "50", "leaky_bucket", r"^burst must be a positive integer .*str '50'$"),
        (
            "10/second;1000/hour",
            50,
            "token_bucket",
            r"^burst= applies to a rate of one policy, got '10/second;1000/hour' \(2 policies\)",
        ),
        # 1/day: a burst refills within ten 360-day years (3600 days), GCRA's within 41.
        (
            "1/day",
            3601,
            "token_bucket",
            r"^rate '1/day' with burst 3601: token_bucket refills a burst within 311040000 "
            r"seconds .* so the largest burst of '1/day' is 3600, got 3601",
        ),
        ("1/day", 42, "gcra", r"the largest burst of '1/day' is 41, got 42"),
        ("10/second", 35_996_271, "gcra", r"the largest burst of '10/second' is 35996270"),
    ],
)
async def test_bad_bursts_are_refused_before_any_backend_call(
    rate: str, burst: Any, algorithm: str, message: str
) -> None:
    limiter, _ = memory_limiter()
    with pytest.raises(RateLimitConfigError, match=message):
        await limiter.check("u", rate, burst=burst, algorithm=algorithm)
    with pytest.raises(RateLimitConfigError, match=message):
        limiter.limit(rate, burst=burst, algorithm=algorithm)
    assert len(limiter.backend.store) == 0  # type: ignore[attr-defined]


async def test_a_reset_by_burst_needs_its_rate() -> None:
    limiter, _ = memory_limiter()
    with pytest.raises(RateLimitConfigError, match=r"^reset\(\) got burst= without rate="):
        await limiter.reset("u", burst=50)


async def test_a_static_cost_above_the_burst_is_refused_at_decoration() -> None:
    limiter, _ = memory_limiter()
    with pytest.raises(
        RateLimitConfigError,
        match=r"^cost 6 exceeds capacity 5 of policy '10/second' with burst 5",
    ):
        limiter.limit("10/second", burst=5, cost=6)
    limiter.limit("10/second", burst=50, cost=20)  # above the limit, within the burst


# -- keys: a burst's state is its own ----------------------------------------------------------


@pytest_asyncio.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        made, _ = memory_limiter()
    else:
        made = RateLimiter(
            request.getfixturevalue("redis_url"),
            key_prefix="burst",
            default_algorithm="token_bucket",
        )
    try:
        yield made
    finally:
        await made.close()


async def test_a_burst_keeps_state_apart_from_the_plain_rate(limiter: RateLimiter) -> None:
    plain = await admitted(15, lambda: limiter.check_with_info("u", "10/minute"))
    bursting = await admitted(60, lambda: limiter.check_with_info("u", "10/minute", burst=50))
    other = await admitted(30, lambda: limiter.check_with_info("u", "10/minute", burst=20))
    assert (plain, bursting, other) == (10, 50, 20)
    # A burst equal to the limit is the plain policy: the same keys, spent already.
    assert await admitted(5, lambda: limiter.check_with_info("u", "10/minute", burst=10)) == 0
    usage = await limiter.get_usage("u", "10/minute", burst=50)
    assert (usage["limit"], usage["current"], usage["remaining"]) == (50, 50, 0)
    assert usage["policies"][0]["limit"] == 50


async def test_reset_clears_the_burst_state(limiter: RateLimiter) -> None:
    async def spend() -> tuple[int, int]:
        return (
            await admitted(12, lambda: limiter.check_with_info("u", "10/minute")),
            await admitted(60, lambda: limiter.check_with_info("u", "10/minute", burst=50)),
        )

    assert await spend() == (10, 50)
    # The plain rate's reset leaves the burst's keys, by name (rate and scope) or by SCAN.
    assert await limiter.reset("u", rate="10/minute", scope="global") == 1
    assert await limiter.reset("u", rate="10/minute") == 0
    assert await spend() == (10, 0)
    # The burst's reset, by name, then by SCAN.
    assert await limiter.reset("u", rate="10/minute", scope="global", burst=50) == 1
    assert await spend() == (0, 50)
    assert await limiter.reset("u", rate="10/minute", burst=50, algorithm="token_bucket") == 1
    assert await spend() == (0, 50)
    # Everything of the identity.
    assert await limiter.reset("u") == 2
    assert await spend() == (10, 50)


# -- the HTTP integrations ---------------------------------------------------------------------


async def test_the_headers_state_capacity_and_refill() -> None:
    limiter, clock = memory_limiter()
    app = FastAPI()
    install(app, limiter, headers="both")

    @app.get("/fifty")
    @limiter.limit("10/second", burst=50)
    async def fifty() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/ten")
    @limiter.limit("3/second", burst=10)
    async def ten() -> dict[str, str]:
        return {"ok": "yes"}

    async with client(app) as http:
        first = await http.get("/fifty")
        for _ in range(49):
            await http.get("/fifty")
        refused = await http.get("/fifty")
        other = await http.get("/ten")
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit"] == "50"
    assert first.headers["x-ratelimit-remaining"] == "49"
    # Full again 100 ms after this request's charge: reset is a whole second, rounded up.
    assert first.headers["x-ratelimit-reset"] == str(math.ceil((NOW_MS + 100) / 1000))
    assert first.headers["ratelimit-policy"] == '"10-per-1s-burst-50";q=50;w=5'
    # (t counts from the server's own clock, not the test's.)
    assert first.headers["ratelimit"].startswith('"10-per-1s-burst-50";r=49;t=')
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["x-ratelimit-limit"] == "50"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert refused.json() == {"error": "Rate limit exceeded", "retry_after": 1, "limit": 50}
    # A full refill of 10 at 3 per second takes 3.33 s: w rounds it up.
    assert other.headers["ratelimit-policy"] == '"3-per-1s-burst-10";q=10;w=4'
    assert clock.now_ms == NOW_MS


async def test_dependency_middleware_and_install_take_a_burst() -> None:
    limiter, clock = memory_limiter("gcra")
    app = FastAPI()
    install(app, limiter, rate="100/second", burst=30, exempt_paths=["/free"])
    limited = limiter.dependency("10/second", burst=20)

    @app.get("/dep", dependencies=[Depends(limited)])
    async def dep() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/other")
    async def other() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/free", dependencies=[Depends(limited)])
    async def free() -> dict[str, str]:
        return {"ok": "yes"}

    async def statuses(path: str, count: int) -> list[int]:
        return [(await http.get(path)).status_code for _ in range(count)]

    async with client(app) as http:
        # The dependency's burst of 20; the app-wide limit is charged for those admitted.
        assert await statuses("/dep", 25) == [200] * 20 + [429] * 5
        assert await statuses("/other", 12) == [200] * 10 + [429] * 2
        # Half a second refills 50 of the app-wide limit: capped at its burst of 30.
        clock.now_ms += 500
        assert await statuses("/other", 32) == [200] * 30 + [429] * 2
        # Exempt from the app-wide limit, not from the dependency (its own scope here).
        assert await statuses("/free", 22) == [200] * 20 + [429] * 2
    usage = await limiter.get_usage("127.0.0.1", "100/second", burst=30, scope="app")
    assert (usage["limit"], usage["current"]) == (30, 30)


async def test_a_burst_limit_and_a_plain_one_decided_together(limiter: RateLimiter) -> None:
    """Stacked: a burst of one algorithm beside a plain rate of the same algorithm (two
    script calls' worth of layouts, decided atomically as one)."""
    app = FastAPI()
    install(app, limiter)

    @app.get("/stacked")
    @limiter.limit("10/minute", burst=30, algorithm="token_bucket")
    @limiter.limit("25/minute", algorithm="token_bucket")
    async def stacked() -> dict[str, str]:
        return {"ok": "yes"}

    async with client(app) as http:
        statuses = [(await http.get("/stacked")).status_code for _ in range(40)]
    assert statuses == [200] * 25 + [429] * 15
    # Two limits of one algorithm on one route count under scopes suffixed with their rates.
    usage = await limiter.get_usage(
        "127.0.0.1", "10/minute", burst=30, scope="GET:/stacked#10/minute"
    )
    assert (usage["current"], usage["remaining"]) == (25, 5)


async def test_a_message_limit_takes_a_burst() -> None:
    limiter, clock = memory_limiter("leaky_bucket")
    messages = limiter.message_limit("2/second", burst=6)
    app = FastAPI()
    install(app, limiter)

    @app.websocket("/chat")
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            decision = await messages.check(websocket)
            await websocket.send_text(f"{text} {'ok' if decision.allowed else 'dropped'}")

    async with running(app) as port, connect(f"ws://127.0.0.1:{port}/chat") as ws:
        replies = []
        for n in range(8):
            await ws.send(str(n))
            replies.append(await ws.recv())
        clock.now_ms += 1000  # two more
        for n in range(8, 11):
            await ws.send(str(n))
            replies.append(await ws.recv())
    assert replies == [
        *(f"{n} ok" for n in range(6)),
        "6 dropped",
        "7 dropped",
        "8 ok",
        "9 ok",
        "10 dropped",
    ]


# -- the blocking limiter ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", BUCKETS)
def test_the_blocking_limiter_takes_a_burst(redis_url: str, algorithm: str) -> None:
    for url in ("memory://", redis_url):
        limiter = blocking.RateLimiter(url, key_prefix="burst-sync", default_algorithm=algorithm)
        try:
            results = [limiter.check_with_info("u", "10/minute", burst=25) for _ in range(30)]
            assert [result.allowed for result in results] == [True] * 25 + [False] * 5
            assert (results[0].limit, results[0].refill, results[0].remaining) == (25, 10, 24)

            @limiter.limit("10/minute", burst=3, key="f")
            def work() -> str:
                return "done"

            outcomes = []
            for _ in range(5):
                try:
                    outcomes.append(work())
                except Exception as error:  # RateLimitExceeded
                    outcomes.append(type(error).__name__)
            assert outcomes == ["done"] * 3 + ["RateLimitExceeded"] * 2
            usage = limiter.get_usage("u", "10/minute", burst=25)
            assert (usage["limit"], usage["current"]) == (25, 25)
            assert limiter.reset("u", rate="10/minute", burst=25, scope="global") == 1
        finally:
            limiter.close()
