"""RedisClient and RedisConnection against real redis-server processes.

Every test is bounded in time: timeouts are set short, waits are polled with a
deadline, and no test should take more than a few seconds.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import re
import shutil
import ssl
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from redis_servers import RedisServer, free_port, make_tls_files
from skips import skip_without_tls

from moderato.redis import BACKOFF_CAP_S, RedisClient, RedisConnection, parse_url
from moderato.redis import connector as connector_module
from moderato.redis._encoding import encode_evalsha
from moderato.redis.connection import CommandNotSentError
from moderato.redis.errors import RedisClientError, RedisReplyError

# -- helpers -------------------------------------------------------------------


@pytest.fixture(autouse=True, params=["c", "python"], ids=["core-c", "core-python"])
def connection_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: with RedisConnection's per-command steps in C
    (csrc/connection_core.c), and with the Python steps they replaced
    (tests/connection_reference.py), which must behave the same."""
    if request.param == "python":
        from connection_reference import ReferenceConnection

        # Where the clients make their connections (redis/connector.py's Connector).
        monkeypatch.setattr(connector_module, "RedisConnection", ReferenceConnection)
    return str(request.param)


@dataclass(frozen=True)
class Script:
    sha: str
    source: bytes


def make_script(source: bytes) -> Script:
    return Script(sha=hashlib.sha1(source).hexdigest(), source=source)


# Returns ARGV[1] * 2 after counting the call in KEYS[1]: distinct per call, so a
# reply delivered to the wrong caller shows.
DOUBLE = make_script(b"redis.call('INCR', KEYS[1]) return tonumber(ARGV[1]) * 2")


def only_connection(client: RedisClient) -> RedisConnection:
    connections = client.connections()
    assert len(connections) == 1
    return connections[0]


