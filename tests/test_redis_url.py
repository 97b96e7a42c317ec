"""parse_url: every accepted form, and a clear, password-free ValueError for the rest."""

from __future__ import annotations

import dataclasses

import pytest

from moderato.redis import RedisAddress, mask_url, parse_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://localhost", RedisAddress(host="localhost", port=6379)),
        ("redis://127.0.0.1:7000", RedisAddress(host="127.0.0.1", port=7000)),
        ("redis://127.0.0.1:7000/", RedisAddress(host="127.0.0.1", port=7000)),
        ("redis://h:1/15", RedisAddress(host="h", port=1, db=15)),
        ("redis://h/0", RedisAddress(host="h")),
        ("redis://h?db=3", RedisAddress(host="h", db=3)),
        ("redis://h/3?db=3", RedisAddress(host="h", db=3)),
        ("REDIS://Cache.Example.COM", RedisAddress(host="cache.example.com")),
        ("redis://[::1]:6380/2", RedisAddress(host="::1", port=6380, db=2)),
        ("redis://:s3cret@h", RedisAddress(host="h", password="s3cret")),
        ("redis://alice:s3cret@h", RedisAddress(host="h", username="alice", password="s3cret")),
        ("redis://alice:@h", RedisAddress(host="h", username="alice", password="")),
        ("redis://:@h", RedisAddress(host="h")),
        # Percent-escapes in credentials are decoded; an escaped '@' or ':' stays data.
        ("redis://a%40b:p%3Aw%40d@h", RedisAddress(host="h", username="a@b", password="p:w@d")),
        # An unescaped '@' in the password: the last '@' ends the credentials.
        ("redis://:p@ss@h", RedisAddress(host="h", password="p@ss")),
        ("rediss://h", RedisAddress(host="h", tls=True)),
        ("rediss://u:p@h:6390/1", RedisAddress(host="h", port=6390, db=1, username="u",
                                               password="p", tls=True)),
        ("redis://h?client_name=api-7", RedisAddress(host="h", client_name="api-7")),
        ("redis://h/4?client_name=x&db=4", RedisAddress(host="h", db=4, client_name="x")),
        ("unix:///run/redis.sock", RedisAddress(unix_path="/run/redis.sock")),
        ("unix:///run/redis.sock?db=2", RedisAddress(unix_path="/run/redis.sock", db=2)),
        ("unix:///run/my%20redis.sock", RedisAddress(unix_path="/run/my redis.sock")),
        ("unix://:pw@/run/redis.sock", RedisAddress(unix_path="/run/redis.sock", password="pw")),
        ("unix:///r.sock?client_name=w1&db=1", RedisAddress(unix_path="/r.sock", db=1,
                                                             client_name="w1")),
    ],
)  # fmt: skip
def test_accepted_urls(url: str, expected: RedisAddress) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "unsupported scheme (none)"),
        ("localhost:6379", "unsupported scheme localhost://"),
        ("http://h", "unsupported scheme http://"),
        ("redis+cluster://h", "unsupported scheme redis+cluster://"),
        ("redis://", "a host is required"),
        ("redis:///0", "a host is required"),
        ("redis://:pw@", "a host is required"),
        ("redis://h:0", "port 0 cannot be connected to"),
        ("redis://h:65536", "bad port"),
        ("redis://h:-1", "bad port"),
        ("redis://h:port", "bad port"),
        ("redis://h:", "an empty port"),
        ("redis://[::1", "Invalid IPv6 URL"),
        ("redis://h/x", "the path must be a database number"),
        ("redis://h/1/2", "the path must be a database number"),
        ("redis://h/-1", "the path must be a database number"),
        ("redis://h/\u0661", "the path must be a database number"),
        ("redis://h/2147483648", "database 2147483648 is out of range"),
        ("redis://h/1?db=2", "the database is given twice and differs"),
        ("redis://h?db=x", "db must be a non-negative integer"),
        ("redis://h?db=", "db must be a non-negative integer"),
        ("redis://h?db=1&db=1", "option 'db' is given twice"),
        ("redis://h?timeout=1", "unknown option 'timeout'"),
        ("redis://h?db", "malformed query"),
        ("redis://h?client_name=", "client_name '' must be non-empty printable ASCII"),
        ("redis://h?client_name=a%20b", "client_name 'a b' must be non-empty printable ASCII"),
        ("redis://h#frag", "a fragment"),
        ("redis://alice@h", "it names a user but no password"),
        (" redis://h", "blanks or control characters"),
        ("redis://h\n", "blanks or control characters"),
        ("redis://h h", "blanks or control characters"),
        ("unix://host/run/redis.sock", "a unix:// URL takes no host"),
        ("unix://", "needs an absolute socket path"),
        ("unix:///", "needs an absolute socket path"),
        ("unix:///r.sock?db=-1", "db must be a non-negative integer"),
    ],
)
def test_rejected_urls(url: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert message.startswith(f"invalid Redis URL {mask_url(url)!r}: ")
    assert reason in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@h/x",
        "redis://bob:hunter2@h:99999",
        "rediss://bob:hunter2@h?nope=1",
        "redis://:hun@ter2@h#x",
        "http://bob:hunter2@h",
        "unix://:hunter2@host/sock",
        "redis://hunter2@h",
    ],
)
def test_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    assert "hunter2" not in str(caught.value)
    assert "ter2" not in str(caught.value)
    assert "***" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://h", "redis://h"),
        ("redis://:pw@h", "redis://:***@h"),
        ("redis://u:pw@h:1/2", "redis://u:***@h:1/2"),
        ("redis://u:p@w@h", "redis://u:***@h"),
        ("redis://pw@h", "redis://***@h"),
        ("u:pw@h", "u:***@h"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_address_str_and_repr_hide_the_password() -> None:
    address = parse_url("rediss://alice:hunter2@cache:6390/3?client_name=api")
    assert str(address) == "rediss://alice:***@cache:6390/3"
    assert "hunter2" not in repr(address)
    assert str(parse_url("redis://:pw@[::1]")) == "redis://:***@[::1]:6379"
    assert str(parse_url("unix:///run/r.sock?db=2")) == "unix:///run/r.sock?db=2"
    assert str(parse_url("redis://h")) == "redis://h:6379"


def test_address_is_frozen() -> None:
    address = parse_url("redis://h")
    with pytest.raises(dataclasses.FrozenInstanceError):
        address.port = 1  # type: ignore[misc]


def test_non_str_url_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="a Redis URL must be a str, got bytes"):
        parse_url(b"redis://h")  # type: ignore[arg-type]
