"""A loop turn's checks joined in C (csrc/grouping.c: moderato._accel.Grouping and its
BatchedReply) against grouping.py's group_checks and BatchedReply, the reference.

The same turns go through both and must leave the same: the write buffer (byte for
byte), the records in _scripts (numbers, scripts, keys, arguments with their types,
re-sends), the slots in _pending, the loads and the loaded forms. Random turns on a
connection's attributes alone (no socket: the joining reads and writes only those),
then the outcomes each check's future gets from the same replies (a flat reply with
refusals, malformed ones, a failure of the whole call, cancelled checks), then turns
of a real client on a real redis-server, each joined both ways (a SCRIPT LOAD queued
before a form's first use, a NOSCRIPT repair after SCRIPT FLUSH, mixed algorithms,
cuts, cancelled checks, a batch failed whole).
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sys
import weakref
from collections import deque
from typing import Any

import pytest
from batching_helpers import ARGS, Compared, calls, join_both
from connection_reference import ReferenceCore
from redis_servers import RedisServer

from moderato import _accel
from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisClient, RedisReplyError
from moderato.redis import connector as connector_module
from moderato.redis._encoding import encode_command, encode_evalsha
from moderato.redis.errors import RedisConnectionError
from moderato.redis.grouping import AloneScript, BatchedReply, _grouping_in_c
from moderato.scripts import MAX_BATCH_ARGUMENT_BYTES, batched_script, load_script

SCRIPTS = [load_script(name) for name in ALGORITHMS]


class Connection:
    """What the joining reads and writes of a connection, and nothing else."""

    def __init__(self, loop: asyncio.AbstractEventLoop, base: int, held: int) -> None:
        self._loop = loop
        self._future_type = asyncio.Future
        self._write_buffer: list[bytes | None] = [b"*1\r\n$4\r\nPING\r\n"] * held
        self._held = held
        self._batched_total = base
        self._scripts: deque[Any] = deque()
        self._pending: deque[Any] = deque(loop.create_future() for _ in range(held))
        self._loads: dict[str, int] = {}
        self._loaded_forms: set[str] = set()


def random_call(rng: random.Random, before: Any) -> tuple[Any, list[Any], list[Any], int]:
    """A script call: a decision script (or another script), keys and arguments close to
    the call before it (so every marker comes up), a re-send now and then."""
    if before is not None and rng.random() < 0.6:
        script, keys, args, _ = before
        keys, args = list(keys), list(args)
        change = rng.choice(
            ["same", "same", "key", "cost", "key and cost", "field", "tuple", "path"]
        )
        if change in ("key", "key and cost"):
            keys = [f"k{rng.randrange(5)}" for _ in keys]
        if change in ("cost", "key and cost") and args:
            args[0] = rng.choice(["1000", "2000", 3000, b"1000", "01000"])
        if change == "field" and len(args) > 1:
            args[1] = rng.choice(["1", "0", 1])
        if change == "path" and len(args) in (4, 5):
            # What decides a repeat's weight: whether the straight-line path takes it.
            at, value = rng.choice(
                [
                    (0, rng.choice(["0", "-1", "100001", 100_000, "1" * 16, "\uff11"])),
                    (2, rng.choice(["9007199254001", "9007199254000", 10**13, b"5000", "x"])),
                    (3, rng.choice(["86400", "86401", 86_400, b"60", "060", "0", -5])),
                    (4, rng.choice(["", b"", "x", 0])),
                ]
            )
            if at == 4:
                args = [*args[:4], value]
            else:
                args[at] = value
        if change == "tuple":
            args = tuple(args)  # type: ignore[assignment]
    else:
        script = rng.choice(
            [*SCRIPTS, *SCRIPTS, load_script("reset"), AloneScript("a" * 40, b"return 1")]
        )
        policies = rng.choice([1, 1, 1, 2, 5, 9])
        keys = [f"k{rng.randrange(5)}" for _ in range(policies)]
        args = ["1000", "1"]
        for i in range(policies):
            args += ["100000", str(60 * (i + 1))]
        if rng.random() < 0.05:
            keys = ["x" * rng.choice([3000, 9000])]
        if rng.random() < 0.03:
            args = []
    return script, keys, args, 1 if rng.random() < 0.05 else 0


def random_turn(seed: int, loop: asyncio.AbstractEventLoop) -> Connection:
    """A connection with a random turn of new commands queued."""
    rng = random.Random(seed)
    # Which checks come unencoded (None: send_script's payload on a joining connection,
    # the flush encodes it unless joined), from a stream of its own.
    unencoded = random.Random(-seed - 1)
    share_unencoded = unencoded.choice([0.0, 0.5, 1.0])
    base = rng.choice([0, 7, 1000])
    connection = Connection(loop, base, rng.choice([0, 0, 2]))
    for number in range(max(0, base - 2), base + 1):
        if number > 0:
            connection._scripts.append((number, SCRIPTS[0], ["old"], ["1"], 0))
    before = None
    hot = rng.random() < 0.3
    for number in range(base + 1, base + 1 + rng.choice([2, 3, 8, 17, 40, 100])):
        future = loop.create_future()
        connection._pending.append(future)
        if rng.random() < 0.1:
            connection._write_buffer.append(encode_command("GET", "k"))
            before = None
            continue
        # A hot turn: mostly the call before again (runs past 16 checks, weighed).
        if hot and before is not None and rng.random() < 0.9:
            call = before
        else:
            call = before = random_call(rng, before)
        script, keys, args, resends = call
        late = resends == 0 and unencoded.random() < share_unencoded
        connection._write_buffer.append(None if late else encode_evalsha(script.sha, keys, args))
        connection._scripts.append((number, script, keys, args, resends))
    for script in SCRIPTS:
        if rng.random() < 0.5:
            connection._loaded_forms.add(batched_script(script.name).sha)
    if rng.random() < 0.2:
        connection._loads[SCRIPTS[0].sha] = base + rng.choice([0, 1])
    return connection


async def test_random_turns_are_joined_the_same() -> None:
    loop = asyncio.get_running_loop()
    joined = batched = loads = 0
    for seed in range(600):
        connection = random_turn(seed, loop)
        new = len(connection._write_buffer) - connection._held
        python, in_c = join_both(connection)
        assert in_c == python, seed
        batches = [slot for slot in in_c["pending"] if slot[0] == "batch"]
        joined += len(in_c["buffer"]) - connection._held < new
        batched += len(batches)
        loads += sum(slot[0] == "load" for slot in in_c["pending"])
    # Every kind of turn came up: joined, with batches and with loads queued.
    assert joined > 300 and batched > 1000 and loads > 100


async def test_checks_queued_unencoded_go_out_as_the_same_bytes() -> None:
    """A turn whose checks came unencoded (None), joined and its leftovers encoded as the
    flush does, writes what the same turn encoded when queued writes: the same cuts at
    the bytes bound (evalsha_size), the same batched calls, the lone checks' EVALSHAs."""
    loop = asyncio.get_running_loop()
    unencoded_turns = 0
    for seed in range(300):
        late = random_turn(seed, loop)
        if None not in late._write_buffer:
            continue
        unencoded_turns += 1
        early = random_turn(seed, loop)
        ReferenceCore._encode_left(early)  # type: ignore[arg-type]
        assert None not in early._write_buffer
        for connection in (late, early):
            _grouping_in_c()(connection)
        ReferenceCore._encode_left(late)  # type: ignore[arg-type]
        assert late._write_buffer == early._write_buffer, seed
        assert [record[0] for record in late._scripts] == [record[0] for record in early._scripts]
        assert len(late._pending) == len(early._pending)
    assert unencoded_turns > 150


