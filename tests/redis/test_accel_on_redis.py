"""The C accelerator's bytes through a real redis-server: what encode_command and
encode_evalsha write, Redis reads; what it answers, decode_decision reads; the SCAN
patterns of key_pattern find exactly an identity's keys (tests/unit/test_accel.py holds
the same functions to their pure-Python references, with no server)."""

from __future__ import annotations

import socket
from typing import Any, Optional

import accel_reference as reference
import hiredis
import pytest
from redis_servers import RedisServer

import moderato._accel as accel

MB = 1 << 20
SECRET = b"0123456789abcdef"
NOW_MS = 1_700_000_000_000


def round_trip(server: RedisServer, *commands: bytes) -> list[Any]:
    """Send encoded commands in one write; read one reply each with hiredis."""
    reader = hiredis.Reader()
    replies: list[Any] = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"".join(commands))
        while len(replies) < len(commands):
            data = sock.recv(1 << 16)
            assert data, "redis-server closed the connection"
            reader.feed(data)
            reply = reader.gets()
            while reply is not False:
                replies.append(reply)
                reply = reader.gets()
    return replies


def test_redis_reads_what_encode_command_writes(redis_server: RedisServer, redis_url: str) -> None:
    values: list[Any] = [
        b"",
        b"\r\n$3\r\n*\x00",
        "\u00e9\u2603",
        -(2**63),
        2**200,
        bytearray(b"array"),
        memoryview(b"view")[1:],
        b"x" * MB,
    ]
    commands = [accel.encode_command("SET", f"k{i}", value) for i, value in enumerate(values)]
    commands += [accel.encode_command("GET", f"k{i}") for i in range(len(values))]
    replies = round_trip(redis_server, *commands)
    assert replies[: len(values)] == [b"OK"] * len(values)
    assert replies[len(values) :] == [reference._argument_bytes(value) for value in values]


def test_evalsha_reply_decodes(redis_server: RedisServer, redis_url: str) -> None:
    script = b"return {0, 1, #KEYS, tonumber(ARGV[1]), tonumber(ARGV[2]), 0, -1, -1}"
    [sha] = round_trip(redis_server, accel.encode_command("SCRIPT", "LOAD", script))
    keys = accel.build_keys("app", "fw", "t", "s", "i", [1, 60])
    [reply] = round_trip(redis_server, accel.encode_evalsha(sha, keys, [500, NOW_MS]))
    assert accel.decode_decision(reply, 2) == (False, 1, ((2, 500, NOW_MS), (0, -1, -1)))


@pytest.mark.parametrize("secret", [None, SECRET])
def test_redis_scan_with_key_pattern_finds_exactly_the_identity_keys(
    redis_server: RedisServer, redis_url: str, secret: Optional[bytes]
) -> None:
    triples: list[tuple[Any, ...]] = [
        ("acme", "api", "10.0.0.1"),
        ("acme", "api", "10.0.0.12"),
        ("acme", "api:10.0.0.1", ""),
        ("acme:api", "10.0.0.1", ""),
        ("acme", "api", "10.0.0.1" * 20),
        ("acme", "api*", "10.0.0.1"),
        ("", "api", "10.0.0.1"),
    ]
    keys_of = {
        triple: [
            key + suffix
            for algorithm in ("fw", "tb", "sw")
            for key in accel.build_keys("app", algorithm, *triple, [1, 60, 86_400], secret)
            for suffix in (b"", b":28333333", b":bucket:v2")
        ]
        for triple in triples
    }
    # Same tag under a longer prefix, and a prefix that merely starts the same.
    others = accel.build_keys("app2", "fw", *triples[0], [1], secret)
    round_trip(
        redis_server,
        *(accel.encode_command("SET", key, 1) for keys in keys_of.values() for key in keys),
        *(accel.encode_command("SET", key, 1) for key in others),
    )
    for triple, keys in keys_of.items():
        pattern = accel.key_pattern("app", *triple, secret)
        found: set[bytes] = set()
        cursor = b"0"
        while True:
            [reply] = round_trip(
                redis_server, accel.encode_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            )
            cursor, batch = reply
            found.update(batch)
            if cursor == b"0":
                break
        assert found == set(keys), triple
