"""moderato/dashboard/fleet.py on real servers: each process's one publication a second,
merged by any dashboard, on a single Redis, a Redis Cluster and through Sentinel; memory://
shows its own process and says so."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import blocking_dashboard_worker as blocking
import httpx
import pytest
import redis.asyncio
from cluster import RedisCluster
from redis_servers import RedisServer, SentinelDeployment
from uvicorn_helpers import TESTS_DIR as TESTS
from uvicorn_helpers import running

from moderato import RateLimiter, _accel
from moderato.dashboard import OUTCOMES, Dashboard, record
from moderato.dashboard.app import attach
from moderato.dashboard.fleet import (
    PROCESS_TTL_S,
    PUBLISH_SCRIPT,
    FleetKeys,
    ThreadPublisher,
    read_fleet,
    remote_client,
)
from moderato.dashboard.health import redis_info
from moderato.dashboard.snapshot import merge
from moderato.dashboard.view import TOP_SHOWN
from moderato.scripts import load_script
from moderato.sync import RateLimiter as SyncRateLimiter


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelDeployment]:
    servers = SentinelDeployment(service="dashboard")
    try:
        servers.wait_until_watched()
        yield servers
    finally:
        servers.close()


async def two_processes_decide_and_publish(url: Any, prefix: str) -> None:
    """Two limiters stand for two processes (each has its own recorder and process id)."""
    first = RateLimiter(url, key_prefix=prefix)
    second = RateLimiter(url, key_prefix=prefix)
    first_recorder, first_publisher = attach(first)
    second_recorder, second_publisher = attach(second)
    assert first_publisher is not None and second_publisher is not None
    assert first_recorder.process_id != second_recorder.process_id
    for _ in range(7):
        await first.check_with_info("flood", "5/minute", scope="api")
    for identity in ("a", "b", "c"):
        await second.check_with_info(identity, "5/minute", scope="api")
    await second.check_with_info("flood", "5/minute", scope="api")  # shared quota: denied
    for publisher in (first_publisher, second_publisher):
        publisher.stop()
        assert await publisher.publish_once()

    reading = await read_fleet(remote_client(first), FleetKeys(prefix), time.time(), 900)
    assert len(reading.processes) == 2
    totals = [sum(column) for column in zip(*reading.series.values())]
    assert totals == [8, 3, 0, 0, 0, 0]  # allowed, denied: every decision of both
    merged = merge(reading.processes)
    assert merged.limits == {("5/minute", "fixed_window", "api", None): [8, 3, 0, 0, 0, 0]}
    assert merged.top[0] == ("flood", 3)
    assert sum(merged.latency.values()) == 11
    for limiter in (first, second):
        await limiter.close()


async def test_the_fleet_on_one_redis(redis_url: str) -> None:
    await two_processes_decide_and_publish(redis_url, "fleet-single")


async def test_a_publication_cancelled_in_flight_is_not_sent_again(redis_url: str) -> None:
    """stop() cancels the publishing task, possibly while its call is queued or on the
    wire: Redis takes that call, so the next publication must not carry its counts too
    (once seen in CI: 9 allowed published where 8 were decided)."""
    prefix = "fleet-cancelled"
    limiter = RateLimiter(redis_url, key_prefix=prefix)
    _, publisher = attach(limiter)
    assert publisher is not None
    await limiter.connect()
    assert await publisher.publish_once()  # the script loaded, the connection up
    for _ in range(4):
        await limiter.check_with_info("flood", "5/minute", scope="api")
    publisher.stop()
    in_flight = asyncio.ensure_future(publisher.publish_once())
    await asyncio.sleep(0)  # the call is queued on the connection
    in_flight.cancel()
    with pytest.raises(asyncio.CancelledError):
        await in_flight
    for _ in range(3):
        await limiter.check_with_info("flood", "5/minute", scope="api")
    assert await publisher.publish_once()
    publisher.stop()

    reading = await read_fleet(remote_client(limiter), FleetKeys(prefix), time.time(), 900)
    totals = [sum(column) for column in zip(*reading.series.values())]
    assert totals == [5, 2, 0, 0, 0, 0]  # every decision once
    await limiter.close()


async def test_the_fleet_through_an_applications_redis_py_client(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)  # replies as redis-py decodes them
    try:
        await two_processes_decide_and_publish(client, "fleet-redis-py")
        info = await redis_info(remote_client(RateLimiter(client, key_prefix="fleet-redis-py")))
        # redis-py parses INFO itself: the same fields come out of its dict.
        assert {"redis_version", "used_memory_human", "instantaneous_ops_per_sec"} <= set(info[0])
    finally:
        await client.aclose()


async def test_the_fleet_on_a_redis_cluster(cluster: RedisCluster) -> None:
    await two_processes_decide_and_publish(cluster.url, "fleet-cluster")
    # Every key of the dashboard shares one hash tag: one call, one node.
    keys = FleetKeys("fleet-cluster")
    slots = {_accel.key_slot(key) for key in (keys.index, keys.process("x"), keys.series(1))}
    assert len(slots) == 1


async def test_the_fleet_through_sentinel(sentinel: SentinelDeployment) -> None:
    await two_processes_decide_and_publish(sentinel.url, "fleet-sentinel")


async def test_memory_backend_publishes_nothing_and_has_no_client() -> None:
    limiter = RateLimiter("memory://", key_prefix="fleet-memory")
    recorder, publisher = attach(limiter)
    assert publisher is None and remote_client(limiter) is None
    assert limiter.recorder is recorder
    assert attach(limiter) == (recorder, publisher)  # one recorder per limiter


async def monitor(port: int, lines: list[bytes]) -> None:
    """Collect what MONITOR shows: every command the server runs, who sent it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"MONITOR\r\n")
    try:
        assert await reader.readline() == b"+OK\r\n"
        while True:
            lines.append(await reader.readline())
    finally:
        writer.close()


