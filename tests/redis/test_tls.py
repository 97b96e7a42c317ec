"""Bursts over TLS: every reply reaches its caller, and Redis charges exactly what was admitted.

asyncio's TLS layer reads several TLS records into the buffer a
BufferedProtocol hands it; these tests make the replies of one read span many
records (a burst of checks re-sent after SCRIPT FLUSH, large ECHOs) and check that no
byte is lost: exactly ``limit`` admitted, exactly ``limit`` charged (read back
from Redis), no error. Rates are per day so that no window boundary falls
inside a burst.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from batching_helpers import EXACT_N_CHECKS, exact_n_admitted
from cluster import RedisCluster, call, identities_per_shard, report, script_calls_in
from redis_servers import RedisServer, TlsFiles, make_tls_files
from skips import skip_without_tls

from moderato import RateLimiter
from moderato.policy import SCALE
from moderato.redis import RedisClient
from moderato.redis.blocking import RedisClient as BlockingRedisClient
from moderato.redis.connection import CommandNotSentError
from moderato.sync import RateLimiter as BlockingRateLimiter

BURST = 200
LIMIT = 100
RATE = f"{LIMIT}/day"


@pytest.fixture(scope="module")
def tls_files() -> Iterator[TlsFiles]:
    directory = Path(tempfile.mkdtemp(prefix="moderato-tls-"))
    try:
        try:
            files = make_tls_files(directory)
        except RuntimeError as error:
            pytest.skip(str(error))
        yield files
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_only_server(tls_files: TlsFiles) -> Iterator[RedisServer]:
    """A redis-server listening on a TLS port only (no plain-text port at all)."""
    server = skip_without_tls(RedisServer(tls=tls_files).start)
    try:
        yield server
    finally:
        server.close()


def admitted(outcomes: list[Any]) -> int:
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert errors == [], f"{len(errors)} checks failed, first: {errors[0]!r}"
    return sum(1 for outcome in outcomes if outcome.allowed)


async def charged_units(execute: Any, prefix: str) -> dict[bytes, int]:
    """{fixed window counter key: units charged} for every counter under ``prefix``."""
    keys = await execute("KEYS", f"{prefix}:fw:*")
    return {key: int(await execute("GET", key)) // SCALE for key in keys}


async def test_burst_after_script_flush_over_tls(tls_only_server: RedisServer) -> None:
    assert tls_only_server.tls is not None
    context = tls_only_server.tls.client_context()
    limiter = RateLimiter(
        tls_only_server.url, key_prefix="tlsburst", ssl_context=context, command_timeout_s=10
    )
    admin = RedisClient.from_url(tls_only_server.url, ssl_context=context)
    try:
        await admin.execute("FLUSHALL")
        for round_number in range(3):
            # A cold script cache: every EVALSHA of the burst is answered NOSCRIPT
            # and re-sent behind one SCRIPT LOAD; the replies of both rounds come
            # back in many TLS records.
            assert await admin.execute("SCRIPT", "FLUSH") == b"OK"
            assert await admin.execute("CONFIG", "RESETSTAT") == b"OK"
            key = f"k{round_number}"
            outcomes = await asyncio.gather(
                *(limiter.check_with_info(key, RATE) for _ in range(BURST)),
                return_exceptions=True,
            )
            assert admitted(outcomes) == LIMIT
            stats = (await admin.execute("INFO", "commandstats")).decode()
            assert f"cmdstat_evalsha:calls={2 * BURST}," in stats
            assert "cmdstat_script|load:calls=1," in stats
            assert "cmdstat_eval:" not in stats
        charged = await charged_units(admin.execute, "tlsburst")
        assert sorted(charged.values()) == [LIMIT, LIMIT, LIMIT]
        report(f"TLS single node: 3 bursts of {BURST} after SCRIPT FLUSH, {LIMIT} admitted "
               f"and {LIMIT} charged each")  # fmt: skip
    finally:
        await limiter.close()
        await admin.close()


async def test_large_replies_over_tls_arrive_whole(tls_only_server: RedisServer) -> None:
    """Replies far larger than one TLS record (16 KiB) and than the read buffer (64 KiB)."""
    assert tls_only_server.tls is not None
    # A generous timeout: this is about whole replies, not speed (3.5 MB on a loaded host).
    client = RedisClient.from_url(
        tls_only_server.url,
        ssl_context=tls_only_server.tls.client_context(),
        command_timeout_s=10.0,
    )
    try:
        values = [bytes([65 + i % 26]) * (1000 + 37 * i) for i in range(400)]
        replies = await asyncio.gather(*(client.execute("ECHO", value) for value in values))
        assert replies == values
        big = b"x" * 300_000
        assert await client.execute("ECHO", big) == big
    finally:
        await client.close()


def test_blocking_client_over_tls_from_threads(tls_only_server: RedisServer) -> None:
    """The blocking client: TLS set by the URL's options, replies of many records, threads."""
    assert tls_only_server.tls is not None
    ca_file = tls_only_server.tls.ca_file
    client = BlockingRedisClient.from_url(
        f"{tls_only_server.url}?ssl_ca_certs={ca_file}&client_name=sync-tls",
        command_timeout_s=10.0,
        max_connections=4,
    )
    values = [bytes([65 + i % 26]) * (1000 + 37 * i) for i in range(400)]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda value: client.execute("ECHO", value), values)) == values
    big = b"x" * 300_000
    assert client.execute("ECHO", big) == big
    assert client.execute("CLIENT", "GETNAME") == b"sync-tls"
    assert client.open_connections <= 4
    client.close()
    unverified = BlockingRedisClient.from_url(tls_only_server.url, connect_timeout_s=2.0)
    with pytest.raises(CommandNotSentError, match="CERTIFICATE_VERIFY_FAILED"):
        unverified.execute("PING")