def record_writes(connection: RedisConnection, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Wrap the connection's transport.write; returns the list each write is appended to."""
    transport = connection.transport
    assert transport is not None
    writes: list[bytes] = []
    original = transport.write

    def write(data: Any) -> None:
        writes.append(bytes(data))
        original(data)

    monkeypatch.setattr(transport, "write", write)
    return writes


async def until_ok(call: Callable[[], Awaitable[Any]], within_s: float) -> tuple[Any, float]:
    """Retry ``call`` on RedisClientError until it succeeds; returns (result, seconds taken)."""
    started = time.monotonic()
    while True:
        try:
            return await call(), time.monotonic() - started
        except RedisClientError:
            if time.monotonic() - started > within_s:
                raise
            await asyncio.sleep(0.01)


@pytest.fixture
async def client(redis_url: str) -> Any:
    client = RedisClient.from_url(redis_url)
    yield client
    await client.close()


# -- round trips -----------------------------------------------------------------


async def test_the_connections_made_have_the_core_under_test(
    client: RedisClient, connection_core: str
) -> None:
    """The fixture's Python steps reach the connections the client makes (a patch of a
    name the client no longer reads would test the C steps twice)."""
    await client.execute("PING")
    made = [
        slot.connection
        for pool in client._pools.values()
        for slot in pool.slots
        if slot.connection is not None
    ]
    assert made
    from connection_reference import ReferenceConnection

    expected = ReferenceConnection if connection_core == "python" else RedisConnection
    assert {type(connection) for connection in made} == {expected}


async def test_round_trips(client: RedisClient) -> None:
    assert await client.execute("PING") == b"PONG"
    assert await client.execute("SET", "k", b"v\r\n\x00v") == b"OK"
    assert await client.execute("GET", "k") == b"v\r\n\x00v"
    assert await client.execute("GET", "missing") is None
    assert await client.execute("INCRBY", "n", 2**40) == 2**40
    assert await client.execute("RPUSH", "l", "a", b"b", 3) == 3
    assert await client.execute("LRANGE", "l", 0, -1) == [b"a", b"b", b"3"]
    assert await client.execute("SET", "k2", "é") == b"OK"
    assert await client.execute("GET", "k2") == "é".encode()
    big = bytes(range(256)) * 8192  # 2 MiB: many reads into the 64 KiB buffer
    assert await client.execute("SET", "big", big) == b"OK"
    assert await client.execute("GET", "big") == big


async def test_error_reply_raises_redis_reply_error(client: RedisClient) -> None:
    await client.execute("SET", "s", "text")
    with pytest.raises(RedisReplyError) as caught:
        await client.execute("INCR", "s")
    assert caught.value.message == "ERR value is not an integer or out of range"
    assert isinstance(caught.value, RedisClientError)
    assert await client.execute("PING") == b"PONG"  # the stream is still in step


async def test_bad_argument_type_is_a_type_error(client: RedisClient) -> None:
    with pytest.raises(TypeError):
        await client.execute("SET", "k", 1.5)  # type: ignore[arg-type]
    assert await client.execute("PING") == b"PONG"


async def test_execute_many(client: RedisClient) -> None:
    replies = await client.execute_many([("SET", "a", 1), ("INCR", "a"), ("GET", "a")])
    assert replies == [b"OK", 2, b"2"]
    assert await client.execute_many([]) == []
    with pytest.raises(RedisReplyError, match="ERR value is not an integer"):
        await client.execute_many([("SET", "t", "x"), ("INCR", "t"), ("GET", "t")])
    mixed = await client.execute_many([("INCR", "t"), ("GET", "t")], raise_on_error=False)
    assert isinstance(mixed[0], RedisReplyError)
    assert mixed[1] == b"x"


# -- auto-pipelining -------------------------------------------------------------


async def test_commands_of_one_loop_turn_leave_in_one_write(
    client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.connect()
    writes = record_writes(only_connection(client), monkeypatch)

    replies = await asyncio.gather(*(client.execute("INCR", "turn") for _ in range(200)))

    assert replies == list(range(1, 201))
    assert len(writes) == 1
    assert writes[0].count(b"INCR") == 200


async def test_a_check_queued_unencoded_goes_out_as_its_evalsha(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send_script(None, ...) (what the asyncio fast check sends a connection that joins
    its turns): the turn's flush encodes each check it did not join, so the write is
    byte for byte the encoded turn's, a lone check's included, in its own turn; a
    connection that does not join encodes it when queued."""
    client = RedisClient.from_url(redis_url, batch_decisions=True)
    try:
        await client.execute("SCRIPT", "LOAD", DOUBLE.source)
        connection = only_connection(client)
        writes = record_writes(connection, monkeypatch)
        calls = [(["late-a"], [1]), (["late-b"], ("2",)), (["late-a"], [b"3"])]
        futures = [connection.send_script(None, DOUBLE, keys, args) for keys, args in calls]
        futures.append(connection.send_script(None, DOUBLE, ["late-c"], [10**15]))
        assert connection._write_buffer[-4:] == [None] * 4  # not encoded yet
        assert await asyncio.gather(*futures) == [2, 4, 6, 2 * 10**15]
        expected = [encode_evalsha(DOUBLE.sha, keys, args) for keys, args in calls]
        expected.append(encode_evalsha(DOUBLE.sha, ["late-c"], [10**15]))
        assert writes == [b"".join(expected)]
        assert await connection.send_script(None, DOUBLE, ["late-d"], [4]) == 8
        assert writes[1:] == [encode_evalsha(DOUBLE.sha, ["late-d"], [4])]
        # Its _group unset before the flush: what was queued unencoded is still encoded.
        future = connection.send_script(None, DOUBLE, ["late-f"], [6])
        connection._group = None
        assert await future == 12
        assert writes[2:] == [encode_evalsha(DOUBLE.sha, ["late-f"], [6])]
    finally:
        await client.close()
    client = RedisClient.from_url(redis_url)
    try:
        await client.execute("PING")
        connection = only_connection(client)
        future = connection.send_script(None, DOUBLE, ["late-e"], [5])
        assert connection._write_buffer[-1] == encode_evalsha(DOUBLE.sha, ["late-e"], [5])
        assert await future == 10
    finally:
        await client.close()


async def test_a_commands_future_is_of_its_connections_loop(
    client: RedisClient, connection_core: str
) -> None:
    """A command's future is the connection loop's: made as asyncio.Future() when that
    loop runs the send (csrc/connection_core.c), else with the loop named, as for a
    _future_type other than asyncio's own (which the Python reference does not read)."""
    await client.execute("SCRIPT", "LOAD", DOUBLE.source)
    connection = only_connection(client)
    future = connection.send_script(None, DOUBLE, ["loop-a"], [1])
    assert type(future) is asyncio.Future and future.get_loop() is asyncio.get_running_loop()
    assert await future == 2
    if connection_core == "python":
        return

    class OwnFuture(asyncio.Future):  # type: ignore[type-arg]
        pass

    connection._future_type = OwnFuture
    future = connection.send_script(None, DOUBLE, ["loop-b"], [2])
    assert type(future) is OwnFuture and future.get_loop() is asyncio.get_running_loop()
    assert await future == 4


async def test_each_loop_turn_gets_its_own_write(
    client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.connect()
    writes = record_writes(only_connection(client), monkeypatch)

    for expected in (1, 2, 3):
        assert await client.execute("INCR", "seq") == expected
    first = asyncio.gather(*(client.execute("INCR", "a") for _ in range(5)))
    await asyncio.sleep(0)  # the five are queued; the next batch is a later turn
    second = asyncio.gather(*(client.execute("INCR", "b") for _ in range(7)))
    assert await first == [1, 2, 3, 4, 5]
    assert await second == [1, 2, 3, 4, 5, 6, 7]

    assert len(writes) == 5
    assert [w.count(b"INCR") for w in writes] == [1, 1, 1, 5, 7]


async def test_1000_concurrent_commands_get_their_own_replies(redis_url: str) -> None:
    # Order is checked here, not the timeout: a loaded machine may hold 1,000
    # replies past the default 0.5 s.
    client = RedisClient.from_url(redis_url, command_timeout_s=10)
    try:
        await _each_reply_its_own(client)
    finally:
        await client.close()


async def _each_reply_its_own(client: RedisClient) -> None:
    replies = await asyncio.gather(*(client.execute("ECHO", f"reply-{i}") for i in range(1000)))
    assert replies == [f"reply-{i}".encode() for i in range(1000)]
    counts = await asyncio.gather(*(client.execute("INCR", "ordered") for _ in range(1000)))
    assert counts == list(range(1, 1001))


async def test_commands_issued_while_connecting_wait_for_the_handshake(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url + "/2?client_name=early")
    try:
        # All issued before the connection exists: they must run after SELECT 2.
        replies = await asyncio.gather(
            client.execute("SET", "early", 1), client.execute("CLIENT", "GETNAME")
        )
        assert list(replies) == [b"OK", b"early"]
        other = RedisClient.from_url(redis_url)
        assert await other.execute("EXISTS", "early") == 0
        await other.close()
    finally:
        await client.close()


# -- cancellation and timeouts -----------------------------------------------------


async def test_cancelled_caller_keeps_the_stream_in_step(client: RedisClient) -> None:
    await client.connect()
    # BLPOP holds the connection for 0.2 s; its reply arrives after the cancel.
    blocked = asyncio.ensure_future(client.execute("BLPOP", "empty-list", "0.2"))
    await asyncio.sleep(0.05)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked

    followers = await asyncio.gather(
        client.execute("ECHO", "after-1"), client.execute("INCR", "c"), client.execute("PING")
    )
    assert list(followers) == [b"after-1", 1, b"PONG"]
    assert only_connection(client).pending_count == 0


async def test_cancelling_every_other_caller_of_a_batch(client: RedisClient) -> None:
    await client.connect()
    tasks = [asyncio.ensure_future(client.execute("ECHO", str(i))) for i in range(100)]
    await asyncio.sleep(0)  # every task has queued its command
    for task in tasks[::2]:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for i, outcome in enumerate(outcomes):
        if i % 2 == 0:
            assert isinstance(outcome, asyncio.CancelledError)
        else:
            assert outcome == str(i).encode()
    assert await client.execute("ECHO", "next") == b"next"


async def test_timed_out_caller_keeps_the_stream_in_step(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url, command_timeout_s=0.25)
    try:
        await client.connect()
        started = time.monotonic()
        with pytest.raises(RedisClientError, match=r"did not reply within 0\.25 s"):
            await client.execute("BLPOP", "empty-list", "0.4")
        # Raised before the BLPOP's own 0.4 s end, which a loaded machine may come near.
        assert 0.24 <= time.monotonic() - started < 0.39
        # Queued behind the BLPOP on the same connection; answered when it ends (the upper
        # bound only tells that from a hang: a loaded machine answers late).
        assert await client.execute("ECHO", "behind") == b"behind"
        assert 0.38 <= time.monotonic() - started < 0.9
        assert await client.execute("INCR", "t") == 1
    finally:
        await client.close()


async def test_timeout_on_a_paused_server_then_recovery(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=0.3)
    try:
        await client.connect()
        own_redis_server.pause()
        started = time.monotonic()
        results = await asyncio.gather(
            *(client.execute("INCR", "p") for _ in range(10)), return_exceptions=True
        )
        elapsed = time.monotonic() - started
        assert 0.29 <= elapsed < 0.3 + 0.2  # the deadline, plus a loaded machine's lateness
        assert all(isinstance(r, RedisClientError) for r in results)
        assert "did not reply within 0.3 s" in str(results[0])

        own_redis_server.resume()
        # Same connection: the ten INCRs ran late (their replies were dropped).
        assert await client.execute("INCR", "p") == 11
    finally:
        own_redis_server.resume()
        await client.close()


async def test_each_batch_times_out_on_its_own_deadline(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=0.3)
    try:
        await client.connect()
        connection = only_connection(client)
        own_redis_server.pause()
        started = time.monotonic()
        failed_after: dict[int, float] = {}
        pending_at_failure: dict[int, int] = {}

        async def call(batch: int) -> None:
            with pytest.raises(RedisClientError, match=r"did not reply within 0\.3 s"):
                await client.execute("PING")
            failed_after[batch] = time.monotonic() - started
            pending_at_failure[batch] = connection.pending_count

        tasks = []
        for batch in range(3):  # issued at 0, 0.1 and 0.2 s
            tasks += [asyncio.ensure_future(call(batch)) for _ in range(5)]
            await asyncio.sleep(0.1)
        await asyncio.gather(*tasks)
        for batch in range(3):
            assert 0.1 * batch + 0.29 <= failed_after[batch] < 0.1 * batch + 0.3 + 0.1
        # Failed callers keep their slots: the late replies must still find them.
        assert pending_at_failure[0] == 15
    finally:
        own_redis_server.resume()
        await client.close()


async def test_long_pause_drops_the_connection_then_reconnects(
    own_redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=0.2)
    try:
        await client.connect()
        first = only_connection(client)
        own_redis_server.pause()
        with pytest.raises(RedisClientError, match=r"did not reply within 0\.2 s"):
            await client.execute("PING")
        # Unanswered for 2 x the timeout: presumed dead and dropped.
        await asyncio.sleep(0.25)
        assert not first.usable
        assert first.error is not None
        assert "sent no reply for 0.4 s; connection dropped" in str(first.error)
        own_redis_server.resume()
        reply, _ = await until_ok(lambda: client.execute("PING"), within_s=1.0)
        assert reply == b"PONG"
        assert only_connection(client) is not first
    finally:
        own_redis_server.resume()
        await client.close()


async def test_no_command_outlives_its_timeout_on_a_hung_server(
    own_redis_server: RedisServer,
) -> None:
    # Timeout, then the stall drop, then a reconnect to the still-paused server
    # (the kernel accepts it): every call must still end within its own timeout.
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=0.2)
    try:
        await client.connect()
        own_redis_server.pause()
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(RedisClientError):
                await client.execute("PING")
            assert time.monotonic() - started < 0.2 + 0.1
    finally:
        own_redis_server.resume()
        await client.close()


async def test_commands_time_out_while_connecting_and_the_connect_goes_on(
    own_redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(
        own_redis_server.url, command_timeout_s=0.2, connect_timeout_s=2.0
    )
    own_redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(RedisClientError, match=r"was still connecting after 0\.2 s"):
            await client.execute("INCR", "queued")
        assert 0.19 <= time.monotonic() - started < 0.3
        connecting = client.connections()
        assert len(connecting) == 1
        own_redis_server.resume()
        # The same connection completes its handshake and serves the next call;
        # the timed-out INCR was still sent (its caller had given up, not Redis).
        assert await client.execute("INCR", "queued") == 2
        assert client.connections() == connecting
    finally:
        own_redis_server.resume()
        await client.close()


@pytest.mark.parametrize("query", ["", "?client_name=t"])
async def test_connect_timeout_on_a_paused_server(
    own_redis_server: RedisServer, query: str
) -> None:
    # The kernel still accepts TCP connections for a SIGSTOPped server; the
    # handshake (PING, or CLIENT SETNAME) is what goes unanswered.
    client = RedisClient.from_url(
        own_redis_server.url + query, connect_timeout_s=0.3, command_timeout_s=0.2
    )
    own_redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(RedisClientError, match=r"no answer within 0\.3 s \(connect timeout\)"):
            await client.connect()
        assert 0.29 <= time.monotonic() - started < 0.4
    finally:
        own_redis_server.resume()
        await client.close()


# -- losing the server -----------------------------------------------------------------


async def test_killed_server_fails_pending_calls_then_client_recovers(
    own_redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=2.0)
    try:
        await client.connect()
        pending = [asyncio.ensure_future(client.execute("BLPOP", "q", "1.5")) for _ in range(3)]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        own_redis_server.stop()
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        assert time.monotonic() - started < 0.5
        for outcome in outcomes:
            assert isinstance(outcome, RedisClientError)
            assert str(outcome).startswith(f"connection to {own_redis_server.url} lost: ")

        with pytest.raises(RedisClientError, match="cannot connect to"):
            await client.execute("PING")

        own_redis_server.start()
        reply, waited_s = await until_ok(lambda: client.execute("PING"), within_s=1.0)
        assert reply == b"PONG"
        assert waited_s < 1.0
    finally:
        await client.close()


async def test_backoff_fails_fast_and_says_when_it_retries(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url)
    own_redis_server.stop()
    try:
        with pytest.raises(RedisClientError, match=r"Connect call failed|Connection refused"):
            await client.execute("PING")
        started = time.monotonic()
        with pytest.raises(RedisClientError) as caught:
            await client.execute("PING")
        assert time.monotonic() - started < 0.01
        message = str(caught.value)
        assert message.startswith(f"cannot connect to {own_redis_server.url}")
        assert "; not retrying yet: next connect attempt in " in message

        # Each failed attempt doubles the delay (25 ms first), up to the cap.
        delays_ms = []
        for _ in range(7):
            with pytest.raises(RedisClientError) as caught:
                await client.execute("PING")
            delay_ms = int(str(caught.value).rsplit("next connect attempt in ", 1)[1].split()[0])
            delays_ms.append(delay_ms)
            await asyncio.sleep(delay_ms / 1000 + 0.005)
            with pytest.raises(RedisClientError, match="cannot connect"):
                await client.execute("PING")  # the attempt, refused
        expected_ms = [25, 50, 100, 200, 400, 500, 500]
        for delay_ms, expected in zip(delays_ms, expected_ms):
            assert expected - 15 <= delay_ms <= expected, delays_ms
        assert BACKOFF_CAP_S == 0.5

        # connect() tries regardless of the backoff.
        own_redis_server.start()
        await client.connect()
        assert await client.execute("PING") == b"PONG"
    finally:
        await client.close()


async def test_errors_surface_when_awaited_not_when_called(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url)
    own_redis_server.stop()
    first = client.execute("PING")  # starts connecting; does not raise
    with pytest.raises(RedisClientError, match="cannot connect"):
        await first
    during_backoff = client.evalsha(DOUBLE, ["k"], [1])  # does not raise either
    with pytest.raises(RedisClientError, match="next connect attempt in"):
        await during_backoff
    with pytest.raises(TypeError):
        client.execute("SET", "k", None)  # type: ignore[arg-type]
    await client.close()


async def test_connect_raises_when_nothing_listens() -> None:
    client = RedisClient.from_url(f"redis://127.0.0.1:{free_port()}")
    with pytest.raises(RedisClientError, match=r"cannot connect to redis://127\.0\.0\.1:"):
        await client.connect()
    await client.close()


async def test_close_fails_pending_and_client_stays_usable(client: RedisClient) -> None:
    await client.connect()
    blocked = asyncio.ensure_future(client.execute("BLPOP", "never", "1"))
    await asyncio.sleep(0.02)
    await client.close()
    with pytest.raises(RedisClientError, match="closed by the client"):
        await blocked
    assert client.connections() == []
    assert await client.execute("PING") == b"PONG"


# -- scripts -------------------------------------------------------------------------------


async def test_evalsha_loads_the_script_once(client: RedisClient) -> None:
    await client.execute("SCRIPT", "FLUSH")  # the other core's run of this test loaded it
    await client.execute("DEL", "calls")
    assert await client.execute("SCRIPT", "EXISTS", DOUBLE.sha) == [0]
    assert await client.evalsha(DOUBLE, ["calls"], [21]) == 42
    assert await client.execute("SCRIPT", "EXISTS", DOUBLE.sha) == [1]
    assert await client.evalsha(DOUBLE, ("calls",), (5,)) == 10
    assert await client.execute("GET", "calls") == b"2"


async def test_evalsha_error_reply_is_raised(client: RedisClient) -> None:
    failing = make_script(b"return redis.error_reply('MODERATO_ARG bad cost')")
    with pytest.raises(RedisReplyError) as caught:
        await client.evalsha(failing, [], [])
    assert caught.value.message == "MODERATO_ARG bad cost"


async def test_noscript_recovery_after_script_flush_with_a_batch_in_flight(
    client: RedisClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await client.evalsha(DOUBLE, ["calls"], [1]) == 2
    await client.execute("SCRIPT", "FLUSH")
    writes = record_writes(only_connection(client), monkeypatch)

    replies = await asyncio.gather(*(client.evalsha(DOUBLE, ["calls"], [i]) for i in range(50)))

    assert replies == [2 * i for i in range(50)]
    assert writes[0].count(b"EVALSHA") == 50  # one batch, all answered NOSCRIPT
    # Then one SCRIPT LOAD, and each call once more behind it, by its SHA1.
    repair = b"".join(writes[1:])
    assert repair.count(b"SCRIPT") == 1 and repair.count(DOUBLE.source) == 1
    assert repair.index(b"LOAD") < repair.index(b"EVALSHA")
    assert repair.count(b"EVALSHA") == 50 and b"EVAL\r\n" not in repair
    assert await client.execute("GET", "calls") == b"51"  # each ran exactly once
    assert await client.execute("SCRIPT", "EXISTS", DOUBLE.sha) == [1]


async def test_noscript_recovery_with_other_commands_in_the_batch(client: RedisClient) -> None:
    await client.connect()
    await client.execute("SCRIPT", "FLUSH")
    calls: list[asyncio.Future[Any]] = []
    for i in range(30):
        calls.append(client.execute("ECHO", f"plain-{i}"))
        calls.append(client.evalsha(DOUBLE, ["calls"], [i]))
        # Sent by hand, so an error reply the client must not try to repair.
        calls.append(client.execute("EVALSHA", "0" * 40, 0))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for i in range(30):
        plain, script, by_hand = outcomes[3 * i : 3 * i + 3]
        assert plain == f"plain-{i}".encode()
        assert script == 2 * i
        assert isinstance(by_hand, RedisReplyError)
        assert by_hand.message.startswith("NOSCRIPT")
    assert await client.execute("GET", "calls") == b"30"


async def test_noscript_recovery_for_commands_queued_while_connecting(redis_url: str) -> None:
    # The handshake (SELECT, CLIENT SETNAME) goes first on the wire, ahead of
    # commands queued before the connection existed; NOSCRIPT must still find
    # the right EVALSHA to repair.
    client = RedisClient.from_url(redis_url + "/4?client_name=queued")
    try:
        calls = [client.evalsha(DOUBLE, ["calls"], [i]) for i in range(10)]
        calls.append(client.execute("CLIENT", "GETNAME"))
        replies = await asyncio.gather(*calls)
        assert replies == [2 * i for i in range(10)] + [b"queued"]
        assert await client.execute("GET", "calls") == b"10"
    finally:
        await client.close()


async def test_noscript_for_a_cancelled_caller_is_not_repaired(client: RedisClient) -> None:
    await client.connect()
    await client.execute("SCRIPT", "FLUSH")
    abandoned = client.evalsha(DOUBLE, ["calls"], [1])
    abandoned.cancel()
    assert await client.evalsha(DOUBLE, ["calls"], [2]) == 4
    assert await client.execute("GET", "calls") == b"1"  # only the second one ran


async def test_noscript_recovery_after_a_restart(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url)
    try:
        assert await client.evalsha(DOUBLE, ["calls"], [3]) == 6
        own_redis_server.restart()  # a fresh process: empty script cache, no data
        reply, _ = await until_ok(lambda: client.evalsha(DOUBLE, ["calls"], [4]), within_s=1.0)
        assert reply == 8
        replies = await asyncio.gather(*(client.evalsha(DOUBLE, ["calls"], [i]) for i in range(20)))
        assert replies == [2 * i for i in range(20)]
        assert await client.execute("GET", "calls") == b"21"
    finally:
        await client.close()


# -- several loops and threads ----------------------------------------------------------


def test_two_threads_with_their_own_loops_share_one_client(redis_server: RedisServer) -> None:
    redis_server.command("DEL", "threads")
    client = RedisClient.from_url(redis_server.url)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    async def work(name: str) -> None:
        await client.connect()
        barrier.wait(timeout=5)  # both loops are connected and running at once
        replies = await asyncio.gather(*(client.execute("ECHO", f"{name}-{i}") for i in range(300)))
        assert replies == [f"{name}-{i}".encode() for i in range(300)]
        for _ in range(100):
            await client.execute("INCR", "threads")

    def run(name: str) -> None:
        try:
            asyncio.run(work(name))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(f"t{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == []
    assert redis_server.command("GET", "threads") == b"$3\r\n200\r\n"

    # The two loops are closed now: the next loop to register sweeps them out.
    async def after() -> int:
        assert await client.execute("PING") == b"PONG"
        count = len(client._pools)
        await client.close()
        return count

    assert asyncio.run(after()) == 1


async def test_per_test_loops_do_not_accumulate(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url)

    def use_in_a_fresh_loop() -> None:
        async def ping() -> None:
            assert await client.execute("PING") == b"PONG"

        asyncio.run(ping())  # leaves its connection behind, like a finished test

    for _ in range(5):
        await asyncio.to_thread(use_in_a_fresh_loop)
    assert await client.execute("PING") == b"PONG"
    assert list(client._pools) == [asyncio.get_running_loop()]
    await client.close()


def test_loop_shutdown_closes_its_connections(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url, client_name="closed-at-shutdown")
    used: list[RedisConnection] = []

    async def use() -> None:
        assert await client.execute("PING") == b"PONG"
        used.append(only_connection(client))

    asyncio.run(use())  # closes the loop's async generators, then the loop

    assert client._pools == {}
    assert not used[0].usable
    assert used[0].transport is None
    deadline = time.monotonic() + 2
    while b"name=closed-at-shutdown " in redis_server.command("CLIENT", "LIST"):
        assert time.monotonic() < deadline, "the server still sees the connection"
        time.sleep(0.01)


def test_one_thread_running_loops_one_after_another(redis_server: RedisServer) -> None:
    # pytest-asyncio's per-test loops: same thread, a new loop each time.
    client = RedisClient.from_url(redis_server.url)
    used: list[RedisConnection] = []

    async def use() -> None:
        for _ in range(3):
            assert await client.execute("PING") == b"PONG"
        used.append(only_connection(client))

    for _ in range(3):
        asyncio.run(use())
    assert len({id(connection) for connection in used}) == 3
    assert not any(connection.usable for connection in used)
    assert client._pools == {}


def test_loop_closed_without_shutdown_is_swept(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url)

    async def ping() -> Any:
        return await client.execute("PING")

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(ping()) == b"PONG"
    finally:
        loop.close()  # no shutdown_asyncgens: the client cannot tell
    assert list(client._pools) == [loop]

    async def ping_and_count() -> int:
        assert await client.execute("PING") == b"PONG"
        return len(client._pools)

    with warnings.catch_warnings():
        # Dropping a transport whose loop is gone makes asyncio warn "unclosed transport".
        warnings.simplefilter("ignore", ResourceWarning)
        assert asyncio.run(ping_and_count()) == 1  # the closed loop was swept out
        gc.collect()
    assert client._pools == {}


async def test_one_loop_turn_s_commands_share_one_connection(redis_url: str) -> None:
    # One write and one read for the whole batch, not one per connection.
    client = RedisClient.from_url(redis_url, connections_per_loop=3)
    try:
        replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(90)))
        assert replies == [str(i).encode() for i in range(90)]
        assert len(client.connections()) == 1
    finally:
        await client.close()


async def test_successive_batches_spread_over_every_connection(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url, connections_per_loop=3, client_name="rr")
    try:
        batches = []
        for turn in range(3):
            # No reply can be read before the loop next polls: each new turn's
            # batch finds the earlier connections busy and takes the next one.
            batches.append([client.execute("ECHO", f"{turn}:{i}") for i in range(30)])
            await asyncio.sleep(0)
        for turn, batch in enumerate(batches):
            assert await asyncio.gather(*batch) == [f"{turn}:{i}".encode() for i in range(30)]
        assert len(client.connections()) == 3
        clients = await client.execute("CLIENT", "LIST")
        assert clients.count(b"name=rr ") == 3
    finally:
        await client.close()


async def test_a_sequential_caller_stays_on_one_connection(redis_url: str) -> None:
    # Fewest in flight, the first on a tie: waiting for each reply, nothing is
    # ever in flight, so the second connection is never even opened.
    client = RedisClient.from_url(redis_url, connections_per_loop=2)
    try:
        ids = {await client.execute("CLIENT", "ID") for _ in range(20)}
        assert len(ids) == 1
        assert len(client.connections()) == 1
    finally:
        await client.close()


async def test_a_slot_in_backoff_is_passed_over(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url, connections_per_loop=2)
    try:
        assert await client.execute("PING") == b"PONG"  # opens the first connection only
        # No further client is admitted: the second slot's connect is refused.
        await client.execute("CONFIG", "SET", "maxclients", "1")
        in_flight = client.execute("PING")
        await asyncio.sleep(0)  # written, its reply not read: the next turn opens the second
        first, second = await asyncio.gather(
            in_flight, client.execute("PING"), return_exceptions=True
        )
        assert first == b"PONG"
        assert isinstance(second, RedisClientError)  # Redis refuses it and hangs up
        # While the second slot waits out its backoff, every command takes the first.
        for _ in range(5):
            replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(10)))
            assert replies == [str(i).encode() for i in range(10)]
        assert len(client.connections()) == 1
    finally:
        await client.execute("CONFIG", "SET", "maxclients", "10000")
        await client.close()


# -- handshake: AUTH, SELECT, CLIENT SETNAME ---------------------------------------------


async def test_password_auth(own_redis_server: RedisServer) -> None:
    own_redis_server.command("CONFIG", "SET", "requirepass", "s3cret")
    port = own_redis_server.port

    good = RedisClient.from_url(f"redis://:s3cret@127.0.0.1:{port}/1?client_name=authed")
    assert await good.execute("SET", "k", "v") == b"OK"
    assert await good.execute("CLIENT", "GETNAME") == b"authed"
    await good.close()

    no_password = RedisClient.from_url(f"redis://127.0.0.1:{port}")
    with pytest.raises(RedisClientError, match="PING was refused: NOAUTH Authentication required"):
        await no_password.connect()
    await no_password.close()

    wrong = RedisClient.from_url(f"redis://:wrong-password@127.0.0.1:{port}")
    with pytest.raises(RedisClientError) as caught:
        await wrong.execute("GET", "k")
    message = str(caught.value)
    assert message.startswith(f"redis://:***@127.0.0.1:{port}: AUTH was refused: WRONGPASS")
    assert "wrong-password" not in message
    await wrong.close()


async def test_acl_user_auth(own_redis_server: RedisServer) -> None:
    own_redis_server.command("ACL", "SETUSER", "alice", "on", ">wonder", "~*", "+@all")
    client = RedisClient.from_url(f"redis://alice:wonder@127.0.0.1:{own_redis_server.port}")
    assert await client.execute("ACL", "WHOAMI") == b"alice"
    await client.close()


async def test_db_selection(redis_url: str) -> None:
    in_db_3 = RedisClient.from_url(redis_url + "/3")
    in_db_5 = RedisClient.from_url(redis_url + "?db=5")
    in_db_0 = RedisClient.from_url(redis_url)
    try:
        await in_db_3.execute("SET", "where", "three")
        await in_db_5.execute("SET", "where", "five")
        assert await in_db_3.execute("GET", "where") == b"three"
        assert await in_db_5.execute("GET", "where") == b"five"
        assert await in_db_0.execute("GET", "where") is None
    finally:
        for c in (in_db_3, in_db_5, in_db_0):
            await c.close()


async def test_failed_select_never_runs_commands_elsewhere(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url + "/99")  # the server has 16 databases
    with pytest.raises(
        RedisClientError, match=r"SELECT 99 was refused: ERR DB index is out of range"
    ):
        await client.execute("SET", "stray", 1)
    await client.close()
    check = RedisClient.from_url(redis_url)
    assert await check.execute("EXISTS", "stray") == 0
    await check.close()


async def test_unix_socket(redis_server: RedisServer) -> None:
    directory = Path(tempfile.mkdtemp(prefix="moderato-sock-"))
    socket_path = directory / "redis.sock"
    server = RedisServer(extra_args=("--unixsocket", str(socket_path), "--unixsocketperm", "700"))
    server.start()
    try:
        client = RedisClient.from_url(f"unix://{socket_path}?db=2&client_name=via-unix")
        assert await client.execute("PING") == b"PONG"
        assert await client.execute("CLIENT", "GETNAME") == b"via-unix"
        await client.execute("SET", "u", 1)
        assert await client.evalsha(DOUBLE, ["n"], [4]) == 8
        info = await client.execute("CLIENT", "INFO")
        assert b"db=2" in info
        await client.close()
    finally:
        server.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- TLS -----------------------------------------------------------------------------------


@dataclass
class TlsServer:
    server: RedisServer
    tls_port: int
    ca_file: Path


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    """A redis-server with a TLS port, its certificate signed by a throwaway CA."""
    directory = Path(tempfile.mkdtemp(prefix="moderato-tls-"))
    try:
        files = make_tls_files(directory)
    except RuntimeError as error:  # no openssl
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(str(error))
    tls_port = free_port()
    server = RedisServer(extra_args=("--tls-port", str(tls_port), *files.server_args()))
    skip_without_tls(server.start)
    try:
        yield TlsServer(server=server, tls_port=tls_port, ca_file=files.ca_file)
    finally:
        server.close()
        shutil.rmtree(directory, ignore_errors=True)


async def test_rediss_with_a_trusted_ca(tls_server: TlsServer) -> None:
    context = ssl.create_default_context(cafile=str(tls_server.ca_file))
    client = RedisClient.from_url(
        f"rediss://localhost:{tls_server.tls_port}/1?client_name=tls", ssl_context=context
    )
    try:
        assert await client.execute("PING") == b"PONG"
        assert await client.execute("CLIENT", "GETNAME") == b"tls"
        replies = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(500)))
        assert replies == [str(i).encode() for i in range(500)]
        assert await client.evalsha(DOUBLE, ["n"], [7]) == 14
    finally:
        await client.close()


