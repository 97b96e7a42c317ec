"""Closing a recorded limiter ends its dashboard publisher (moderato/dashboard/fleet.py).

On a real redis-server, for the blocking limiter (a daemon thread) and the asyncio one
(a task): close() sends the last publication, the current second's checks included,
and then the thread is joined (the task awaited) within the bound; from then on not
one command reaches Redis and no connection is opened again, however long the process
goes on. A check after close() reopens the limiter, and the first check of a later
second starts its publisher again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from moderato import RateLimiter
from moderato.dashboard import OUTCOMES
from moderato.dashboard.app import attach
from moderato.dashboard.fleet import STOP_WAIT_S, FleetKeys, Publisher, ThreadPublisher
from moderato.sync import RateLimiter as SyncRateLimiter

PREFIX = "closing"
CLIENT_NAME = "moderato-closing-test"
RATE, LIMIT = "3/minute", 3
INTERVAL_S = 0.05
"""The publishers publish 20 times a second here: a publication after close() would
have 20 chances a second to show."""
QUIET_S = 0.5
"""How long Redis is watched after close(): ten publishers' intervals."""
PUBLISHER = "moderato-dashboard-publisher"


@pytest.fixture
def inspector(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def series_totals(inspector: redis.Redis) -> dict[str, int]:
    """The fleet's series summed by outcome: every decision every publication sent."""
    totals = dict.fromkeys(OUTCOMES, 0)
    for key in inspector.scan_iter(f"{FleetKeys(PREFIX).base}:series:*"):
        for field, count in inspector.hgetall(key).items():
            totals[OUTCOMES[int(field.partition(":")[2])]] += int(count)
    return totals


def redis_state(inspector: redis.Redis) -> tuple[Any, ...]:
    """What a publication would change: the dashboard's keys and their contents, the
    scripts Redis ran, and the limiter's connections (by its client name)."""
    dashboard_keys = sorted(inspector.scan_iter(f"{FleetKeys(PREFIX).base}:*"))
    contents = [
        (
            key,
            inspector.zrange(key, 0, -1) if key.endswith(":processes") else inspector.hgetall(key),
        )
        for key in dashboard_keys
    ]
    stats = inspector.info("commandstats")
    evalsha_calls = stats.get("cmdstat_evalsha", {}).get("calls", 0)
    connections = [c for c in inspector.client_list() if c["name"] == CLIENT_NAME]
    return contents, evalsha_calls, len(connections)


def state_once_closed(inspector: redis.Redis) -> tuple[Any, ...]:
    """``redis_state`` once the server has seen the limiter's connections go (the asyncio
    client's transports close on the loop's next turn, not within ``close()``)."""
    deadline_s = time.monotonic() + 2.0
    state = redis_state(inspector)
    while state[2] and time.monotonic() < deadline_s:
        time.sleep(0.01)
        state = redis_state(inspector)
    assert state[2] == 0
    return state


async def state_once_closed_on_loop(inspector: redis.Redis) -> tuple[Any, ...]:
    """``state_once_closed`` letting the loop turn meanwhile (its transports close then)."""
    for _ in range(200):
        if redis_state(inspector)[2] == 0:
            break
        await asyncio.sleep(0.01)
    return state_once_closed(inspector)


@pytest.fixture
def publisher_threads() -> Callable[[], list[threading.Thread]]:
    """The publisher threads started since the test began (another module's recorded
    limiters, left open, may still publish in this process)."""
    earlier = set(threading.enumerate())

    def started() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == PUBLISHER and t not in earlier]

    return started


def recorded_blocking(url: str, **options: Any) -> tuple[SyncRateLimiter, ThreadPublisher]:
    limiter = SyncRateLimiter(url, key_prefix=PREFIX, **options)
    _, publisher = attach(limiter)
    assert isinstance(publisher, ThreadPublisher)
    publisher.interval_s = INTERVAL_S
    return limiter, publisher


def recorded_asyncio(url: str) -> tuple[RateLimiter, Publisher]:
    limiter = RateLimiter(url, key_prefix=PREFIX, client_name=CLIENT_NAME)
    _, publisher = attach(limiter)
    assert isinstance(publisher, Publisher)
    publisher.interval_s = INTERVAL_S
    return limiter, publisher


def nothing_more_reaches_redis(inspector: redis.Redis) -> None:
    """Once the limiter's connections are gone, nothing changes for ``QUIET_S``."""
    closed = state_once_closed(inspector)
    time.sleep(QUIET_S)
    assert redis_state(inspector) == closed


async def nothing_more_reaches_redis_from_the_loop(inspector: redis.Redis) -> None:
    """``nothing_more_reaches_redis``, the loop turning meanwhile."""
    closed = await state_once_closed_on_loop(inspector)
    await asyncio.sleep(QUIET_S)
    assert redis_state(inspector) == closed


def test_closing_the_blocking_limiter_joins_its_publisher_after_a_last_publication(
    redis_url: str,
    inspector: redis.Redis,
    publisher_threads: Callable[[], list[threading.Thread]],
) -> None:
    limiter, publisher = recorded_blocking(redis_url, client_name=CLIENT_NAME)
    for _ in range(5):
        limiter.check_with_info("a", RATE, scope="api")
    assert len(publisher_threads()) == 1
    deadline_s = time.monotonic() + 5.0
    while publisher.publications < 2 and time.monotonic() < deadline_s:
        time.sleep(INTERVAL_S)
    assert publisher.publications >= 2
    # Checked just before close(): only the last publication can carry these two.
    for _ in range(2):
        limiter.check_with_info("b", RATE, scope="api")

    started_s = time.monotonic()
    limiter.close()
    assert time.monotonic() - started_s < STOP_WAIT_S
    assert publisher_threads() == []
    totals = series_totals(inspector)
    assert (totals["allowed"], totals["denied"]) == (LIMIT + 2, 2)
    publications = publisher.publications
    nothing_more_reaches_redis(inspector)
    assert publisher.publications == publications
    assert publisher_threads() == []


