"""The asyncio client joins a loop turn's checks into batched script calls
(moderato/redis/grouping.py): what goes on the wire, what each check gets, and the
failures (a refused part, NOSCRIPT, a lost reply, a timeout), each with the
connection's steps in C and in Python (tests/connection_reference.py); then the
limiter's exact count with batching on: 4 processes x 125 tasks on one key. Every
turn is joined by grouping.group_checks and by its steps in C (csrc/grouping.c),
which must leave the same write buffer, records and slots; the C one's is sent.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from batching_helpers import (
    ARGS,
    EXACT_N_CHECKS,
    Compared,
    calls,
    exact_n_admitted,
    repeats_per_call,
)
from redis_servers import RedisServer
from test_tls import tls_files, tls_only_server  # noqa: F401 (fixtures)

from moderato import RateLimiter
from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisClient, RedisReplyError
from moderato.redis import connector as connector_module
from moderato.redis.errors import RedisClientError
from moderato.scripts import MAX_BATCH_PARTS, MAX_BATCH_POLICIES, batched_script, load_script


@pytest.fixture(autouse=True, params=["c", "python"], ids=["core-c", "core-python"])
def connection_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every client test twice: with the connection's steps in C and in Python."""
    if request.param == "python":
        from connection_reference import ReferenceConnection

        # Where the clients make their connections (redis/connector.py's Connector).
        monkeypatch.setattr(connector_module, "RedisConnection", ReferenceConnection)
    return str(request.param)


@pytest.fixture(autouse=True)
def compared(monkeypatch: pytest.MonkeyPatch) -> Compared:
    """Each turn joined both ways and compared (the C joining's sent)."""
    joinings = Compared()
    monkeypatch.setattr(RedisClient, "_grouping", staticmethod(joinings.for_client))
    return joinings


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[RedisServer]:
    redis_server.command("FLUSHALL")
    redis_server.command("CONFIG", "RESETSTAT")
    yield redis_server


async def loaded(client: RedisClient, *algorithms: str) -> None:
    """The scripts and their batched forms in Redis's cache, the call counts reset."""
    for name in algorithms:
        await client.execute("SCRIPT", "LOAD", load_script(name).source)
        await client.execute("SCRIPT", "LOAD", batched_script(name).source)
    await client.execute("CONFIG", "RESETSTAT")


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_turn_of_checks_is_one_call_per_batch_parts_each_decided_in_order(
    server: RedisServer, algorithm: str
) -> None:
    script = load_script(algorithm)
    client = RedisClient.from_url(server.url, batch_decisions=True)
    plain = RedisClient.from_url(server.url, batch_decisions=False)
    assert ALGORITHMS[algorithm].batch_parts == (
        8 if algorithm == "sliding_log" else MAX_BATCH_PARTS
    )
    # One hot identity's checks: a repeat weighs a quarter of a check, so a call takes one
    # and 60 repeats (the log, whose bound is 8 checks in full: one and 28).
    parts = repeats_per_call(algorithm)
    assert parts == (29 if algorithm == "sliding_log" else 61)
    try:
        await loaded(client, algorithm)
        checks = 70
        replies = await asyncio.gather(
            *(client.evalsha(script, ["hot"], ARGS[algorithm]) for _ in range(checks))
        )
        assert calls(server, "evalsha") == math.ceil(checks / parts)
        # In order, each as alone: the remaining count falls by one a check.
        assert [reply[:3] for reply in replies] == [[1, 0, 99_000 - 1000 * i] for i in range(70)]
        # Without batching, the same turn is a call a check, and continues the count.
        more = await asyncio.gather(
            *(plain.evalsha(script, ["hot"], ARGS[algorithm]) for _ in range(3))
        )
        assert calls(server, "evalsha") == math.ceil(checks / parts) + 3
        assert [reply[2] for reply in more] == [29_000, 28_000, 27_000]
    finally:
        await client.close()
        await plain.close()