async def test_a_turn_cut_at_the_bytes_bound() -> None:
    """Checks of long keys: each batch as large as fits under MAX_BATCH_ARGUMENT_BYTES."""
    loop = asyncio.get_running_loop()
    connection = Connection(loop, 0, 0)
    script = SCRIPTS[0]
    for number in range(1, 11):
        keys, args = [chr(96 + number) * 3000], ARGS[script.name]
        connection._pending.append(loop.create_future())
        connection._write_buffer.append(encode_evalsha(script.sha, keys, args))
        connection._scripts.append((number, script, keys, args, 0))
    python, in_c = join_both(connection)
    assert in_c == python
    sizes = [len(slot[1]) for slot in in_c["pending"] if slot[0] == "batch"]
    assert sizes == [5, 5] and 5 * 3000 < MAX_BATCH_ARGUMENT_BYTES < 6 * 3000


def slots(count: int, loop: asyncio.AbstractEventLoop) -> tuple[Any, list[Any], Any, list[Any]]:
    """A C BatchedReply and a Python one, each over ``count`` futures of its own."""
    connection = Connection(loop, 0, 0)
    script = SCRIPTS[0]
    for number in range(1, count + 1):
        connection._pending.append(loop.create_future())
        payload = encode_evalsha(script.sha, ["k"], ARGS[script.name])
        connection._write_buffer.append(payload)
        connection._scripts.append((number, script, ["k"], ARGS[script.name], 0))
    connection._loaded_forms.add(batched_script(script.name).sha)
    _grouping_in_c()(connection)
    (in_c,) = connection._pending
    assert type(in_c) is _accel.BatchedReply
    futures = [loop.create_future() for _ in range(count)]
    return in_c, in_c._parts, BatchedReply(futures), futures


