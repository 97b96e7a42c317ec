"""The blocking RateLimiter under faults, from 32 threads: Redis killed, restarted, paused;
and fork(). Every thread's every check ends, within its time limits, in a decision or a
BackendError; the same limiter decides again once Redis is back; nothing hangs."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
from fork_helpers import in_child
from redis_servers import RedisServer

from moderato import BackendError
from moderato.redis.blocking import RedisClient
from moderato.sync import RateLimiter

THREADS = 32
RATE = "1000000/hour"
COMMAND_TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.5


@dataclass
class Record:
    """What one thread saw: (start, took, outcome) per check."""

    checks: list[tuple[float, float, str]] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)


def load(limiter: RateLimiter, record: Record, stop: threading.Event, identity: str) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            outcome = "allowed" if limiter.check_with_info(identity, RATE).allowed else "denied"
        except BackendError:
            outcome = "error"
        except BaseException as error:  # anything else is a bug the test reports
            record.unexpected.append(error)
            outcome = "unexpected"
        record.checks.append((started, time.monotonic() - started, outcome))
        if outcome == "error":
            time.sleep(0.01)


def run_threads(
    limiter: RateLimiter,
) -> tuple[list[Record], threading.Event, list[threading.Thread]]:
    records = [Record() for _ in range(THREADS)]
    stop = threading.Event()
    threads = [
        threading.Thread(target=load, args=(limiter, record, stop, f"id{n % 4}"), daemon=True)
        for n, record in enumerate(records)
    ]
    for thread in threads:
        thread.start()
    return records, stop, threads


def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_killing_redis_under_32_threads_fails_closed_in_time_and_checks_resume(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="kill",
        command_timeout_s=COMMAND_TIMEOUT_S,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        breaker_cooldown_s=0.2,
    )
    records, stop, threads = run_threads(limiter)
    until(lambda: all(r.checks for r in records), 10, "every thread decided once")
    killed_at = time.monotonic()
    own_redis_server.stop()  # SIGKILL under load
    until(
        lambda: all(any(s >= killed_at and o == "error" for s, _, o in r.checks) for r in records),
        10,
        "every thread got BackendError",
    )
    time.sleep(0.5)
    restarted_at = time.monotonic()
    own_redis_server.start()  # the same port, an empty server
    until(
        lambda: all(
            any(s >= restarted_at and o == "allowed" for s, _, o in r.checks) for r in records
        ),
        15,
        "every thread decided again, with the same limiter",
    )
    stop.set()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"

    assert [r.unexpected for r in records] == [[]] * THREADS
    outcomes = Counter(o for r in records for _, _, o in r.checks)
    slowest = max(took for r in records for _, took, _ in r.checks)
    failed = [
        (s, took) for r in records for s, took, o in r.checks if o == "error" and s >= killed_at
    ]
    first_back = min(
        s for r in records for s, _, o in r.checks if o == "allowed" and s >= restarted_at
    )
    print(
        f"\nkill under {THREADS} threads: {outcomes['allowed']} decided, {outcomes['error']} "
        f"BackendError; slowest check {slowest * 1000:.0f} ms (command timeout "
        f"{COMMAND_TIMEOUT_S * 1000:.0f} ms); slowest failure "
        f"{max(took for _, took in failed) * 1000:.0f} ms; first decision "
        f"{(first_back - restarted_at) * 1000:.0f} ms after the restart"
    )
    # Killed: dropped connections and refused connects fail at once, well within
    # the command timeout; no check, in any phase, took longer than it.
    assert max(took for _, took in failed) < COMMAND_TIMEOUT_S
    assert slowest < COMMAND_TIMEOUT_S
    # Fail closed: between the kill and the restart nothing was admitted.
    assert not any(
        o != "error"
        for r in records
        for s, took, o in r.checks
        if killed_at + 0.1 < s < restarted_at
    )
    limiter.close()


def test_a_paused_redis_fails_every_thread_within_its_timeouts(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="pause",
        command_timeout_s=COMMAND_TIMEOUT_S,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        max_connections=8,  # 32 threads share 8 connections: most wait for one
        breaker_failures=1_000_000,  # every check reaches the paused server
    )
    records, stop, threads = run_threads(limiter)
    until(lambda: all(r.checks for r in records), 10, "every thread decided once")
    own_redis_server.pause()
    paused_at = time.monotonic()
    try:
        until(
            lambda: all(
                any(s >= paused_at and o == "error" for s, _, o in r.checks) for r in records
            ),
            10,
            "every thread got BackendError",
        )
    finally:
        own_redis_server.resume()
    stop.set()
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert [r.unexpected for r in records] == [[]] * THREADS
    slowest = max(took for r in records for _, took, _ in r.checks)
    print(f"\npause under {THREADS} threads, 8 connections: slowest check {slowest * 1000:.0f} ms")
    # A command: its timeout. A thread waiting for a connection: that wait (a
    # command timeout at most), then a connect (the paused server never greets).
    assert slowest < COMMAND_TIMEOUT_S + CONNECT_TIMEOUT_S + 0.5
    limiter.close()


def test_a_paused_redis_fails_a_check_within_the_command_timeout_and_the_next_counts_right(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(
        own_redis_server.url, key_prefix="pause-one", command_timeout_s=0.3, max_connections=1
    )
    assert limiter.check_with_info("one", "100/hour").remaining == 99
    own_redis_server.pause()
    try:
        begun = time.monotonic()
        with pytest.raises(BackendError):
            limiter.check_with_info("one", "100/hour")
        took = time.monotonic() - begun
    finally:
        own_redis_server.resume()
    assert 0.25 <= took < 1.0, took  # the command timeout bounds it (a loaded host: margin)
    # The timed-out check was written, so the resumed server may have charged it;
    # the next check reads its own reply: one more charge than whatever ran.
    after = limiter.check_with_info("one", "100/hour")
    assert after.allowed and after.remaining in (98, 97)
    usage = limiter.get_usage("one", "100/hour")
    assert usage["remaining"] == after.remaining
    limiter.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_a_limiter_made_before_fork_reconnects_in_the_child_and_both_decide_exactly(
    redis_server: RedisServer, redis_url: str
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="fork")
    assert [limiter.check_with_info("shared", "10/hour").remaining for _ in range(3)] == [9, 8, 7]
    client = limiter.backend.client  # type: ignore[attr-defined]
    assert isinstance(client, RedisClient)
    parent_id = client.execute("CLIENT", "ID")

    def child() -> list[Any]:
        assert client.open_connections == 0  # the parent's were let go, untouched
        child_id = client.execute("CLIENT", "ID")
        remaining = [limiter.check_with_info("shared", "10/hour").remaining for _ in range(4)]
        limiter.close()
        return [child_id, *remaining]

    child_id, *child_remaining = in_child(child)
    assert child_id != parent_id
    assert child_remaining == [6, 5, 4, 3]
    # The parent goes on with the connection it had, in step, on the same quota.
    assert client.execute("CLIENT", "ID") == parent_id
    assert [limiter.check_with_info("shared", "10/hour").remaining for _ in range(3)] == [2, 1, 0]
    assert not limiter.check_with_info("shared", "10/hour").allowed
    limiter.close()
