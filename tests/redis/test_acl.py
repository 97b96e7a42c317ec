"""The minimal Redis ACL moderato needs, on a single server and on a cluster.

The commands are derived from the Lua scripts (every ``redis.call``,
``redis.pcall``, their locals ``redis_call`` and ``redis_pcall``, and ``read`` of a
command name) plus the few the client and
``reset()`` send itself, in ``CLIENT_COMMANDS`` and the constants below: when
a script starts calling another command, the derivation picks it up and
``test_the_documented_acl_is_the_derived_one`` says what docs/operations.md
must add. Without a permission, the error names NOPERM and the command.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from batching_helpers import repeats_per_call
from cluster import RedisCluster, call, identity_slot, script_calls
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer, running

from moderato import BackendError, BackendUnavailableError, CheckResult, RateLimiter
from moderato.algorithms import ALGORITHMS, DEFAULT_ALGORITHM

ROOT = Path(__file__).resolve().parents[2]
LUA_DIR = ROOT / "lua"
PREFIX = "aclapp"
USER, PASSWORD = "limiter", "acl-test-secret"

# What the client sends besides the scripts' own calls: the scripts themselves
# (SCRIPT LOAD after a NOSCRIPT, EVAL should that load fail), and reset()
# without a rate (SCAN + UNLINK).
CLIENT_COMMANDS = ("evalsha", "script|load", "eval")
RESET_SCAN_COMMANDS = ("scan", "unlink")
# Only on a Redis Cluster: the slot map, and following ASK during a migration.
CLUSTER_COMMANDS = ("cluster|shards", "cluster|countkeysinslot", "asking")

_CALL = re.compile(r"""(?:redis[._]p?call|\bread)\(\s*['"]([A-Za-z]+)['"]""")


def script_commands() -> list[str]:
    """Every command the Lua scripts call, lower-case, in first-seen order."""
    found: dict[str, None] = {}
    for path in sorted(LUA_DIR.glob("*.lua")):
        for name in _CALL.findall(path.read_text()):
            found[name.lower()] = None
    return list(found)


def needed_commands(*, cluster: bool = False) -> list[str]:
    commands = [*CLIENT_COMMANDS, *script_commands(), *RESET_SCAN_COMMANDS]
    return [*commands, *CLUSTER_COMMANDS] if cluster else commands


def acl_rules(commands: list[str]) -> list[str]:
    return ["on", f">{PASSWORD}", "resetkeys", "-@all", *(f"+{c}" for c in commands),
            f"~{PREFIX}:*"]  # fmt: skip


def test_the_documented_acl_is_the_derived_one() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    single = re.search(r"`(-@all [^`]*~<key_prefix>:\*)`", docs)
    assert single is not None, "docs/operations.md lost its ACL line"
    documented = [word[1:] for word in single.group(1).split() if word.startswith("+")]
    assert sorted(documented) == sorted(needed_commands())
    for extra in (*CLUSTER_COMMANDS, "client|setname", "select"):
        assert f"+{extra}" in docs


async def exercise_everything(limiter: RateLimiter, identity: str) -> None:
    """Every algorithm (check, usage, reset with a rate), then reset without one: exact."""
    for name in ALGORITHMS:
        outcomes = [
            await limiter.check_with_info(identity, "3/day", algorithm=name) for _ in range(5)
        ]
        assert [o.allowed for o in outcomes] == [True, True, True, False, False], name
        usage = await limiter.get_usage(identity, "3/day", algorithm=name)
        assert (usage["current"], usage["remaining"]) == (3, 0), name
        assert await limiter.reset(identity, rate="3/day", algorithm=name) >= 1, name
        assert (await limiter.check_with_info(identity, "3/day", algorithm=name)).remaining == 2
    # Every algorithm charged once more above (one key each); reset() without a
    # rate finds them by SCAN.
    assert await limiter.reset(identity) == len(ALGORITHMS)
    for name in ALGORITHMS:
        assert (await limiter.get_usage(identity, "3/day", algorithm=name))["current"] == 0


# -- a single server ---------------------------------------------------------------


def set_user(server: RedisServer, commands: list[str]) -> None:
    server.command("ACL", "DELUSER", USER)
    reply = server.command("ACL", "SETUSER", USER, *acl_rules(commands))
    assert reply == b"+OK\r\n", reply


def user_url(port: int, path: str = "") -> str:
    return f"redis://{USER}:{PASSWORD}@127.0.0.1:{port}{path}"


async def test_minimal_acl_is_enough_on_a_single_server(own_redis_server: RedisServer) -> None:
    set_user(own_redis_server, needed_commands())
    limiter = RateLimiter(user_url(own_redis_server.port), key_prefix=PREFIX)
    try:
        await exercise_everything(limiter, "alice")
        assert own_redis_server.command("SCRIPT", "FLUSH") == b"+OK\r\n"  # EVAL path too
        assert (await limiter.check_with_info("bob", "3/day")).remaining == 2
    finally:
        await limiter.close()


@pytest.mark.parametrize(
    ("missing", "operation", "expected"),
    [
        ("evalsha", "check", r"NOPERM.*'evalsha'"),
        ("hmget", "gcra", r"NOPERM: the Redis user may not run a command the gcra script needs"),
        ("incrby", "check", r"NOPERM: the Redis user may not run a command the fixed_window"),
        ("scan", "reset", r"NOPERM.*'scan'"),
    ],
)
async def test_a_missing_permission_is_reported_as_noperm(
    own_redis_server: RedisServer, missing: str, operation: str, expected: str
) -> None:
    set_user(own_redis_server, [c for c in needed_commands() if c != missing])
    limiter = RateLimiter(user_url(own_redis_server.port), key_prefix=PREFIX)
    try:
        with pytest.raises(BackendError, match=expected):
            if operation == "reset":
                await limiter.reset("carol")
            elif operation == "gcra":
                await limiter.check_with_info("carol", "3/day", algorithm="gcra")
            else:
                await limiter.check_with_info("carol", "3/day")
    finally:
        await limiter.close()


# Kept alive: moderato.metrics caches collectors by the registry's id.
_REGISTRIES: list[CollectorRegistry] = []


@pytest.mark.parametrize("fail_open", [False, True])
async def test_a_missing_permission_fails_only_the_checks_that_need_it(
    own_redis_server: RedisServer, fail_open: bool
) -> None:
    """Without +zadd the sliding log cannot admit; every other algorithm must not notice.

    An error reply is an answer: each sliding-log check reports NOPERM itself
    (or, failing open, is let through and counted), the circuit breaker stays
    closed, and the other algorithms' checks, before, after and among them,
    are decided exactly.
    """
    set_user(own_redis_server, [c for c in needed_commands() if c != "zadd"])
    registry = CollectorRegistry()
    _REGISTRIES.append(registry)
    limiter = RateLimiter(
        user_url(own_redis_server.port),
        key_prefix=PREFIX,
        fail_open=fail_open,
        enable_metrics=True,
        metrics_registry=registry,
        breaker_failures=2,
    )
    others = [name for name in ALGORITHMS if name != "sliding_log"]
    rounds = 10

    async def at_once(algorithms: list[str]) -> list[Any]:
        return await asyncio.gather(
            *(limiter.check_with_info("henry", "5/day", algorithm=name) for name in algorithms),
            return_exceptions=True,
        )

    def reported(log: list[Any]) -> None:
        if fail_open:
            assert all(isinstance(o, CheckResult) and o.bypassed for o in log), log
        else:
            assert all(isinstance(o, BackendError) for o in log), log
            assert all(not isinstance(o, BackendUnavailableError) for o in log), log
            assert all(re.match(r"NOPERM: .* the sliding_log script needs", str(o)) for o in log)

    try:
        for number in range(rounds):
            # Ten sliding-log checks at once (more than breaker_failures), then the others.
            reported(await at_once(["sliding_log"] * 10))
            rest = await at_once(others)
            # Five admissions per algorithm, then denials: never an error, never a bypass.
            assert [(o.allowed, o.bypassed) for o in rest] == [(number < 5, False)] * len(others)
        reported(await at_once(["sliding_log"] * 10))
        assert limiter.breaker.state == "closed"
        assert registry.get_sample_value("moderato_circuit_breaker_state") == 0
        bypassed = registry.get_sample_value(
            "moderato_fail_open_total", {"algorithm": "sliding_log"}
        )
        assert (bypassed or 0) == (10 * (rounds + 1) if fail_open else 0)
        short_circuited = registry.get_sample_value(
            "moderato_backend_operations_total",
            {"operation": "decide", "status": "short_circuited"},
        )
        assert (short_circuited or 0) == 0
    finally:
        await limiter.close()


@pytest.mark.parametrize("batched", [False, True], ids=["a-call-a-check", "batched"])
async def test_without_script_load_a_flushed_cache_is_repaired_by_one_eval(
    own_redis_server: RedisServer, batched: bool
) -> None:
    """An ACL that predates ``+script|load``: the load is refused, so the calls
    behind it meet NOSCRIPT again; the first of them carries the source (EVAL)
    and the others follow it by SHA1. Every check is decided, exactly once.
    (Batched: the same for the batched calls, fewer of them.)"""
    port = own_redis_server.port
    set_user(own_redis_server, [c for c in needed_commands() if c != "script|load"])
    limiter = RateLimiter(user_url(port), key_prefix=PREFIX, command_timeout_s=10)
    limiter.backend.client.batch_decisions = batched  # type: ignore[attr-defined]
    burst, limit = 200, 100
    try:
        assert (await limiter.check_with_info("warm-up", "1/day")).allowed
        assert own_redis_server.command("SCRIPT", "FLUSH") == b"+OK\r\n"
        assert own_redis_server.command("CONFIG", "RESETSTAT") == b"+OK\r\n"
        outcomes = await asyncio.gather(
            *(limiter.check_with_info("frank", f"{limit}/day") for _ in range(burst))
        )
        assert sum(o.allowed for o in outcomes) == limit
        stats = script_calls(port)
        assert (await limiter.get_usage("frank", f"{limit}/day"))["current"] == limit
        # Sent, answered NOSCRIPT; re-sent behind the refused load, NOSCRIPT again;
        # then one EVAL and the rest by SHA1 behind it.
        # One identity's checks: each after the first repeats the one before.
        calls = math.ceil(burst / repeats_per_call(DEFAULT_ALGORITHM)) if batched else burst
        assert stats["evalsha"] == (3 * calls - 1, 2 * calls)
        assert stats["eval"] == (1, 0)
        assert stats["script|load"] == (0, 0)
    finally:
        await limiter.close()


async def test_client_name_and_a_database_need_their_commands(
    own_redis_server: RedisServer,
) -> None:
    set_user(own_redis_server, needed_commands())
    for path, command in (("?client_name=api", "client|setname"), ("/2", "select")):
        limiter = RateLimiter(user_url(own_redis_server.port, path), key_prefix=PREFIX)
        with pytest.raises(BackendError, match=rf"NOPERM.*'{re.escape(command)}'"):
            await limiter.connect()
        await limiter.close()
    set_user(own_redis_server, [*needed_commands(), "client|setname", "select"])
    limiter = RateLimiter(user_url(own_redis_server.port, "/2?client_name=api"), key_prefix=PREFIX)
    try:
        assert (await limiter.check_with_info("dave", "3/day")).remaining == 2
    finally:
        await limiter.close()


# -- a cluster ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_cluster() -> Iterator[RedisCluster]:
    yield from running(RedisCluster())


def set_cluster_user(cluster: RedisCluster, commands: list[str]) -> None:
    # ACL users are per node: a cluster has no shared user table.
    for server in cluster.alive():
        call(server.port, "ACL", "DELUSER", USER)
        call(server.port, "ACL", "SETUSER", USER, *acl_rules(commands))


def cluster_user_url(cluster: RedisCluster) -> str:
    seeds = ",".join(f"127.0.0.1:{s.port}" for s in cluster.servers[:2])
    return f"redis+cluster://{USER}:{PASSWORD}@{seeds}"


@pytest.mark.slow
async def test_minimal_acl_is_enough_on_a_cluster(acl_cluster: RedisCluster) -> None:
    set_cluster_user(acl_cluster, needed_commands(cluster=True))
    limiter = RateLimiter(cluster_user_url(acl_cluster), key_prefix=PREFIX)
    try:
        await exercise_everything(limiter, "erin")
    finally:
        await limiter.close()


async def check_during_migration(cluster: RedisCluster, identity: str, drained: bool) -> None:
    """A check on a slot being migrated (its keys moved already if ``drained``)."""
    limiter = RateLimiter(cluster_user_url(cluster), key_prefix=PREFIX, command_timeout_s=0.5)
    slot = identity_slot(identity)
    try:
        assert (await limiter.check_with_info(identity, "3/day")).remaining == 2
        source = cluster.owner(slot)
        target = next(s.primary for s in cluster.shards() if s.primary != source)
        cluster.begin_migration(slot, source, target)
        try:
            if drained:
                cluster.move_keys(slot, source, target)
            # The keys are on the target once drained: the count goes on there.
            assert (await limiter.check_with_info(identity, "3/day")).remaining == 1
        finally:
            if not drained:
                cluster.move_keys(slot, source, target)
            cluster.end_migration(slot, source, target)
            await asyncio.to_thread(cluster.wait_ok)
    finally:
        await limiter.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("missing", "drained", "expected"),
    [
        (None, True, None),
        ("asking", True, r"NOPERM.*'asking'"),
        ("cluster|countkeysinslot", False, r"NOPERM.*'cluster\|countkeysinslot'"),
    ],
)
async def test_following_ask_needs_asking_and_countkeysinslot(
    acl_cluster: RedisCluster, missing: str | None, drained: bool, expected: str | None
) -> None:
    commands = [c for c in needed_commands(cluster=True) if c != missing]
    set_cluster_user(acl_cluster, commands)
    identity = f"migrating-{missing}"
    if expected is None:
        await check_during_migration(acl_cluster, identity, drained)
        return
    with pytest.raises(BackendError, match=expected):
        await check_during_migration(acl_cluster, identity, drained)


@pytest.mark.slow
async def test_the_slot_map_needs_cluster_shards(acl_cluster: RedisCluster) -> None:
    set_cluster_user(
        acl_cluster, [c for c in needed_commands(cluster=True) if c != "cluster|shards"]
    )
    limiter = RateLimiter(cluster_user_url(acl_cluster), key_prefix=PREFIX)
    try:
        with pytest.raises(BackendError, match=r"NOPERM.*'cluster\|shards'"):
            await limiter.connect()
    finally:
        await limiter.close()