def outcome(future: Any) -> Any:
    if future.cancelled():
        return "cancelled"
    if not future.done():
        return "pending"
    error = future.exception()
    if error is None:
        return ("result", future.result())
    return (type(error), str(error), error.args)


REFUSAL = RedisReplyError("MODERATO_ARG ARGV[1] (cost_scaled)")
REPLIES: list[Any] = [
    [5, 1, 0, 99000, 0, 7, 5, 1, 0, 98000, 0, 7, 0],
    [5, 1, 0, 99000, 0, 7, REFUSAL, 2, 1, 2],
    [REFUSAL, REFUSAL, REFUSAL],
    [0, 0, 0],
    [5, 1, 0, 99000, 0, 7, 0],  # two parts of three
    [0, 0, 0, 0],  # one too many
    [0, 0, -1],
    [0, 0, 2, 1],  # the last length past the end
    [0, "0", 0],
    [0, True, 0],
    [0, 0, 2**70],
    [0, 0, [1]],
    "OK",
    None,
    (0, 0, 0),
    list(range(400)),
    # A decision as what changed since the decision before (-1 - mask, mask's entries).
    [5, 1, 0, 99000, 0, 7, -5, 98000, -21, 97000, 8],
    [5, 1, 0, 99000, 0, 7, -1, -17, 9],
    [2, 1, 0, -1, -3, 5],
    [-1, -1, -1],  # none before
    [5, 1, 0, 99000, 0, 7, REFUSAL, -1],  # a refusal before
    [2, 1, 0, -5, 7, -1],  # an entry past the decision before's
    [5, 1, 0, 99000, 0, 7, -1, -21, 9],  # an entry short
    [0, 0, -(2**62) - 1],
    [0, 0, -(2**70)],
]


@pytest.mark.parametrize("reply", REPLIES)
@pytest.mark.parametrize("cancelled", [(), (1,), (0, 1, 2)])
async def test_a_reply_is_handed_out_the_same(reply: Any, cancelled: tuple[int, ...]) -> None:
    loop = asyncio.get_running_loop()
    in_c, c_futures, python, py_futures = slots(3, loop)
    for index in cancelled:
        c_futures[index].cancel()
        py_futures[index].cancel()
    assert in_c.done() == python.done() == (len(cancelled) == 3)
    in_c.set_result(reply)
    python.set_result(reply)
    assert in_c.done() and python.done()
    assert [outcome(f) for f in c_futures] == [outcome(f) for f in py_futures]
    # A refusal is the entry itself, a list a fresh one.
    for c_future, py_future in zip(c_futures, py_futures):
        if not c_future.cancelled() and type(c_future.exception()) is RedisReplyError:
            assert c_future.exception() is py_future.exception() is REFUSAL