_SENT = re.compile(rb'^\+[\d.]+ \[\d+ (lua|[\d.]+:\d+)\] "([A-Za-z|]+)"(?: "([0-9a-f]{40})")?')


async def test_a_process_publishes_once_a_second_and_drops_out_when_it_stops(
    own_redis_server: RedisServer,
) -> None:
    limiter = RateLimiter(own_redis_server.url, key_prefix="fleet-rate")
    recorder, publisher = attach(limiter)
    assert publisher is not None
    lines: list[bytes] = []
    watching = asyncio.create_task(monitor(own_redis_server.port, lines))
    await asyncio.sleep(0.2)
    started_s = time.monotonic()
    await limiter.check_with_info("x", "100/second")  # starts the publisher
    for _ in range(300):  # busy for a few seconds: publishing stays at one call a second
        await limiter.check_with_info("x", "100/second")
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.2)
    elapsed_s = time.monotonic() - started_s
    publisher.stop()
    await asyncio.sleep(0.2)
    watching.cancel()
    sent: Counter[tuple[bytes, bytes]] = Counter()
    for line in lines:
        match = _SENT.match(line)
        assert match is not None, line
        if match.group(1) != b"lua":  # what a client sent, not what a script called
            sent[match.group(2).upper(), match.group(3) or b""] += 1
    check_sha = load_script("fixed_window").sha.encode()
    publish_sha = PUBLISH_SCRIPT.sha.encode()
    # The first call of each script is answered NOSCRIPT, loaded, and sent again; the
    # connections' greeting is one PING each (two connections, one idle: one greeting).
    pings = sent.pop((b"PING", b""), 0)
    assert 1 <= pings <= limiter.connections_per_loop
    assert sent == {
        (b"EVALSHA", check_sha): 301 + 1,
        (b"EVALSHA", publish_sha): publisher.publications + 1,
        (b"SCRIPT", b""): 2,
    }
    assert 1 <= publisher.publications <= elapsed_s + 1
    keys = FleetKeys("fleet-rate")
    client = remote_client(limiter)
    reading = await read_fleet(client, keys, time.time(), 0)
    assert [view.meta["id"] for view in reading.processes] == [recorder.process_id]
    await asyncio.sleep(PROCESS_TTL_S + 0.5)  # stopped: its hash expires, it drops out
    assert (await read_fleet(client, keys, time.time(), 0)).processes == []
    await limiter.close()


# -- a blocking process in the fleet ----------------------------------------------------