def test_blocking_limiter_bursts_after_script_flush_over_tls(tls_only_server: RedisServer) -> None:
    """16 threads, 3 bursts of 200 checks after SCRIPT FLUSH: 100 admitted and charged each."""
    assert tls_only_server.tls is not None
    context = tls_only_server.tls.client_context()
    limiter = BlockingRateLimiter(
        tls_only_server.url,
        key_prefix="synctls",
        ssl_context=context,
        max_connections=8,
        command_timeout_s=10,
    )
    admin = BlockingRedisClient.from_url(tls_only_server.url, ssl_context=context)
    try:
        for round_number in range(3):
            assert admin.execute("SCRIPT", "FLUSH") == b"OK"
            assert admin.execute("CONFIG", "RESETSTAT") == b"OK"
            keys = [f"k{round_number}"] * BURST
            with ThreadPoolExecutor(16) as pool:
                outcomes = list(pool.map(lambda key: limiter.check_with_info(key, RATE), keys))
            assert sum(outcome.allowed for outcome in outcomes) == LIMIT
            stats = admin.execute("INFO", "commandstats").decode()
            loads = int(stats.split("cmdstat_script|load:calls=")[1].split(",")[0])
            assert 1 <= loads <= 8  # one per connection that met NOSCRIPT
            assert f"cmdstat_evalsha:calls={BURST + loads}," in stats
            assert "cmdstat_eval:" not in stats
        keys = admin.execute("KEYS", "synctls:fw:*")
        charged = sorted(int(admin.execute("GET", key)) // SCALE for key in keys)
        assert charged == [LIMIT, LIMIT, LIMIT]
    finally:
        limiter.close()
        admin.close()


def test_four_processes_of_125_tasks_batching_over_tls_admit_exactly_the_limit(
    tls_only_server: RedisServer,
) -> None:
    """Issue 30's exact-N test over TLS: every algorithm, 4 processes x 125 tasks on one
    key, batching on from the rediss:// URL (``?batch_decisions=true``, the CA from
    ``ssl_ca_certs``): exactly the limit admitted, in far fewer calls than checks."""
    assert tls_only_server.tls is not None
    context = tls_only_server.tls.client_context()
    admin = BlockingRedisClient.from_url(tls_only_server.url, ssl_context=context)
    try:
        admin.execute("FLUSHALL")
        admin.execute("CONFIG", "RESETSTAT")
        url = f"{tls_only_server.url}?ssl_ca_certs={tls_only_server.tls.ca_file}"
        totals = exact_n_admitted(
            f"{url}&batch_decisions=true", "tlsgrouped", "100/minute", batch=False
        )
        # The checks went batched: far fewer calls than checks (warm-ups a call each).
        sent = script_calls_in(admin.execute("INFO", "commandstats").decode())["evalsha"][0]
        report(f"TLS single node, batching on: {EXACT_N_CHECKS} checks from 4 processes, "
               f"{totals} admitted, {sent} EVALSHA")  # fmt: skip
        assert sent < EXACT_N_CHECKS / 2
    finally:
        admin.close()


@pytest.fixture(scope="module")
def tls_cluster(tls_files: TlsFiles) -> Iterator[RedisCluster]:
    cluster = skip_without_tls(RedisCluster(tls=tls_files).start)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
async def test_burst_after_script_flush_on_a_tls_cluster(
    tls_cluster: RedisCluster, tls_files: TlsFiles
) -> None:
    identities = [names[0] for names in identities_per_shard(tls_cluster.shards(), 1).values()]
    context = tls_files.client_context()
    limiter = RateLimiter(
        tls_cluster.url, key_prefix="tlsclu", ssl_context=context, command_timeout_s=10
    )
    try:
        for shard in tls_cluster.shards():
            assert call(shard.primary, "SCRIPT", "FLUSH") == b"OK"
        outcomes = await asyncio.gather(
            *(limiter.check_with_info(identity, RATE) for identity in identities * BURST),
            return_exceptions=True,
        )
        assert admitted(outcomes) == LIMIT * len(identities)
        charged: dict[bytes, int] = {}
        for shard in tls_cluster.shards():

            async def on_primary(*args: Any, port: int = shard.primary) -> Any:
                return call(port, *args)

            charged.update(await charged_units(on_primary, "tlsclu"))
        assert sorted(charged.values()) == [LIMIT] * len(identities)
        report(f"TLS cluster: {BURST} checks on each of {len(identities)} shards after SCRIPT "
               f"FLUSH, {LIMIT} admitted and {LIMIT} charged per shard")  # fmt: skip
    finally:
        await limiter.close()