async def test_rediss_verifies_the_certificate_by_default(tls_server: TlsServer) -> None:
    client = RedisClient.from_url(f"rediss://localhost:{tls_server.tls_port}")
    with pytest.raises(RedisClientError, match="CERTIFICATE_VERIFY_FAILED"):
        await client.execute("PING")
    await client.close()


async def test_rediss_checks_the_host_name(tls_server: TlsServer) -> None:
    context = ssl.create_default_context(cafile=str(tls_server.ca_file))
    # The certificate names localhost and 127.0.0.1, not 127.0.0.2.
    client = RedisClient.from_url(f"rediss://127.0.0.2:{tls_server.tls_port}", ssl_context=context)
    with pytest.raises(RedisClientError, match=r"CERTIFICATE_VERIFY_FAILED|cannot connect"):
        await client.execute("PING")
    await client.close()


# -- options -------------------------------------------------------------------------------


def test_options_are_validated() -> None:
    url = "redis://localhost"
    with pytest.raises(ValueError, match="command_timeout_s must be a positive, finite"):
        RedisClient.from_url(url, command_timeout_s=0)
    with pytest.raises(ValueError, match="connect_timeout_s must be a positive, finite"):
        RedisClient.from_url(url, connect_timeout_s=float("inf"))
    with pytest.raises(TypeError, match="command_timeout_s must be a number of seconds"):
        RedisClient.from_url(url, command_timeout_s=True)
    with pytest.raises(ValueError, match=r"connections_per_loop must be 1\.\.64, got 0"):
        RedisClient.from_url(url, connections_per_loop=0)
    with pytest.raises(ValueError, match=r"ssl_context was given but redis://localhost:6379 is no"):
        RedisClient.from_url(url, ssl_context=ssl.create_default_context())
    with pytest.raises(ValueError, match="client_name 'a b' must be"):
        RedisClient.from_url(url, client_name="a b")
    with pytest.raises(ValueError, match="invalid Redis URL 'redis://:\\*\\*\\*@h/x'"):
        RedisClient.from_url("redis://:pw@h/x")


