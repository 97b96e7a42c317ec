"""One script call per loop turn on one server: the asyncio limiter's checks batched.

With ``RedisBackend.batch_checks`` on (experimental, off by default), the checks one
event-loop turn sends to one server leave as one call of the batch
script (lua/batch.lua, joined by moderato/redis/connection.py): exactly the limit
admitted from four processes at once, on every algorithm and over TLS and a unix
socket; a lost batch reply fails every check of it (closed, or open under fail_open)
and is never sent again; a flushed script cache costs one load and one NOSCRIPT per
batch; a lone check is sent as its own script.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster import call, report, script_calls
from redis_servers import RedisServer, TlsFiles, make_tls_files
from shared_quota_worker import run_workers

from moderato import BackendUnavailableError, RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.backends.redis import RedisBackend
from moderato.redis.connection import BATCH_MAX_PARTS
from moderato.scripts import batch_script

PROCESSES = 4
TASKS = 125
LIMIT = 300


@pytest.fixture(autouse=True)
def batching(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RedisBackend, "batch_checks", True)


def burst_from_processes(url: str, prefix: str) -> dict[str, int]:
    """4 asyncio processes x 125 tasks, one check each on one key, every algorithm."""
    algorithms = list(ALGORITHMS)
    environment = {
        "SHARED_QUOTA_WORKERS": str(TASKS),
        "SHARED_QUOTA_CHECKS_EACH": "1",
        # Exactness is the test, not the machine's speed under load.
        "SHARED_QUOTA_TIMEOUT_S": "10",
        "SHARED_QUOTA_BATCH_CHECKS": "1",
    }
    reports = run_workers(
        ["async"] * PROCESSES, url, prefix, f"{LIMIT}/day", algorithms, environment
    )
    return {name: sum(report[name] for report in reports) for name in algorithms}


def test_four_processes_of_125_tasks_admit_exactly_the_limit(own_redis_server: RedisServer) -> None:
    port = own_redis_server.port
    assert call(port, "CONFIG", "RESETSTAT") == b"OK"
    totals = burst_from_processes(own_redis_server.url, "exact")
    calls, noscript = script_calls(port)["evalsha"]
    checks = PROCESSES * TASKS * len(ALGORITHMS)
    report(f"{checks} checks from {PROCESSES} processes: {calls} script calls, admitted {totals}")
    assert totals == dict.fromkeys(ALGORITHMS, LIMIT)
    # Batched: far fewer calls than checks (each process's 125 tasks check in one turn;
    # the warm-up checks are lone calls).
    # (NOSCRIPT: the first batches of each process, before the batch script is loaded.)
    assert calls - noscript <= PROCESSES * len(ALGORITHMS) * (2 + -(-TASKS // BATCH_MAX_PARTS) * 2)


def test_over_tls_exactly_the_limit(tmp_path: Path) -> None:
    tls: TlsFiles = make_tls_files(tmp_path)
    server = RedisServer(tls=tls).start()
    try:
        url = f"{server.url}?ssl_ca_certs={tls.ca_file}"
        totals = burst_from_processes(url, "tls")
    finally:
        server.close()
    assert totals == dict.fromkeys(ALGORITHMS, LIMIT)


async def test_over_a_unix_socket_exactly_the_limit(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    server = RedisServer(extra_args=("--unixsocket", str(socket_path))).start()
    try:
        # 500 checks at once in one process: exactness is checked, not the 0.5 s
        # default command timeout a loaded machine (or Python 3.9) can outlast.
        async with RateLimiter(
            f"unix://{socket_path}", key_prefix="unix", command_timeout_s=10.0
        ) as limiter:
            for algorithm in ALGORITHMS:
                results = await asyncio.gather(
                    *(
                        limiter.check_with_info("hot", f"{LIMIT}/day", algorithm=algorithm)
                        for _ in range(PROCESSES * TASKS)
                    )
                )
                assert sum(result.allowed for result in results) == LIMIT, algorithm
                assert [r.remaining for r in results[:3]] == [LIMIT - 1, LIMIT - 2, LIMIT - 3]
    finally:
        server.close()


async def test_a_lone_check_is_its_own_script_call(own_redis_server: RedisServer) -> None:
    port = own_redis_server.port
    async with RateLimiter(own_redis_server.url, key_prefix="lone") as limiter:
        await limiter.check("warm-up", "5/minute")  # loads the script
        assert call(port, "CONFIG", "RESETSTAT") == b"OK"
        for remaining in (4, 3, 2):
            assert (await limiter.check_with_info("k", "5/minute")).remaining == remaining
        # Three calls of fixed_window's own script: the batch script was never needed.
        assert script_calls(port)["evalsha"] == (3, 0)
        assert call(port, "SCRIPT", "EXISTS", batch_script().sha) == [0]


@pytest.mark.parametrize("fail_open", [False, True])
async def test_a_lost_batch_reply_fails_every_check_and_is_never_sent_again(
    own_redis_server: RedisServer, fail_open: bool
) -> None:
    """The server is stopped with batches in flight: every check of them times out (fail
    closed: BackendUnavailableError; fail_open: bypassed). Resumed before the connection
    is given up, Redis runs each batch once -- the 20 charges stand -- and nothing is
    sent again."""
    port = own_redis_server.port
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="lost",
        fail_open=fail_open,
        command_timeout_s=0.3,
        connections_per_loop=1,
        breaker_failures=50,  # the usage read after the outage must reach Redis
    )
    try:
        # Both scripts loaded: the lone call's own, and the batch's.
        await limiter.check("warm-up", "5/minute")
        await asyncio.gather(*(limiter.check("warm-up", "5/minute") for _ in range(2)))
        assert call(port, "CONFIG", "RESETSTAT") == b"OK"
        own_redis_server.pause()
        try:
            outcomes = await asyncio.gather(
                *(limiter.check_with_info("k", "100/minute") for _ in range(20)),
                return_exceptions=True,
            )
        finally:
            own_redis_server.resume()
        if fail_open:
            assert all(not isinstance(o, BaseException) and o.bypassed for o in outcomes)
        else:
            assert all(isinstance(o, BackendUnavailableError) for o in outcomes), outcomes
        await asyncio.sleep(0.1)  # the late reply arrives and is dropped
        batches = -(-20 // BATCH_MAX_PARTS)
        assert script_calls(port)["evalsha"] == (batches, 0)  # each batch run once
        usage = await limiter.get_usage("k", "100/minute")
        assert (usage["current"], usage["remaining"]) == (20, 80)
        # The usage read: nothing re-sent.
        assert script_calls(port)["evalsha"] == (batches + 1, 0)
    finally:
        await limiter.close()


async def test_a_flushed_script_cache_costs_one_load_and_one_noscript_per_batch(
    own_redis_server: RedisServer,
) -> None:
    """SCRIPT FLUSH between bursts of 4,000 checks: each burst's 500 batches
    (BATCH_MAX_PARTS = 8 checks each, one loop turn) are answered NOSCRIPT once
    each, sent again behind one SCRIPT LOAD of the batch script, and decide
    exactly as a warm cache does."""
    port = own_redis_server.port
    checks = 4000
    batches = checks // BATCH_MAX_PARTS
    async with RateLimiter(
        own_redis_server.url, key_prefix="flushed", command_timeout_s=10.0
    ) as limiter:
        for round_number, algorithm in enumerate(ALGORITHMS):
            assert call(port, "SCRIPT", "FLUSH") == b"OK"
            assert call(port, "CONFIG", "RESETSTAT") == b"OK"
            outcomes = await asyncio.gather(
                *(
                    limiter.check_with_info("hot", "3000/day", algorithm=algorithm)
                    for _ in range(checks)
                ),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            assert errors == [], errors[:3]
            assert sum(o.allowed for o in outcomes if not isinstance(o, BaseException)) == 3000
            assert script_calls(port) == {
                "evalsha": (2 * batches, batches),
                "eval": (0, 0),
                "script|load": (1, 0),
            }, (round_number, algorithm)
