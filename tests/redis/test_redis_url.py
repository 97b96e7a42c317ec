"""parse_url: every accepted form, and a clear, password-free ValueError for the rest."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shutil
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from batching_helpers import repeats_per_call
from redis_servers import RedisServer, free_port, make_certificates
from test_grouping import calls

from moderato import RateLimiter
from moderato.algorithms import DEFAULT_ALGORITHM
from moderato.errors import BackendError, RateLimitConfigError
from moderato.redis import (
    ClusterAddress,
    ClusterClient,
    RedisAddress,
    RedisClient,
    SentinelAddress,
    SentinelClient,
    is_cluster_url,
    is_sentinel_url,
    mask_url,
    parse_cluster_url,
    parse_sentinel_url,
    parse_url,
)
from moderato.redis.errors import RedisClientError
from moderato.redis.url_options import ConnectOptions
from moderato.sync import RateLimiter as SyncRateLimiter


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


# -- Sentinel URLs (limits' form) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+sentinel://s1:26379/mymaster",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="mymaster")),
        ("redis+sentinel://s1,s2:26380,[::1]/svc/4",
         SentinelAddress(sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26379)),
                         service_name="svc", db=4)),
        # One password for the primary and the sentinels, as limits does.
        ("redis+sentinel://:pw@s1/svc?db=2&client_name=api",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc", db=2, password="pw",
                         client_name="api", sentinel_password="pw")),
        # The sentinels' own credentials.
        ("redis+sentinel://u:pw@s1/svc?sentinel_username=watch&sentinel_password=spw",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc", username="u",
                         password="pw", sentinel_username="watch", sentinel_password="spw")),
        # Sentinels without a password in front of a primary with one.
        ("redis+sentinel://:pw@s1/svc?sentinel_password=",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc", password="pw")),
        ("rediss+sentinel://s1/svc",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc", tls=True,
                         sentinel_tls=True)),
        ("rediss+sentinel://s1/svc?sentinel_ssl=false",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc", tls=True)),
        # Replies released without waiting for the replicas (WAIT).
        ("redis+sentinel://s1/svc?wait_for_replicas=false",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc",
                         wait_for_replicas=False)),
        ("redis+sentinel://s1/svc?wait_for_replicas=TRUE",
         SentinelAddress(sentinels=(("s1", 26379),), service_name="svc")),
    ],
)  # fmt: skip
def test_accepted_sentinel_urls(url: str, expected: SentinelAddress) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://s1/svc", "expected redis+sentinel:// or rediss+sentinel://"),
        ("redis+sentinel://s1", "the service name is required"),
        ("redis+sentinel://s1/", "the service name is required"),
        ("redis+sentinel:///svc", "at least one sentinel is required"),
        ("redis+sentinel://s1,,s2/svc", "an empty sentinel"),
        ("redis+sentinel://s1:0/svc", "port 0 cannot be connected to"),
        ("redis+sentinel://s1/svc/x", "must be a database number"),
        ("redis+sentinel://s1/svc/1?db=2", "the database is given twice and differs"),
        ("redis+sentinel://s1/svc?sentinel_ssl=maybe", "sentinel_ssl must be true or false"),
        ("redis+sentinel://s1/svc?wait_for_replicas=1", "wait_for_replicas must be true or false"),
        ("redis+sentinel://s1/svc?sentinel_username=u", "sentinel_username needs"),
        ("redis+sentinel://s1/svc?master=x", "unknown option 'master'; accepted: db, "),
        ("redis+sentinel://s1/svc#x", "a fragment"),
    ],
)
def test_rejected_sentinel_urls(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match="invalid Redis Sentinel URL") as raised:
        parse_sentinel_url(url)
    assert reason in str(raised.value)


def test_sentinel_urls_never_show_a_password() -> None:
    url = "redis+sentinel://:hunter2@s1/svc?sentinel_password=swordfish&bad=1"
    with pytest.raises(ValueError) as raised:
        parse_sentinel_url(url)
    assert "hunter2" not in str(raised.value) and "swordfish" not in str(raised.value)
    address = parse_sentinel_url("redis+sentinel://u:hunter2@s1/svc/3?sentinel_password=sw")
    assert str(address) == "redis+sentinel://u:***@s1:26379/svc/3"
    assert "hunter2" not in repr(address) and "sw'" not in repr(address)


def test_sentinel_urls_are_told_apart() -> None:
    assert is_sentinel_url("redis+sentinel://s/x") and is_sentinel_url("REDISS+SENTINEL://s/x")
    assert not is_sentinel_url("redis://s") and not is_sentinel_url(None)
    with pytest.raises(ValueError, match="names sentinels, not one server"):
        parse_url("redis+sentinel://s1/svc")
    with pytest.raises(RateLimitConfigError, match="the service name is required"):
        RateLimiter("redis+sentinel://s1")


# -- the options users put in their URLs ----------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("socket_timeout=0.25", ConnectOptions(command_timeout_s=0.25)),
        ("socket_connect_timeout=2", ConnectOptions(connect_timeout_s=2.0)),
        ("ssl_cert_reqs=NONE", ConnectOptions(ssl_cert_reqs="none")),
        ("ssl_cert_reqs=optional", ConnectOptions(ssl_cert_reqs="optional")),
        ("ssl_ca_certs=/etc/ca.pem", ConnectOptions(ssl_ca_certs="/etc/ca.pem")),
        ("ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
         ConnectOptions(ssl_certfile="/c.pem", ssl_keyfile="/k.pem")),
        ("ssl_check_hostname=False", ConnectOptions(ssl_check_hostname=False)),
        ("ssl_check_hostname=true", ConnectOptions(ssl_check_hostname=True)),
        ("protocol=2", ConnectOptions()),
        *((f"batch_decisions={text}", ConnectOptions(batch_decisions=True))
          for text in ("true", "TRUE", "True", "1", "yes", "YES")),
        *((f"batch_decisions={text}", ConnectOptions(batch_decisions=False))
          for text in ("false", "FALSE", "False", "0", "no", "No")),
    ],
)  # fmt: skip
def test_connect_options_are_parsed(query: str, expected: ConnectOptions) -> None:
    assert parse_url(f"rediss://h?{query}").options == expected
    assert parse_cluster_url(f"rediss+cluster://h?{query}").options == expected
    assert parse_sentinel_url(f"rediss+sentinel://h/svc?{query}").options == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://h?socket_timeout=0", "socket_timeout must be a positive number of seconds"),
        ("redis://h?socket_timeout=inf", "socket_timeout must be a positive number of seconds"),
        ("redis://h?socket_connect_timeout=x", "socket_connect_timeout must be a positive"),
        ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of none, optional, required"),
        ("rediss://h?ssl_check_hostname=2", "ssl_check_hostname must be true or false"),
        ("rediss://h?ssl_ca_certs=", "ssl_ca_certs must be a file path"),
        ("rediss://h?ssl_keyfile=/k.pem", "ssl_keyfile needs ssl_certfile"),
        ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "cannot hold with"),
        ("redis://h?ssl_cert_reqs=none", "ssl_* options need a TLS scheme"),
        ("redis+cluster://h?ssl_ca_certs=/ca", "ssl_* options need a TLS scheme"),
        ("redis://h?protocol=3", "protocol=3 is not supported: moderato speaks RESP2"),
        ("redis://h?health_check_interval=30",
         "option 'health_check_interval' is not supported: moderato does not ping idle"),
        ("redis://h?retry_on_timeout=true",
         "unknown option 'retry_on_timeout'; accepted: db, client_name, socket_timeout, "
         "socket_connect_timeout, ssl_cert_reqs, ssl_ca_certs, ssl_certfile, ssl_keyfile, "
         "ssl_check_hostname, protocol, batch_decisions"),
        *((f"redis://h?batch_decisions={text}",
           "batch_decisions must be one of true, 1, yes, false, 0, no "
           f"(any case; got {text!r})")
          for text in ("on", "off", "2", "", "y", "truee")),
        ("redis+cluster://h?batch_decisions=maybe", "batch_decisions must be one of"),
        ("redis://h?batch_decisions=true&batch_decisions=false",
         "option 'batch_decisions' is given twice"),
    ],
)  # fmt: skip
def test_refused_connect_options(url: str, reason: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_url(url) if url.startswith("redis") and "+" not in url else parse_cluster_url(url)
    assert reason in str(raised.value)


def test_url_options_win_over_keywords() -> None:
    client = RedisClient.from_url(
        "redis://h?socket_timeout=0.3&socket_connect_timeout=0.7", command_timeout_s=5
    )
    assert (client.command_timeout_s, client.connect_timeout_s) == (0.3, 0.7)
    cluster = ClusterClient.from_url("redis+cluster://h?socket_timeout=0.3")
    assert cluster.command_timeout_s == 0.3
    limiter = RateLimiter("redis+sentinel://s/svc?socket_timeout=0.3")
    sentinel = limiter.backend.client  # type: ignore[attr-defined]
    assert isinstance(sentinel, SentinelClient)
    assert sentinel._options["command_timeout_s"] == 0.3
    with pytest.raises(ValueError, match="an ssl_context was given too"):
        RedisClient.from_url(
            "rediss://h?ssl_cert_reqs=none", ssl_context=ssl.create_default_context()
        )
    with pytest.raises(RateLimitConfigError, match="TLS options cannot be loaded"):
        RateLimiter("rediss://h?ssl_ca_certs=/nonexistent/ca.pem")


def test_batch_decisions_from_the_url_win_over_the_keyword() -> None:
    assert RedisClient.from_url("redis://h?batch_decisions=yes").batch_decisions
    assert RedisClient.from_url("unix:///r.sock?batch_decisions=1").batch_decisions
    assert not RedisClient.from_url(
        "rediss://h?batch_decisions=no", batch_decisions=True
    ).batch_decisions
    assert RedisClient.from_url("redis://h", batch_decisions=True).batch_decisions
    assert not RedisClient.from_url("redis://h").batch_decisions
    assert ClusterClient.from_url("redis+cluster://h?batch_decisions=true").batch_decisions
    limiter = RateLimiter("rediss+cluster://h?batch_decisions=true")
    assert limiter.backend.client.batch_decisions  # type: ignore[attr-defined]
    # The Sentinel client takes it for its primary, as the cluster client for its nodes.
    limiter = RateLimiter("redis+sentinel://s/svc?batch_decisions=true")
    assert limiter.backend.client.batch_decisions  # type: ignore[attr-defined]
    assert SentinelClient.from_url("redis+sentinel://s/svc", batch_decisions=True).batch_decisions
    assert not SentinelClient.from_url(
        "redis+sentinel://s/svc?batch_decisions=0", batch_decisions=True
    ).batch_decisions
    assert not SentinelClient.from_url("redis+sentinel://s/svc").batch_decisions


@pytest.mark.parametrize(
    "url", ["redis://h", "unix:///r.sock", "redis+cluster://h", "redis+sentinel://s/svc"]
)
def test_the_blocking_limiter_refuses_batch_decisions_true(url: str) -> None:
    separator = "&" if "?" in url else "?"
    with pytest.raises(RateLimitConfigError) as raised:
        SyncRateLimiter(f"{url}{separator}batch_decisions=true")
    message = str(raised.value)
    assert "the blocking client sends a call a check and never batches" in message
    assert "remove batch_decisions from the URL, or write batch_decisions=false" in message
    SyncRateLimiter(f"{url}{separator}batch_decisions=false")  # accepted, and means what it says


async def _burst(url: str, server: RedisServer, prefix: str) -> tuple[int, int]:
    """(admitted, EVALSHA calls) for 40 concurrent checks of one identity at 25/minute,
    after a warm-up burst of 2 (which loads the scripts) on another identity."""
    limiter = RateLimiter(url, key_prefix=prefix)
    try:
        await asyncio.gather(*(limiter.check_with_info("warm", "25/minute") for _ in range(2)))
        server.command("CONFIG", "RESETSTAT")
        results = await asyncio.gather(
            *(limiter.check_with_info("hot", "25/minute") for _ in range(40))
        )
        return sum(result.allowed for result in results), calls(server, "evalsha")
    finally:
        await limiter.close()


async def test_a_limiter_from_a_url_with_batch_decisions_batches(
    redis_server: RedisServer,
) -> None:
    # One identity's checks, each after the first a repeat of the one before: one call.
    parts = repeats_per_call(DEFAULT_ALGORITHM)
    batched = await _burst(f"{redis_server.url}?batch_decisions=true", redis_server, "urlb1")
    assert batched == (25, math.ceil(40 / parts)) == (25, 1)
    plain = await _burst(redis_server.url, redis_server, "urlb2")
    assert plain == (25, 40)
    off = await _burst(f"{redis_server.url}?batch_decisions=false", redis_server, "urlb3")
    assert off == (25, 40)


async def test_socket_timeout_fires(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(f"{own_redis_server.url}?socket_timeout=0.1", key_prefix="t")
    try:
        await limiter.connect()
        own_redis_server.pause()
        started = asyncio.get_running_loop().time()
        with pytest.raises(BackendError, match=r"did not reply within 0\.1 s"):
            await limiter.check("user:1", "5/minute")
        assert asyncio.get_running_loop().time() - started < 0.5
    finally:
        own_redis_server.resume()
        await limiter.close()


async def test_socket_connect_timeout_fires(own_redis_server: RedisServer) -> None:
    own_redis_server.pause()  # the kernel still accepts; nobody answers the handshake
    client = RedisClient.from_url(f"{own_redis_server.url}?socket_connect_timeout=0.15")
    try:
        with pytest.raises(RedisClientError, match=r"no answer within 0\.15 s \(connect timeout\)"):
            await client.connect()
    finally:
        own_redis_server.resume()
        await client.close()


async def test_db_client_name_and_protocol_reach_the_server(redis_server: RedisServer) -> None:
    limiter = RateLimiter(
        f"{redis_server.url}?db=5&client_name=url-opts&protocol=2", key_prefix="dbtest"
    )
    probe = RedisClient(f"{redis_server.url}/5")
    try:
        await probe.execute("FLUSHDB")
        await limiter.check("user:1", "5/minute")
        assert await probe.execute("DBSIZE") == 1
        clients = redis_server.command("CLIENT", "LIST").decode()
        line = next(line for line in clients.splitlines() if "name=url-opts" in line)
        assert " db=5 " in line and line.endswith(" resp=2")
    finally:
        await probe.execute("FLUSHDB")
        await probe.close()
        await limiter.close()


@pytest.fixture(scope="module")
def tls_files() -> Iterator[tuple[Path, int]]:
    """A redis-server that requires client certificates; its certificate names localhost only."""
    directory = Path(tempfile.mkdtemp(prefix="moderato-url-tls-"))
    try:
        make_certificates(directory, server_names="DNS:localhost")
    except FileNotFoundError as error:
        pytest.skip(str(error))
    tls_port = free_port()
    server = RedisServer(
        extra_args=(
            "--tls-port", str(tls_port),
            "--tls-cert-file", str(directory / "server.crt"),
            "--tls-key-file", str(directory / "server.key"),
            "--tls-ca-cert-file", str(directory / "ca.crt"),
            "--tls-auth-clients", "yes",
        )
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as error:
        if "tls" in str(error).lower():
            pytest.skip(f"this redis-server was built without TLS: {error}")
        raise
    try:
        yield directory, tls_port
    finally:
        server.close()
        shutil.rmtree(directory, ignore_errors=True)


async def _pings(url: str) -> bool:
    client = RedisClient.from_url(url, connect_timeout_s=2.0, command_timeout_s=2.0)
    try:
        return bool(await client.execute("PING") == b"PONG")
    finally:
        await client.close()


async def test_tls_options_change_verification(tls_files: tuple[Path, int]) -> None:
    directory, port = tls_files
    ca = f"ssl_ca_certs={directory / 'ca.crt'}"
    cert = f"ssl_certfile={directory / 'client.crt'}&ssl_keyfile={directory / 'client.key'}"
    # The CA verifies the server; the client certificate satisfies the server.
    assert await _pings(f"rediss://localhost:{port}?{ca}&{cert}")
    # Without a client certificate the server refuses the handshake.
    refused = r"CERTIFICATE_REQUIRED|cannot connect|reset by peer"
    with pytest.raises(RedisClientError, match=refused):
        await _pings(f"rediss://localhost:{port}?{ca}")
    # Without the CA the server's certificate fails verification...
    with pytest.raises(RedisClientError, match="CERTIFICATE_VERIFY_FAILED"):
        await _pings(f"rediss://localhost:{port}?{cert}")
    with pytest.raises(RedisClientError, match="CERTIFICATE_VERIFY_FAILED"):
        await _pings(f"rediss://localhost:{port}?ssl_cert_reqs=optional&{cert}")
    # ...unless verification is switched off.
    assert await _pings(f"rediss://localhost:{port}?ssl_cert_reqs=none&{cert}")
    # The certificate names localhost, not 127.0.0.1: the host name check fails...
    with pytest.raises(RedisClientError, match="CERTIFICATE_VERIFY_FAILED"):
        await _pings(f"rediss://127.0.0.1:{port}?{ca}&{cert}")
    # ...unless it is switched off (the chain is still verified).
    assert await _pings(f"rediss://127.0.0.1:{port}?{ca}&{cert}&ssl_check_hostname=false")


def test_each_client_takes_its_address_or_a_url_and_names_both_otherwise() -> None:
    # A URL str is parsed into the client's own address type.
    assert RedisClient("redis://h:7000/2").address == parse_url("redis://h:7000/2")
    assert SentinelClient("redis+sentinel://s:26380/svc").address == parse_sentinel_url(
        "redis+sentinel://s:26380/svc"
    )
    assert ClusterClient("redis+cluster://a:7000").address == parse_cluster_url(
        "redis+cluster://a:7000"
    )
    # An address of the right type is kept as given.
    address = parse_url("redis://h:7000")
    assert RedisClient(address).address is address
    # Anything else (another client's address too) is a TypeError naming both forms.
    with pytest.raises(TypeError) as raised:
        RedisClient(6379)  # type: ignore[arg-type]
    assert str(raised.value) == "address must be a RedisAddress or a URL str, got int"
    with pytest.raises(TypeError) as raised:
        SentinelClient(address)  # type: ignore[arg-type]
    assert str(raised.value) == ("address must be a SentinelAddress or a URL str, got RedisAddress")
    with pytest.raises(TypeError) as raised:
        ClusterClient(None)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "address must be a ClusterAddress or a cluster URL str, got NoneType"
    )
    # A bad URL is still parse_url's ValueError.
    with pytest.raises(ValueError, match="unsupported scheme http://"):
        RedisClient("http://h")