def test_explicit_client_name_wins_over_the_url() -> None:
    assert RedisClient.from_url("redis://h?client_name=a").client_name == "a"
    assert RedisClient.from_url("redis://h?client_name=a", client_name="b").client_name == "b"
    assert RedisClient.from_url("redis://h?client_name=a", client_name=None).client_name == "a"
    assert RedisClient(parse_url("redis://h")).address == parse_url("redis://h")


def test_the_client_imports_nothing_of_the_limiter() -> None:
    """moderato/redis/ stands alone: its own errors, and of the package only the C helpers."""
    package = Path(__file__).resolve().parents[2] / "moderato" / "redis"
    for path in sorted(package.glob("*.py")):
        for line in path.read_text().splitlines():
            if line.startswith(("from ..", "import moderato", "from moderato")):
                assert line.startswith("from .._accel import"), (path.name, line)


def test_the_client_reads_no_private_asyncio_attribute() -> None:
    """Per-loop pools are found through get_running_loop(), not a loop's private state."""
    package = Path(__file__).resolve().parents[2] / "moderato" / "redis"
    private = re.compile(r"\b(?:loop|asyncio|base_loop)\._[a-z]")
    for path in sorted(package.glob("*.py")):
        text = path.read_text()
        assert "_thread_id" not in text, path.name
        assert private.search(text) is None, (path.name, private.search(text))