@pytest.mark.parametrize(
    "error", [RedisConnectionError("lost"), RedisReplyError("OOM no memory"), TimeoutError()]
)
async def test_a_failure_of_the_whole_call_is_each_checks_own_copy(error: Exception) -> None:
    loop = asyncio.get_running_loop()
    in_c, c_futures, python, py_futures = slots(4, loop)
    c_futures[2].cancel()
    py_futures[2].cancel()
    in_c.set_exception(error)
    python.set_exception(error)
    assert [outcome(f) for f in c_futures] == [outcome(f) for f in py_futures]
    errors = [f.exception() for f in c_futures if not f.cancelled()]
    assert len({id(e) for e in errors}) == 3 and error not in errors
    # Answered once: a late reply only frees the slot.
    in_c.set_result([0, 0, 0, 0])
    assert [outcome(f) for f in c_futures] == [outcome(f) for f in py_futures]


async def test_a_reply_nobody_waits_for() -> None:
    loop = asyncio.get_running_loop()
    in_c, c_futures, _, _ = slots(2, loop)
    for future in c_futures:
        future.cancel()
    assert in_c.done()
    in_c.set_result([0, 0])
    with pytest.raises(TypeError):
        type(in_c)()


# -- a real client's turns, joined both ways -------------------------------------------


