"""parse_url: every accepted form, and a clear, password-free ValueError for the rest."""

from __future__ import annotations

import dataclasses

import pytest

from moderato.redis import (
    ClusterAddress,
    RedisAddress,
    is_cluster_url,
    mask_url,
    parse_cluster_url,
    parse_url,
)


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
        ("redis+cluster://h", "redis+cluster:// names a Redis Cluster, not one server"),
        ("rediss+cluster://h", "use parse_cluster_url() or ClusterClient"),
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


# -- cluster URLs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+cluster://h", ClusterAddress(seeds=(("h", 6379),))),
        ("redis+cluster://h/", ClusterAddress(seeds=(("h", 6379),))),
        ("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,10.0.0.3",
         ClusterAddress(seeds=(("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 6379)))),
        # IPv6 seeds in brackets, anywhere in the list.
        ("redis+cluster://a:1,[::1]:7001,[fe80::2]",
         ClusterAddress(seeds=(("a", 1), ("::1", 7001), ("fe80::2", 6379)))),
        # A seed named twice is asked once.
        ("redis+cluster://a:1,a:1,b:2", ClusterAddress(seeds=(("a", 1), ("b", 2)))),
        ("REDIS+CLUSTER://Node-A:7000", ClusterAddress(seeds=(("node-a", 7000),))),
        ("redis+cluster://:s3cret@a:1,b:2",
         ClusterAddress(seeds=(("a", 1), ("b", 2)), password="s3cret")),
        ("redis+cluster://alice:p%40ss@a:1",
         ClusterAddress(seeds=(("a", 1),), username="alice", password="p@ss")),
        ("redis+cluster://:p@ss@a:1", ClusterAddress(seeds=(("a", 1),), password="p@ss")),
        ("rediss+cluster://u:p@a:6390,b:6390?client_name=api-1",
         ClusterAddress(seeds=(("a", 6390), ("b", 6390)), username="u", password="p", tls=True,
                        client_name="api-1")),
    ],
)  # fmt: skip
def test_accepted_cluster_urls(url: str, expected: ClusterAddress) -> None:
    assert is_cluster_url(url)
    assert parse_cluster_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://h", "unsupported scheme redis://; expected redis+cluster://"),
        ("cluster://h", "unsupported scheme cluster://"),
        ("h:7000,h:7001", "unsupported scheme (none)"),
        ("redis+cluster://", "at least one seed node is required"),
        ("redis+cluster://:pw@", "at least one seed node is required"),
        ("redis+cluster://a:1,", "an empty seed node"),
        ("redis+cluster://,a:1", "an empty seed node"),
        ("redis+cluster://a:1,,b:2", "an empty seed node"),
        ("redis+cluster://a:0", "port 0 cannot be connected to"),
        ("redis+cluster://a:1,b:65536", "bad seed node 'b:65536'"),
        ("redis+cluster://a:x", "bad seed node 'a:x'"),
        ("redis+cluster://a:", "an empty port after ':'"),
        ("redis+cluster://a:1,[::1", "Invalid IPv6 URL"),
        ("redis+cluster://a/0", "names no database"),
        ("redis+cluster://a/1", "Redis Cluster has only database 0"),
        ("redis+cluster://a?db=0", "takes no db option"),
        ("redis+cluster://a?timeout=1", "unknown option 'timeout'"),
        ("redis+cluster://a?client_name=", "client_name '' must be non-empty printable ASCII"),
        ("redis+cluster://a#x", "a fragment"),
        ("redis+cluster://alice@a", "it names a user but no password"),
        ("redis+cluster://a, b", "blanks or control characters"),
    ],
)
def test_rejected_cluster_urls(url: str, reason: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_cluster_url(url)
    message = str(caught.value)
    assert message.startswith(f"invalid Redis Cluster URL {mask_url(url)!r}: ")
    assert reason in message


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://:hunter2@a:1,b:0",
        "rediss+cluster://bob:hunter2@a:1/2",
        "redis+cluster://bob:hunter2@a?db=1",
        "redis+cluster://:hun@ter2@a,",
    ],
)
def test_cluster_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_cluster_url(url)
    assert "ter2" not in str(caught.value)
    assert "***" in str(caught.value)


def test_cluster_address_str_hides_the_password() -> None:
    address = parse_cluster_url("rediss+cluster://alice:hunter2@a:1,[::1]:2")
    assert str(address) == "rediss+cluster://alice:***@a:1,[::1]:2"
    assert "hunter2" not in repr(address)
    assert str(parse_cluster_url("redis+cluster://a")) == "redis+cluster://a:6379"
    node = address.node("10.0.0.9", 7005)
    assert node == RedisAddress(host="10.0.0.9", port=7005, username="alice",
                                password="hunter2", tls=True)  # fmt: skip


def test_is_cluster_url() -> None:
    assert is_cluster_url("redis+cluster://a") and is_cluster_url("RediSS+Cluster://a")
    assert not is_cluster_url("redis://a") and not is_cluster_url("redis+cluster:a")
    assert not is_cluster_url(b"redis+cluster://a")