@pytest.mark.parametrize("policies", [3, 9, 16])
async def test_a_call_decides_16_policies_at_most(server: RedisServer, policies: int) -> None:
    """Checks of several policies: as many to a call as keep it to 16 policies; a check
    of more than 8 goes alone."""
    script = load_script("fixed_window")
    keys = [f"k{i}" for i in range(policies)]
    args = ["1000", "1"]
    for i in range(policies):
        args += ["100000", str(60 * (i + 1))]
    client = RedisClient.from_url(server.url, batch_decisions=True)
    try:
        await loaded(client, "fixed_window")
        checks = 10
        replies = await asyncio.gather(*(client.evalsha(script, keys, args) for _ in range(checks)))
        per_call = max(1, MAX_BATCH_POLICIES // policies)
        assert calls(server, "evalsha") == math.ceil(checks / per_call)
        # In order, each as alone: the deciding policy's remaining falls by one a check.
        assert [reply[0] for reply in replies] == [1] * checks
        assert [reply[2] for reply in replies] == [99_000 - 1000 * i for i in range(checks)]
    finally:
        await client.close()


async def test_other_commands_and_scripts_split_the_runs_and_keep_their_order(
    server: RedisServer,
) -> None:
    fixed, gcra = load_script("fixed_window"), load_script("gcra")
    client = RedisClient.from_url(server.url, batch_decisions=True)
    try:
        await loaded(client, "fixed_window", "gcra")
        bad = ["x", *ARGS["fixed_window"][1:]]
        futures: list[Any] = [
            client.evalsha(fixed, ["a"], ARGS["fixed_window"]),
            client.evalsha(fixed, ["a"], bad),
            client.evalsha(fixed, ["a"], ARGS["fixed_window"]),
            client.execute("KEYS", "*"),
            client.evalsha(fixed, ["a"], ARGS["fixed_window"]),
            client.evalsha(gcra, ["a"], ARGS["gcra"]),
            client.evalsha(gcra, ["a"], ARGS["gcra"]),
            client.evalsha(fixed, ["a"], ARGS["fixed_window"]),
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        # Runs: [fixed x3] KEYS [fixed] [gcra x2] [fixed]: two batched calls, two alone.
        assert calls(server, "evalsha") == 4
        assert outcomes[0][2] == 99_000
        assert isinstance(outcomes[1], RedisReplyError)
        assert "MODERATO_ARG ARGV[1] (cost_scaled)" in str(outcomes[1])
        assert outcomes[2][2] == 98_000
        assert len(outcomes[3]) == 1  # the counter the first run wrote, and no other
        assert outcomes[4][2] == 97_000
        assert [outcomes[5][2], outcomes[6][2]] == [99_000, 98_000]
        assert outcomes[7][2] == 96_000
    finally:
        await client.close()


async def test_noscript_loads_the_batched_script_once_per_batch(server: RedisServer) -> None:
    script = load_script("token_bucket")
    client = RedisClient.from_url(server.url, batch_decisions=True)
    try:
        await client.connect()
        # The first batched call of the connection: its script loaded just before it.
        warm = await asyncio.gather(
            *(client.evalsha(script, ["warm"], ARGS["token_bucket"]) for _ in range(2))
        )
        assert [reply[2] for reply in warm] == [99_000, 98_000]
        for round_number in range(2):
            assert await client.execute("SCRIPT", "FLUSH") == b"OK"
            assert await client.execute("CONFIG", "RESETSTAT") == b"OK"
            # Two identities alternating (no check repeats the one before): 16 a call.
            keys = [f"k{round_number}:{i % 2}" for i in range(3 * MAX_BATCH_PARTS)]
            replies = await asyncio.gather(
                *(client.evalsha(script, [key], ARGS["token_bucket"]) for key in keys)
            )
            assert [reply[2] for reply in replies] == [99_000 - 1000 * (i // 2) for i in range(48)]
            # 3 batched calls answered NOSCRIPT, one load, the 3 sent again.
            assert calls(server, "evalsha") == 6
            assert calls(server, "script|load") == 1
            assert calls(server, "eval") == 0
    finally:
        await client.close()


@pytest.mark.parametrize("fault", ["late", "killed"])
async def test_a_lost_batch_fails_each_check_and_is_not_sent_again(
    own_redis_server: RedisServer, fault: str
) -> None:
    """A batch answered too late (a paused server) or never (killed once paused):
    each of its checks fails with the connection's error, and nothing is re-sent."""
    script = load_script("fixed_window")
    client = RedisClient.from_url(
        own_redis_server.url,
        command_timeout_s=0.3 if fault == "late" else 5.0,
        batch_decisions=True,
    )
    try:
        await loaded(client, "fixed_window")
        own_redis_server.pause()
        futures = [client.evalsha(script, ["lost"], ARGS["fixed_window"]) for _ in range(20)]
        if fault == "killed":
            await asyncio.sleep(0.05)  # written, unanswered
            assert own_redis_server.process is not None
            os.kill(own_redis_server.process.pid, signal.SIGKILL)  # stopped, then gone
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(outcome, RedisClientError) for outcome in outcomes), outcomes
        # One instance each: no traceback gathers another task's.
        assert len({id(outcome) for outcome in outcomes}) == 20
        if fault == "late":
            assert "did not reply within 0.3 s" in str(outcomes[0])
            own_redis_server.resume()
            # The batches ran late, once each: 20 charged, none twice.
            reply = await client.evalsha(script, ["lost"], ARGS["fixed_window"])
            assert reply[2] == 100_000 - 21_000
    finally:
        own_redis_server.resume()
        await client.close()


def test_four_processes_of_125_tasks_admit_exactly_the_limit(
    server: RedisServer, redis_url: str
) -> None:
    exact_n_admitted(redis_url, "grouped", "100/minute")
    # The checks went batched: far fewer calls than checks (warm-ups a call each).
    assert calls(server, "evalsha") < EXACT_N_CHECKS / 2


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_bursts_over_tls_after_script_flush_admit_exactly_the_limit(
    tls_only_server: RedisServer,  # noqa: F811
    algorithm: str,
) -> None:
    assert tls_only_server.tls is not None
    context = tls_only_server.tls.client_context()
    limiter = RateLimiter(
        tls_only_server.url, key_prefix="tlsbatch", ssl_context=context, command_timeout_s=10
    )
    limiter.backend.client.batch_decisions = True  # type: ignore[attr-defined]
    admin = RedisClient.from_url(tls_only_server.url, ssl_context=context)
    try:
        await admin.execute("FLUSHALL")
        await limiter.check_with_info("warm-up", "100/day", algorithm=algorithm)
        for round_number in range(3):
            assert await admin.execute("SCRIPT", "FLUSH") == b"OK"
            assert await admin.execute("CONFIG", "RESETSTAT") == b"OK"
            outcomes = await asyncio.gather(
                *(
                    limiter.check_with_info(f"k{round_number}", "100/day", algorithm=algorithm)
                    for _ in range(500)
                )
            )
            assert sum(outcome.allowed for outcome in outcomes) == 100
            stats = (await admin.execute("INFO", "commandstats")).decode()
            sent = int(stats.split("cmdstat_evalsha:calls=")[1].split(",")[0])
            parts = ALGORITHMS[algorithm].batch_parts
            assert sent <= 2 * math.ceil(500 / parts) + 2, stats
            assert "cmdstat_eval:" not in stats
            usage = await limiter.get_usage(f"k{round_number}", "100/day", algorithm=algorithm)
            assert usage["remaining"] == 0
    finally:
        await limiter.close()
        await admin.close()