# -- a required role ------------------------------------------------------------------


async def test_a_required_role_is_checked_on_every_connect(own_redis_server: RedisServer) -> None:
    """role="master": ROLE in each handshake; a server that answers otherwise gets nothing."""
    primary = own_redis_server
    client = RedisClient.from_url(primary.url, role="master", command_timeout_s=0.5)
    try:
        assert await client.execute("SET", "role:k", "1") == b"OK"
        # Demoted while the client is away (a replica of a server that is not
        # there), then its connection dropped: the next command reconnects.
        primary.command("REPLICAOF", "127.0.0.1", str(free_port()))
        primary.command("CLIENT", "KILL", "TYPE", "normal")
        deadline = time.monotonic() + 5
        while client.connections() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the client sees its connection close
        with pytest.raises(CommandNotSentError, match=r"it is a slave, not a master \(ROLE\)"):
            await client.execute("GET", "role:k")
        # Nothing but the handshake reached it: the GET was never sent.
        assert b"cmdstat_get:" not in primary.command("INFO", "commandstats")
        primary.command("REPLICAOF", "NO", "ONE")
        # After the reconnect backoff, a master again: served.
        await asyncio.sleep(BACKOFF_CAP_S)
        assert await client.execute("GET", "role:k") == b"1"
    finally:
        await client.close()