def test_a_blocking_limiter_used_after_close_publishes_again_until_closed_again(
    redis_url: str,
    inspector: redis.Redis,
    publisher_threads: Callable[[], list[threading.Thread]],
) -> None:
    limiter = recorded_blocking(redis_url, client_name=CLIENT_NAME)[0]
    limiter.check_with_info("a", RATE, scope="api")
    limiter.close()
    assert publisher_threads() == []
    # The next check reconnects; the first check of a later second starts the publisher.
    checks = 0
    deadline_s = time.monotonic() + 3.0
    while not publisher_threads() and time.monotonic() < deadline_s:
        limiter.check_with_info("b", "1000/minute", scope="api")
        checks += 1
        time.sleep(INTERVAL_S)
    assert len(publisher_threads()) == 1
    limiter.close()
    assert publisher_threads() == []
    totals = series_totals(inspector)
    assert (totals["allowed"], totals["denied"]) == (1 + checks, 0)
    nothing_more_reaches_redis(inspector)


def test_closing_a_blocking_limiter_whose_redis_hangs_returns_within_the_bound(
    own_redis_server: Any, publisher_threads: Callable[[], list[threading.Thread]]
) -> None:
    limiter = recorded_blocking(own_redis_server.url, command_timeout_s=0.2)[0]
    limiter.check_with_info("a", RATE, scope="api")
    assert len(publisher_threads()) == 1
    own_redis_server.pause()
    try:
        started_s = time.monotonic()
        limiter.close()
        assert time.monotonic() - started_s < STOP_WAIT_S
    finally:
        own_redis_server.resume()
    # The publication under way times out (0.2 s); none follows it.
    deadline_s = time.monotonic() + 2.0
    while publisher_threads() and time.monotonic() < deadline_s:
        time.sleep(INTERVAL_S)
    assert publisher_threads() == []


def test_a_publication_that_outlives_the_bound_is_the_blocking_publishers_last(
    own_redis_server: Any, publisher_threads: Callable[[], list[threading.Thread]]
) -> None:
    limiter = recorded_blocking(
        own_redis_server.url, client_name=CLIENT_NAME, command_timeout_s=10
    )[0]
    limiter.check_with_info("a", RATE, scope="api")
    assert len(publisher_threads()) == 1
    own_redis_server.pause()  # the next publication waits for its reply
    try:
        started_s = time.monotonic()
        limiter.close()
        waited_s = time.monotonic() - started_s
    finally:
        own_redis_server.resume()
    assert STOP_WAIT_S <= waited_s < STOP_WAIT_S + 1.0
    # Answered once Redis resumes, that publication is the thread's last: it ends, and
    # neither publishes again nor leaves a connection open.
    deadline_s = time.monotonic() + 5.0
    while publisher_threads() and time.monotonic() < deadline_s:
        time.sleep(INTERVAL_S)
    assert publisher_threads() == []
    inspector = redis.Redis.from_url(own_redis_server.url, decode_responses=True)
    try:
        nothing_more_reaches_redis(inspector)
    finally:
        inspector.close()


def publisher_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == PUBLISHER]


async def test_closing_the_asyncio_limiter_awaits_its_publisher_after_a_last_publication(
    redis_url: str, inspector: redis.Redis
) -> None:
    limiter, publisher = recorded_asyncio(redis_url)
    for _ in range(5):
        await limiter.check_with_info("a", RATE, scope="api")
    tasks = publisher_tasks()
    assert len(tasks) == 1
    deadline_s = time.monotonic() + 5.0
    while publisher.publications < 2 and time.monotonic() < deadline_s:
        await asyncio.sleep(INTERVAL_S)
    assert publisher.publications >= 2
    for _ in range(2):
        await limiter.check_with_info("b", RATE, scope="api")

    started_s = time.monotonic()
    await limiter.close()
    assert time.monotonic() - started_s < STOP_WAIT_S
    assert tasks[0].done() and not tasks[0].cancelled()
    assert publisher_tasks() == []
    totals = series_totals(inspector)
    assert (totals["allowed"], totals["denied"]) == (LIMIT + 2, 2)
    publications = publisher.publications
    await nothing_more_reaches_redis_from_the_loop(inspector)
    assert publisher.publications == publications
    assert publisher_tasks() == []


async def test_an_asyncio_limiter_used_after_close_publishes_again_until_closed_again(
    redis_url: str, inspector: redis.Redis
) -> None:
    limiter = recorded_asyncio(redis_url)[0]
    async with limiter:
        await limiter.check_with_info("a", RATE, scope="api")
        await limiter.close()
        assert publisher_tasks() == []
        checks = 0
        deadline_s = time.monotonic() + 3.0
        while not publisher_tasks() and time.monotonic() < deadline_s:
            await limiter.check_with_info("b", "1000/minute", scope="api")
            checks += 1
            await asyncio.sleep(INTERVAL_S)
        assert len(publisher_tasks()) == 1
    assert publisher_tasks() == []
    totals = series_totals(inspector)
    assert (totals["allowed"], totals["denied"]) == (1 + checks, 0)
    await nothing_more_reaches_redis_from_the_loop(inspector)