@pytest.fixture(params=["c", "python"], ids=["core-c", "core-python"])
def compared(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Compared:
    """Each turn joined both ways (the C joining's sent), with the connection's steps in
    C and in Python."""
    if request.param == "python":
        from connection_reference import ReferenceConnection

        monkeypatch.setattr(connector_module, "RedisConnection", ReferenceConnection)
    joinings = Compared()
    monkeypatch.setattr(RedisClient, "_grouping", staticmethod(joinings.for_client))
    return joinings


@pytest.fixture
def server(redis_server: RedisServer) -> RedisServer:
    redis_server.command("FLUSHALL")
    redis_server.command("SCRIPT", "FLUSH")
    redis_server.command("CONFIG", "RESETSTAT")
    return redis_server


async def test_turns_of_a_client(server: RedisServer, compared: Compared) -> None:
    fixed, gcra = load_script("fixed_window"), load_script("gcra")
    client = RedisClient.from_url(server.url, batch_decisions=True)
    try:
        await client.execute("PING")  # ready: a turn queued while connecting is not joined
        # Nothing cached: each form loaded before its first use, the lone check
        # answered NOSCRIPT and re-sent behind a load of its script.
        first = await asyncio.gather(
            *(client.evalsha(fixed, ["a"], ARGS["fixed_window"]) for _ in range(20)),
            *(client.evalsha(gcra, [f"g{i}"], ARGS["gcra"]) for i in range(5)),
            client.execute("DBSIZE"),
            client.evalsha(fixed, ["a"], ARGS["fixed_window"]),
        )
        assert [reply[2] for reply in first[:20]] == [99_000 - 1000 * i for i in range(20)]
        assert [reply[2] for reply in first[20:25]] == [99_000] * 5
        assert first[25] == 6  # the window's counter and five GCRA states
        assert first[26][2] == 79_000
        assert calls(server, "script|load") == 3
        # The cache flushed: the batches answered NOSCRIPT and repaired, in order.
        server.command("SCRIPT", "FLUSH")
        bad = ["x", *ARGS["fixed_window"][1:]]
        tasks = [
            asyncio.ensure_future(client.evalsha(fixed, ["a"], args))
            for args in [ARGS["fixed_window"]] * 6 + [bad] + [ARGS["fixed_window"]] * 30
        ]
        tasks[3].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(outcomes[3], asyncio.CancelledError)
        assert isinstance(outcomes[6], RedisReplyError)
        # The cancelled check was sent (and decided), its reply only freed its slot.
        remaining = [o[2] for i, o in enumerate(outcomes) if i not in (3, 6)]
        assert remaining == [78_000 - 1000 * i for i in range(36) if i != 3]
        # A batch failed whole: the server busy past the timeout.
        slow = RedisClient.from_url(server.url, batch_decisions=True, command_timeout_s=0.2)
        try:
            await slow.execute("PING")
            server.command("CLIENT", "PAUSE", "400", "WRITE")
            failed = await asyncio.gather(
                *(slow.evalsha(fixed, ["b"], ARGS["fixed_window"]) for _ in range(4)),
                return_exceptions=True,
            )
            assert [type(error) for error in failed] == [RedisConnectionError] * 4
            assert len({id(error) for error in failed}) == 4
        finally:
            await slow.close()
        assert compared.turns >= 4
    finally:
        await client.close()


# -- leaks -----------------------------------------------------------------------------


def test_the_collector_sees_every_reference() -> None:
    """Grouping's traverse and clear come from one member list: the collector sees
    each reference it holds (its tables, callables, error types, its type), and a
    cycle through it is freed. The names it reads and the ("loop",) keyword tuple are
    its module's (connection_core.h's CORE_NAMES, the ConnectionCore's too), which
    the module's traverse shows."""
    forms: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    callables = [lambda future: None, lambda value: value]
    grouping = _accel.Grouping(
        forms, parts, 10, 1000, *callables, RedisConnectionError, RedisReplyError
    )
    referents = gc.get_referents(grouping)
    for held in (forms, parts, *callables, RedisConnectionError, RedisReplyError):
        assert any(referent is held for referent in referents)
    assert type(grouping) in referents
    held_by_module = gc.get_referents(_accel)
    assert ("loop",) in held_by_module
    assert {"sha", "_write_buffer", "KC"} <= {name for name in held_by_module if type(name) is str}
    marker = Marker()
    freed = weakref.ref(marker)
    forms["self"], forms["marker"] = grouping, marker  # a cycle only the collector frees
    del forms, grouping, referents, marker
    gc.collect()
    assert freed() is None


class Marker:
    """An object whose weak reference tells when the cycle holding it is freed."""


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
async def test_no_leaks() -> None:
    """Turns joined in C and their replies handed out, thousands of times: the
    reference counts of what they share (the scripts, their batched forms, a refusal
    entry) do not move, and the process's memory does not grow."""
    loop = asyncio.get_running_loop()
    grouping = _grouping_in_c()
    forms = [batched_script(script.name) for script in SCRIPTS]
    shared: list[Any] = [*SCRIPTS, *forms, REFUSAL, grouping]

    def turns(times: int) -> None:
        for seed in range(times):
            connection = random_turn(seed % 200, loop)
            grouping(connection)
            for slot in connection._pending:
                if type(slot) is _accel.BatchedReply:
                    count = len(slot._parts)
                    if seed % 4 == 0:
                        slot.set_exception(RedisConnectionError("lost"))
                    elif seed % 4 == 1:
                        slot.set_result([REFUSAL] + [2, 1, 0] * (count - 1))
                    elif seed % 4 == 2:
                        slot.set_result([2, 1, 0] + [-3, 5] * (count - 1))
                    else:
                        slot.set_result([0])  # malformed
                    assert slot.done()
                    for part in slot._parts:
                        part.exception()  # retrieved: asyncio logs none
            connection._pending.clear()
        gc.collect()

    turns(400)
    refcounts = [sys.getrefcount(value) for value in shared]
    rss_before = rss_bytes()
    turns(4000)
    grown = [sys.getrefcount(value) for value in shared]
    assert grown == refcounts
    assert rss_bytes() - rss_before < 2 << 20