async def test_a_blocking_process_of_16_threads_is_listed_with_exact_totals(
    redis_url: str,
) -> None:
    """A process checking with moderato.sync in 16 threads, recorded and published from
    its daemon thread (tests/blocking_dashboard_worker.py); a dashboard served by uvicorn
    here, on the same Redis and prefix, lists it with every decision counted."""
    prefix = "fleet-blocking"
    worker = subprocess.Popen(
        [sys.executable, str(TESTS / "blocking_dashboard_worker.py"), redis_url, prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )
    try:
        assert worker.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, worker.stdout.readline)
        word, process_id = line.split()
        assert word == "done"
        own_denied = blocking.CHECKS_PER_THREAD - blocking.OWN_LIMIT
        shared_denied = blocking.SHARED_CHECKS - blocking.SHARED_LIMIT
        allowed = blocking.THREADS * blocking.OWN_LIMIT + blocking.SHARED_LIMIT
        denied = blocking.THREADS * own_denied + shared_denied

        limiter = RateLimiter(redis_url, key_prefix=prefix)
        async with running(Dashboard(limiter, allow_anonymous=True)) as port:
            client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}")
            deadline_s = time.monotonic() + 10
            while True:  # its next publication (once a second) carries the last checks
                summary = (await client.get("/api/summary")).json()
                listed = {p["id"]: p for p in summary["processes"]["list"]}
                if listed.get(process_id, {}).get("decisions") == allowed + denied:
                    break
                assert time.monotonic() < deadline_s, summary["processes"]
                await asyncio.sleep(0.2)
            await client.aclose()
        await limiter.close()
    finally:
        if worker.stdin is not None:
            worker.stdin.close()
        worker.wait(timeout=10)

    assert worker.returncode == 0
    # This process (the dashboard's, no checks) and the blocking one.
    assert summary["processes"]["count"] == 2
    assert listed[process_id]["pid"] == worker.pid
    # The fleet's series: every decision of the blocking process, by outcome.
    assert summary["totals"] == {**dict.fromkeys(OUTCOMES, 0), "allowed": allowed, "denied": denied}
    rows = {(row["rate"], row["scope"]): row["counts"] for row in summary["limits"]}
    assert rows == {
        (blocking.OWN_RATE, "own"): {
            **dict.fromkeys(OUTCOMES, 0),
            "allowed": blocking.THREADS * blocking.OWN_LIMIT,
            "denied": blocking.THREADS * own_denied,
        },
        (blocking.SHARED_RATE, "shared"): {
            **dict.fromkeys(OUTCOMES, 0),
            "allowed": blocking.SHARED_LIMIT,
            "denied": shared_denied,
        },
    }
    top = [(row["identity"], row["denials"]) for row in summary["top_identities"]["rows"]]
    assert top[0] == ("shared", shared_denied)
    threads = {f"t{thread}" for thread in range(blocking.THREADS)}
    assert len(top) == min(TOP_SHOWN, 1 + blocking.THREADS)
    assert all(identity in threads and count == own_denied for identity, count in top[1:])


def test_a_blocking_limiter_publishes_from_a_daemon_thread_from_its_first_check(
    redis_url: str, redis_server: RedisServer
) -> None:
    limiter = SyncRateLimiter(redis_url, key_prefix="fleet-thread")
    recorder = record(limiter)
    assert record(limiter) is recorder and limiter.recorder is recorder
    _, publisher = attach(limiter)
    assert isinstance(publisher, ThreadPublisher)

    def publishing() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "moderato-dashboard-publisher"]

    assert publishing() == []  # nothing runs until a check
    for identity in ("a", "b", "a"):
        limiter.check_with_info(identity, "2/minute")
    limiter.check_with_info("a", "2/minute")  # denied
    (thread,) = publishing()
    assert thread.daemon
    deadline_s = time.monotonic() + 5
    while publisher.publications < 2:
        assert time.monotonic() < deadline_s
        time.sleep(0.05)
    publisher.stop()
    assert publishing() == []
    keys = FleetKeys("fleet-thread")
    index = redis_server.command("ZRANGE", keys.index, "0", "-1")
    assert recorder.process_id.encode() in index
    assert recorder.all_totals() == [3, 1, 0, 0, 0, 0]
    limiter.close()
