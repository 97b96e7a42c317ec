"""The blocking Redis client (moderato/redis/blocking/) on real redis-server processes.

Threads, timeouts, a bounded pool, NOSCRIPT, restarts and fork(): every
number exact, every wait bounded.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cluster import call, script_calls
from fork_helpers import in_child
from redis_servers import RedisServer

from moderato.redis.blocking import RedisClient
from moderato.redis.connection import CommandNotSentError
from moderato.redis.errors import RedisConnectionError, RedisReplyError
from moderato.scripts import load_script

FIXED = load_script("fixed_window")


def fixed_window_args(limit: int) -> list[int]:
    """A fixed window of ``limit`` per day: cost 1, applied."""
    return [1000, 1, limit * 1000, 86_400]


def client_count(server: RedisServer, name: str) -> int:
    listing = call(server.port, "CLIENT", "LIST").decode()
    return sum(f" name={name} " in f" {line} " for line in listing.splitlines())


def test_commands_replies_and_error_replies(redis_url: str) -> None:
    client = RedisClient.from_url(redis_url)
    assert client.execute("PING") == b"PONG"
    assert client.execute("SET", "k", 5) == b"OK"
    assert client.execute("INCRBY", b"k", 2) == 7
    assert client.execute("GET", "missing") is None
    with pytest.raises(RedisReplyError, match="wrong number of arguments"):
        client.execute("INCR", "a", "b")
    # An error reply leaves the connection in step: the next reply is its own.
    assert client.execute("GET", "k") == b"7"
    assert client.execute_many([("SET", "a", 1), ("INCR", "a"), ("GET", "a")]) == [b"OK", 2, b"2"]
    replies = client.execute_many([("INCR", "a"), ("HGET", "a", "f")], raise_on_error=False)
    assert replies[0] == 3 and isinstance(replies[1], RedisReplyError)
    with pytest.raises(TypeError):
        client.execute("SET", "k", 1.5)  # type: ignore[arg-type]
    assert client.open_connections == 1
    client.close()
    assert client.open_connections == 0
    assert client.execute("GET", "k") == b"7"  # usable again after close()


def test_database_client_name_and_acl_user(own_redis_server: RedisServer) -> None:
    port = own_redis_server.port
    call(port, "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all")
    call(port, "CONFIG", "SET", "requirepass", "topsecret")
    client = RedisClient.from_url(f"redis://app:pw@127.0.0.1:{port}/3?client_name=sync-acl")
    assert client.execute("ACL", "WHOAMI") == b"app"
    assert client.execute("CLIENT", "GETNAME") == b"sync-acl"
    assert b"db=3" in client.execute("CLIENT", "INFO")
    default_user = RedisClient.from_url(f"redis://:topsecret@127.0.0.1:{port}")
    assert default_user.execute("ACL", "WHOAMI") == b"default"
    wrong = RedisClient.from_url(f"redis://app:nope@127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(CommandNotSentError, match="AUTH was refused: WRONGPASS"):
        wrong.execute("PING")
    assert wrong.open_connections == 0


def test_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    server = RedisServer(extra_args=("--unixsocket", str(socket_path), "--unixsocketperm", "700"))
    server.start()
    try:
        client = RedisClient.from_url(f"unix://{socket_path}?db=2&client_name=via-unix")
        assert client.execute("CLIENT", "GETNAME") == b"via-unix"
        assert b"db=2" in client.execute("CLIENT", "INFO")
    finally:
        server.close()


def test_url_options_set_the_timeouts() -> None:
    client = RedisClient.from_url(
        "redis://h?socket_timeout=0.25&socket_connect_timeout=2", command_timeout_s=9
    )
    assert (client.command_timeout_s, client.connect_timeout_s) == (0.25, 2.0)
    with pytest.raises(ValueError, match=r"max_connections must be 1\.\.4096"):
        RedisClient("redis://h", max_connections=0)
    with pytest.raises(ValueError, match="unknown option 'max_connection'"):
        RedisClient.from_url("redis://h?max_connection=3")


def test_a_paused_server_times_out_every_thread_and_no_connection_stays_out_of_step(
    own_redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(
        own_redis_server.url, command_timeout_s=0.3, connect_timeout_s=0.3, max_connections=4
    )
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: client.execute("INCR", "n"), range(8))) != []
    assert client.execute("GET", "n") == b"8"
    own_redis_server.pause()
    try:

        def timed(_: int) -> tuple[str, float]:
            begun = time.monotonic()
            try:
                client.execute("INCR", "n")
            except RedisConnectionError as error:
                return type(error).__name__, time.monotonic() - begun
            return "replied", time.monotonic() - begun

        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(timed, range(8)))
    finally:
        own_redis_server.resume()
    # A thread that took an idle connection wrote its INCR and timed out
    # (RedisConnectionError: it may have run); the others opened a connection,
    # which the paused server never greeted (CommandNotSentError: it did not run).
    # None hung: each within its connect or command timeout (plus a pool wait).
    names = [name for name, _ in outcomes]
    written = names.count("RedisConnectionError")
    assert names.count("CommandNotSentError") + written == 8
    assert 1 <= written <= 4
    assert all(took < 2.0 for _, took in outcomes), outcomes  # 0.3 + 0.3, and a loaded host
    assert client.idle_connections == 0
    # Whatever the paused server ran of the INCRs written, its replies went to
    # closed connections, none to a later command of this client.
    client.connect()  # at once, whatever the reconnect backoff says
    ran = int(client.execute("GET", "n")) - 8
    assert 0 <= ran <= written
    assert client.execute("INCR", "n") == 8 + ran + 1


def test_a_paused_server_times_a_script_call_out_within_its_bound_and_the_next_is_in_step(
    own_redis_server: RedisServer,
) -> None:
    # A check's path: evalsha() on an idle connection, where the socket's own
    # (kernel) timeout bounds the wait for the reply.
    client = RedisClient.from_url(own_redis_server.url, command_timeout_s=0.3, max_connections=1)
    key = b"paused:{one}:86400"
    assert client.evalsha(FIXED, [key], fixed_window_args(100))[:3] == [1, 0, 99_000]
    own_redis_server.pause()
    try:
        begun = time.monotonic()
        with pytest.raises(RedisConnectionError, match=r"within 0\.3 s \(command timeout\)"):
            client.evalsha(FIXED, [key], fixed_window_args(100))
        took = time.monotonic() - begun
    finally:
        own_redis_server.resume()
    assert 0.25 <= took < 1.0, took  # the timeout, not sooner, not much later on a loaded host
    assert client.open_connections == 0  # the timed-out connection was dropped
    # The written call may have run once the server resumed (its reply went to the
    # closed connection); the next call's reply is its own, with the count it saw.
    reply = client.evalsha(FIXED, [key], fixed_window_args(100))
    assert reply[0] == 1 and reply[2] in (98_000, 97_000)
    ran = (99_000 - reply[2]) // 1000 - 1
    assert client.evalsha(FIXED, [key], fixed_window_args(100))[2] == (97 - ran) * 1000


def test_a_reply_longer_than_one_read_is_read_whole_and_the_next_is_in_step(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url, max_connections=1)
    big = os.urandom(3 * 1024 * 1024)  # many reads of the connection's 64 KB buffer
    assert client.execute("SET", "big", big) == b"OK"
    assert client.execute("GET", "big") == big
    assert client.execute("STRLEN", "big") == len(big)
    assert client.execute_many([("GET", "big"), ("PING",)]) == [big, b"PONG"]
    assert client.open_connections == 1


def test_the_pool_never_opens_more_than_max_connections(redis_server: RedisServer) -> None:
    name = "bounded-pool"
    client = RedisClient.from_url(redis_server.url, max_connections=3, client_name=name)
    seen: list[int] = []
    lock = threading.Lock()

    def work(_: int) -> None:
        for _ in range(50):
            client.execute("INCR", "bounded")
        with lock:
            seen.append(client.open_connections)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(work, range(32)))
    assert client.execute("GET", "bounded") == b"1600"
    assert max(seen) <= 3
    assert client_count(redis_server, name) <= 3


def test_a_busy_pool_serves_waiting_threads_in_turn(redis_server: RedisServer) -> None:
    """32 threads on 2 connections: a connection given back goes to the thread that has
    waited longest, so none waits out its timeout while others go round again."""
    client = RedisClient.from_url(redis_server.url, max_connections=2)
    failures: list[BaseException] = []

    def work(_: int) -> None:
        for _ in range(100):
            try:
                client.execute("INCR", "turns")
            except RedisConnectionError as error:
                failures.append(error)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(work, range(32)))
    assert failures == []
    assert client.execute("GET", "turns") == b"3200"
    assert client.open_connections == 2


def test_an_exhausted_pool_is_an_error_after_the_command_timeout_not_a_hang(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url, command_timeout_s=0.4, max_connections=1)
    client.execute("PING")
    held = client._take()  # another thread's command, in flight for longer than the wait
    try:
        started = time.monotonic()
        with pytest.raises(CommandNotSentError, match=r"all 1 connections were busy for 0.4 s"):
            client.execute("PING")
        assert 0.35 < time.monotonic() - started < 1.0
    finally:
        client._give(held)
    assert client.execute("PING") == b"PONG"
    assert client.open_connections == 1


def test_a_thread_waiting_for_a_connection_gets_one_given_back(
    own_redis_server: RedisServer,
) -> None:
    """A timed-out command's connection is closed, and its place goes to a waiting thread,
    which opens a fresh one: the wait ends with a connect, bounded by connect_timeout_s."""
    client = RedisClient.from_url(
        own_redis_server.url, command_timeout_s=0.4, connect_timeout_s=0.3, max_connections=1
    )
    client.execute("PING")
    own_redis_server.pause()
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            client.execute("PING")
        except RedisConnectionError as error:
            errors.append(error)

    first = threading.Thread(target=blocked)
    first.start()
    time.sleep(0.1)
    started = time.monotonic()
    try:
        with pytest.raises(CommandNotSentError, match=r"no answer within 0.3 s \(connect timeout"):
            client.execute("PING")
        assert time.monotonic() - started < 0.4 + 0.3 + 0.3
    finally:
        own_redis_server.resume()
    first.join(5)
    assert len(errors) == 1 and "(command timeout)" in str(errors[0])
    time.sleep(0.05)  # past the reconnect backoff of one failed connect (25 ms)
    assert client.execute("PING") == b"PONG"


def test_noscript_loads_the_script_once_per_connection(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url, max_connections=4)
    key = b"nos:{one}:86400"
    assert client.evalsha(FIXED, [key], fixed_window_args(10_000))[0] == 1
    call(redis_server.port, "SCRIPT", "FLUSH")
    call(redis_server.port, "CONFIG", "RESETSTAT")
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(lambda i: client.evalsha(FIXED, [key], fixed_window_args(10_000)), range(400))
        )
    assert all(reply[0] == 1 for reply in replies)
    # [allowed, deciding, remaining_scaled, ...]: 401 charged exactly.
    assert min(reply[2] for reply in replies) == (10_000 - 401) * 1000
    stats = script_calls(redis_server.port)
    loads = stats["script|load"][0]
    assert 1 <= loads <= 4  # at most one per connection that met NOSCRIPT
    assert stats["evalsha"] == (400 + loads, loads)  # one NOSCRIPT per load
    assert stats["eval"] == (0, 0)


def test_a_refused_load_falls_back_to_eval(own_redis_server: RedisServer) -> None:
    port = own_redis_server.port
    call(port, "ACL", "SETUSER", "noload", "on", ">pw", "~*", "+@all", "-script|load")
    client = RedisClient.from_url(f"redis://noload:pw@127.0.0.1:{port}")
    reply = client.evalsha(FIXED, [b"el:{x}:86400"], fixed_window_args(5))
    assert reply[:3] == [1, 0, 4000]
    stats = script_calls(port)
    assert stats["eval"] == (1, 0)  # the refused load is no call: NOPERM rejects it
    assert stats["evalsha"] == (2, 2)


def test_a_restart_costs_no_failed_command(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: client.execute("PING"), range(40)))
    assert client.idle_connections >= 1
    own_redis_server.restart()
    time.sleep(0.1)  # idle longer than IDLE_CHECK_AFTER_S: checked before reuse
    assert client.execute("SET", "after", "restart") == b"OK"


def test_a_dead_server_fails_fast_then_the_client_reconnects(own_redis_server: RedisServer) -> None:
    client = RedisClient.from_url(own_redis_server.url, connect_timeout_s=0.5)
    assert client.execute("PING") == b"PONG"
    own_redis_server.stop()
    # The idle connection is found closed (or fails, if checked too soon), then
    # a connect is refused.
    with pytest.raises(CommandNotSentError, match="Connection refused"):
        try:
            client.execute("PING")
        except CommandNotSentError:
            raise
        except RedisConnectionError:
            client.execute("PING")
    started = time.monotonic()
    with pytest.raises(CommandNotSentError, match="not retrying yet: next connect attempt in"):
        client.execute("PING")
    assert time.monotonic() - started < 0.1
    own_redis_server.start()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert client.execute("PING") == b"PONG"
            break
        except RedisConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    client.connect()  # tries regardless of any backoff


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_alone(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url)
    parent_id = client.execute("CLIENT", "ID")

    def child() -> list[int]:
        assert client.open_connections == 0
        child_id = client.execute("CLIENT", "ID")
        client.close()
        return [child_id, client.execute("INCR", "forked")]

    child_id, count = in_child(child)
    assert child_id != parent_id
    assert count == 1
    # The parent's connection is the one it had (same client id), still in step.
    assert client.execute("CLIENT", "ID") == parent_id
    assert client.execute("INCR", "forked") == 2