def test_a_required_role_is_master_or_slave() -> None:
    with pytest.raises(ValueError, match="role must be 'master', 'slave' or None, got 'primary'"):
        RedisClient.from_url("redis://h", role="primary")


# -- no leak in the per-command path ----------------------------------------------------

LEAK_ROUNDS = 4_000
LEAK_BOUND_BYTES = 16 << 10


async def test_no_leaks_in_the_per_command_path(client: RedisClient) -> None:
    """Every step ConnectionCore takes (send_script, _queue, the flush, the reply
    dispatch, an error reply, a batch of several commands): the references of what
    it is given do not move, and traced memory does not grow."""
    failing = make_script(b"return redis.error_reply('MODERATO_ARG leak')")
    key, argument = "".join(["leak-", "key"]), 10**30  # counted: not interned or cached

    async def rounds(times: int) -> None:
        for _ in range(times):
            assert await client.evalsha(DOUBLE, [key], [21]) == 42
            with pytest.raises(RedisReplyError):
                await client.evalsha(failing, [key], [])
            assert await client.execute("ECHO", key) == key.encode()
            replies = await asyncio.gather(*(client.execute("INCRBY", key, 1) for _ in range(3)))
            assert len(replies) == 3
            await client.execute("SET", "leak-big", argument)
            # A check queued unencoded: encoded now by a connection that does not join.
            connection = only_connection(client)
            assert await connection.send_script(None, DOUBLE, [key], [21]) == 42

    await rounds(200)
    gc.collect()
    counts = [sys.getrefcount(value) for value in (key, argument, DOUBLE, failing)]
    tracemalloc.start()
    try:
        await rounds(200)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await rounds(LEAK_ROUNDS)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(value) for value in (key, argument, DOUBLE, failing)] == counts
    assert after - before < LEAK_BOUND_BYTES
