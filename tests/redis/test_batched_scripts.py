"""The batched decision scripts (moderato.scripts.batched_script) against the scripts alone.

Random sequences of checks (several identities, repeated ones, one or two policies, peeks,
costs past the capacity, bursts and custom rates where the algorithm takes them, bad
arguments) are sent twice on one Redis at the same test-clock instants (tests/lua_harness.py
gives both the clock key in place of TIME): once a call each, in order, and once as batches
of up to MAX_BATCH_PARTS, in the layout the client sends (moderato.redis.grouping's
batch_layout: a part as the part before it sent as a marker), or every part in full. Every
reply (decision or refusal), each cut out of the batch's flat reply as the client does
(split_reply), and, after every batch, every key's DUMP and expiry must be equal.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Optional, Union

import pytest
import pytest_asyncio
from lua_calls import SUFFIXES, policy, script_args
from lua_harness import CLOCK_LINE, TIME_LINE, ClockedScript, LuaHarness, open_harness
from redis_servers import RedisServer

from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisReplyError
from moderato.redis.grouping import batch_layout, split_reply
from moderato.scripts import (
    BATCH_PART_UNITS,
    MAX_BATCH_PARTS,
    MAX_BATCH_UNITS,
    _with_includes,
    batched_script,
    load_script,
    scripts_dir,
    without_comments,
)

Part = tuple[list[str], list[str]]
Outcome = Union[list[Any], tuple[str, str]]
History = list[tuple[list[Outcome], dict[str, tuple[bytes, int]]]]
"""Each turn's outcomes and every key's DUMP and expiry after it."""

BURSTS = {"token_bucket", "leaky_bucket", "gcra"}


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def clocked_batch(name: str) -> ClockedScript:
    source = batched_script(name).source
    assert source.count(TIME_LINE) == 1 and source.count(b"redis.call('TIME')") == 1
    test_source = source.replace(TIME_LINE, CLOCK_LINE)
    return ClockedScript(f"batch({name})", test_source, hashlib.sha1(test_source).hexdigest())


def full_call(parts: Sequence[Part]) -> tuple[list[str], list[str]]:
    """A batch with every part in full (its key count, argument count, arguments)."""
    keys = [key for part_keys, _ in parts for key in part_keys]
    args = [str(len(parts))]
    for part_keys, part_args in parts:
        args += [str(len(part_keys)), str(len(part_args)), *part_args]
    return keys, args


def client_call(parts: Sequence[Part]) -> tuple[list[Any], list[Any]]:
    """A batch as the client sends it (grouping's encoder: markers where they apply)."""
    return batch_layout(parts)


Layout = Callable[[Sequence[Part]], tuple[list[Any], list[Any]]]


def random_part(rng: random.Random, algorithm: str) -> Part:
    """One check: mostly the common case (one policy, charging), the rest of every kind."""
    identities = ["hot", "hot", "hot", "a", "b"]
    limit = rng.choice([3, 5, 10])
    window_s = rng.choice([1, 2, 60])
    burst = rng.choice([None, None, limit * 2]) if algorithm in BURSTS else None
    refill = rng.choice([None, None, None, 2500.0]) if algorithm == "token_bucket" else None
    if refill is not None:
        burst = None
    policies = [
        policy(algorithm, limit, window_s, rng.choice(identities), refill=refill, burst=burst)
    ]
    if rng.random() < 0.15:
        policies.append(policy(algorithm, limit * 3, window_s * 2, "wide"))
        if policies[0].key == policies[1].key:
            policies.pop()
    apply = rng.random() < 0.9
    cost_scaled = rng.choice([1000, 1000, 1000, 2000, 500, 3000, limit * 1000 + 1000])
    if not apply and rng.random() < 0.5:
        cost_scaled = 0
    args = script_args(algorithm, cost_scaled, apply, policies)
    kind = rng.random()
    if kind < 0.03:
        args[0] = "x"  # a refusal: a bad cost
    elif kind < 0.05:
        args = args[:-1]  # a refusal: a missing field
    return [p.key for p in policies], args


async def one_by_one(lua: LuaHarness, algorithm: str, parts: Sequence[Part]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for keys, args in parts:
        try:
            outcomes.append(list(await lua.run(algorithm, keys, args)))
        except RedisReplyError as error:
            outcomes.append(("error", str(error)))
    return outcomes


async def batched(
    lua: LuaHarness, script: ClockedScript, parts: Sequence[Part], layout: Layout = client_call
) -> list[Outcome]:
    keys, args = layout(parts)
    items = split_reply(await lua.client.evalsha(script, keys, args), len(parts))
    assert items is not None
    return [
        ("error", str(item)) if isinstance(item, RedisReplyError) else list(item) for item in items
    ]


async def history(
    lua: LuaHarness,
    algorithm: str,
    turns: Sequence[tuple[int, list[Part]]],
    script: Union[ClockedScript, None],
    setup: Sequence[Sequence[str]] = (),
    layout: Layout = client_call,
) -> History:
    """Every turn's outcomes and the keys after it, a call each (script None) or batched,
    after the commands ``setup`` (run first, on an empty Redis)."""
    await lua.execute("FLUSHALL")
    for command in setup:
        await lua.execute(*command)
    start = lua.now_ms
    seen = []
    for at_ms, parts in turns:
        await lua.set_clock(start + at_ms)
        await lua.expire_due(start + at_ms)
        if script is None:
            outcomes = await one_by_one(lua, algorithm, parts)
        else:
            outcomes = await batched(lua, script, parts, layout)
        seen.append((outcomes, await lua.dump()))
    lua.now_ms = start
    return seen


def assert_alike(alone: History, together: History, every_kind: bool = False) -> None:
    """Every turn's replies and the state after it, batched, as a call each; with
    ``every_kind``, the turns alone hold admissions, denials and refusals."""
    for turn, (expected, got) in enumerate(zip(alone, together)):
        assert got[0] == expected[0], f"turn {turn}: replies differ"
        assert got[1] == expected[1], f"turn {turn}: state differs"
    if every_kind:
        outcomes = [o for replies, _ in alone for o in replies]
        assert {o[0] for o in outcomes if isinstance(o, list)} == {0, 1}
        assert any(isinstance(o, tuple) for o in outcomes)


@pytest.mark.parametrize("layout", [client_call, full_call], ids=["client", "full"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("seed", range(4))
async def test_a_batch_decides_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, seed: int, layout: Layout
) -> None:
    rng = random.Random(f"{algorithm}-{seed}")
    turns = []
    at_ms = 0
    for _ in range(30):
        at_ms += rng.choice([0, 1, 7, 250, 999, 1000, 1500, 30_000, 61_000])
        turns.append(
            (at_ms, [random_part(rng, algorithm) for _ in range(rng.randint(1, MAX_BATCH_PARTS))])
        )
    alone = await history(lua, algorithm, turns, None)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm), layout=layout)
    assert any(outcomes for outcomes, _ in alone)
    assert_alike(alone, together)
    allowed = [o for outcomes, _ in alone for o in outcomes if isinstance(o, list) and o[0] == 1]
    denied = [o for outcomes, _ in alone for o in outcomes if isinstance(o, list) and o[0] == 0]
    refused = [o for outcomes, _ in alone for o in outcomes if isinstance(o, tuple)]
    assert allowed and denied and refused


HOT_LIMIT, HOT_WINDOW_S = 10, 2


def hot_part(
    algorithm: str,
    cost: Union[int, str] = 1000,
    *,
    limit: int = HOT_LIMIT,
    apply: bool = True,
    identity: str = "hot",
    wide: bool = False,
) -> Part:
    """A check of the hot key (or ``identity``'s), one policy unless ``wide``."""
    policies = [policy(algorithm, limit, HOT_WINDOW_S, identity)]
    if wide:
        policies.append(policy(algorithm, limit * 3, HOT_WINDOW_S * 2, "wide"))
    args = script_args(algorithm, 1000, apply, policies)
    args[0] = str(cost)
    return [p.key for p in policies], args


def run_part(rng: random.Random, algorithm: str) -> Part:
    """Mostly the hot key's common check, so a batch has long runs on one key, and now and
    then what ends a run: another key, a cost that does not fit or another cost, a peek, a
    lowered limit, two policies, a refusal, a cost INCRBY refuses (a leading zero)."""
    kind = rng.random()
    if kind < 0.60:
        return hot_part(algorithm)
    if kind < 0.66:
        return hot_part(algorithm, rng.choice([500, 2000, 3000]))
    if kind < 0.70:
        return hot_part(algorithm, HOT_LIMIT * 1000 + 1000)
    if kind < 0.74:
        return hot_part(algorithm, rng.choice([0, 1000]), apply=False)
    if kind < 0.79:
        return hot_part(algorithm, limit=rng.choice([4, 6]))
    if kind < 0.86:
        return hot_part(algorithm, identity=rng.choice(["a", "b"]))
    if kind < 0.90:
        return hot_part(algorithm, wide=True)
    if kind < 0.93:
        return hot_part(algorithm, "x")
    if kind < 0.96:
        return hot_part(algorithm, "01000")
    return hot_part(algorithm, rng.choice([1, 999, 1001]))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("seed", range(6))
async def test_runs_on_one_key_decide_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, seed: int
) -> None:
    """Long runs on the hot key (its state read and written once per run, where the script
    splits its straight-line path), with admissions, denials reached mid-run, runs ended by
    every kind of check, and instants on both sides of window and expiry boundaries."""
    rng = random.Random(f"runs-{algorithm}-{seed}")
    turns = []
    at_ms = 0
    for _ in range(40):
        at_ms += rng.choice([0, 1, 250, 999, 1000, 1001, 1999, 2000, 2001, 4001])
        size = rng.choice([2, 8, MAX_BATCH_PARTS, MAX_BATCH_PARTS])
        turns.append((at_ms, [run_part(rng, algorithm) for _ in range(size)]))
    alone = await history(lua, algorithm, turns, None)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm))
    assert_alike(alone, together, every_kind=True)


def counter_key(algorithm: str, at_ms: int, windows_back: int, identity: str = "hot") -> str:
    """The hot key's (or ``identity``'s) counter ``windows_back`` windows before the one of
    ``at_ms``."""
    window_index = at_ms // (HOT_WINDOW_S * 1000) - windows_back
    return f"{policy(algorithm, HOT_LIMIT, HOT_WINDOW_S, identity).key}:{window_index}"


NEAR_2_53, PAST_2_53 = str(2**53 - 1500), str(2**53 + 10)
BUCKET = -1
"""windows_back for the bucket's hash (its key: the policy's base key and its suffix)."""
# Counters the straight-line path leaves to the general path, or reads at an edge: (what it
# is, the command writing it, the key in it as "{key}").
ODD_COUNTERS: list[tuple[str, tuple[str, ...]]] = [
    ("not an integer", ("SET", "{key}", "abc")),
    ("negative", ("SET", "{key}", "-5")),
    ("another type", ("HSET", "{key}", "f", "1")),
    ("near 2^53", ("SET", "{key}", NEAR_2_53)),
    ("past 2^53", ("SET", "{key}", PAST_2_53)),
    ("16 digits", ("SET", "{key}", "1000000000000000")),
    ("zero, no expiry", ("SET", "{key}", "0")),
    ("full, no expiry", ("SET", "{key}", "9500")),
    ("half full", ("SET", "{key}", "5500", "PX", "100000")),
    ("above a lowered limit", ("SET", "{key}", "12000", "PX", "100000")),
]
# A bucket's hash, the same way: (what it is, its amount, base and accrued fields' values;
# None leaves the field out), and a key that is no hash.
ODD_BUCKETS: list[tuple[str, Optional[str], str, str]] = [
    ("a field not an integer", "x", "{at}", "0"),
    ("a field missing", None, "{at}", "0"),
    ("half, accruing", "5000", "{at_less_500}", "1500"),
    ("accrued a capacity", "0", "{at_less_500}", "10000"),
    ("accrued above due", "0", "{at_less_500}", "9000"),
    ("base ahead", "2000", "{at_plus_5000}", "0"),
    ("a window and more", "0", "{at_less_2500}", "0"),
    ("above a lowered capacity", "15000", "{at_less_500}", "0"),
]
ODD_TATS: list[tuple[str, tuple[str, ...]]] = [
    ("tat not an integer", ("tat", "x", "frac", "0")),
    ("frac missing", ("tat", "{at_us}")),
    ("tat ahead, half full", ("tat", "{at_us_plus_1s}", "frac", "7")),
    ("tat past a full bucket", ("tat", "{at_us_plus_5s}", "frac", "0")),
    ("frac at capacity", ("tat", "{at_us_plus_1s}", "frac", "10000")),
    ("tat behind", ("tat", "{at_us_less_1s}", "frac", "3")),
    ("tat past 2^53", ("tat", "9007199254740993", "frac", "0")),
]


def entry(total: int, cost: int = 1000) -> str:
    """A log entry's member as the sliding log writes it."""
    return f"{total:016d}:{cost}"


# A sliding log (its sorted set's entries as score, member, ...; "{at...}" the instant's).
ODD_LOGS: list[tuple[str, tuple[str, ...]]] = [
    ("a member not an entry", ("{at_less_500}", "junk")),
    ("a total not 16 digits", ("{at_less_500}", "12:5")),
    ("a cost above its total", ("{at_less_500}", entry(5, 6))),
    ("a total past 2^53", ("{at_less_500}", entry(2**53 + 1))),
    ("a cost with a leading zero", ("{at_less_500}", "0000000000001000:01000")),
    ("a score not an integer", ("{at_less_500}.5", entry(1000))),
    ("a score before the epoch", ("-3", entry(5000, 5000))),
    ("a score of 16 digits", ("1000000000000000", entry(1000))),
    (
        "the newest ahead of the clock",
        ("{at_less_500}", entry(1000), "{at_plus_5000}", entry(3000, 2000)),
    ),
    (
        "half full, no expiry",
        ("{at_less_1500}", entry(2000, 2000), "{at_less_500}", entry(5000, 3000)),
    ),
    (
        "only entries out of the window",
        ("{at_less_2500}", entry(4000, 4000), "{at_less_2000}", entry(5000)),
    ),
    (
        "out of the window and in",
        ("{at_less_2500}", entry(4000, 4000), "{at_less_500}", entry(7000, 3000)),
    ),
    ("totals that fall", ("{at_less_500}", entry(9000), "{at_less_400}", entry(4000))),
    # A middle entry's member is the one the next admission writes (or the one after, in
    # the run's second ZADD): the ZADD moves it.
    (
        "a middle total ahead",
        ("{at_less_900}", entry(1000), "{at_less_800}", entry(3000), "{at_less_700}", entry(2000)),
    ),
    (
        "a middle total two ahead",
        ("{at_less_900}", entry(1000), "{at_less_800}", entry(4000), "{at_less_700}", entry(2000)),
    ),
    (
        "an old entry's member next",
        (
            "{at_less_2500}",
            entry(1000),
            "{at_less_2400}",
            entry(2000),
            "{at_less_2300}",
            entry(9000, 9000),
        ),
    ),
    # Due a trim, 125 entries out of the window: a run adding four or more before the trim would
    # pass zset-max-listpack-entries (128), and the log would not be a listpack as alone.
    (
        "125 entries out of the window",
        tuple(x for i in range(125) for x in ("{at_less_2500}", entry(10**6 + 1000 * i))),
    ),
    # Renumbering (the general path's) on the first admission, or after a few of a run.
    (
        "near 2^53",
        ("{at_less_1500}", entry(2**53 - 2999, 3000), "{at_less_1000}", entry(2**53 - 1999)),
    ),
    ("a few admissions from 2^53", ("{at_less_1000}", entry(2**53 - 5500))),
    (
        "above a lowered limit",
        tuple(x for i in range(12) for x in ("{at_less_1500}", entry(1000 * (i + 1)))),
    ),
]


def odd_states() -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(algorithm, what the state is, windows_back, the command writing it) for every split
    algorithm: its current counter or the previous one (windows_back 1), or its hash."""
    states = [
        (algorithm, f"{where}{state}", back, command)
        for algorithm in ("fixed_window", "sliding_window")
        for back, where in ((0, ""), (1, "previous "))[: 1 + (algorithm == "sliding_window")]
        for state, command in ODD_COUNTERS
    ]
    fields = {"token_bucket": ("tokens", "credited"), "leaky_bucket": ("level", "drained")}
    for algorithm, (amount_field, accrued_field) in fields.items():
        states.append((algorithm, "not a hash", BUCKET, ("SET", "{key}", "abc")))
        for state, amount, base, accrued in ODD_BUCKETS:
            amount_pair = () if amount is None else (amount_field, amount)
            command = ("HSET", "{key}", *amount_pair, "base", base, accrued_field, accrued)
            states.append((algorithm, state, BUCKET, command))
    states.append(("gcra", "not a hash", BUCKET, ("SET", "{key}", "abc")))
    states += [("gcra", state, BUCKET, ("HSET", "{key}", *tat)) for state, tat in ODD_TATS]
    states.append(("sliding_log", "not a sorted set", BUCKET, ("SET", "{key}", "abc")))
    states += [("sliding_log", state, BUCKET, ("ZADD", "{key}", *log)) for state, log in ODD_LOGS]
    return states


ODD_STATES = odd_states()


def odd_state_command(
    algorithm: str, at: int, windows_back: int, command: tuple[str, ...], identity: str = "hot"
) -> list[str]:
    """``command`` writing an odd state (ODD_STATES) of the hot key's (or ``identity``'s)
    counter or hash, at the instant ``at``."""
    if windows_back == BUCKET:
        key = policy(algorithm, HOT_LIMIT, HOT_WINDOW_S, identity).key + SUFFIXES[algorithm]
    else:
        key = counter_key(algorithm, at, windows_back, identity)
    values = {f"at_less_{ms}": at - ms for ms in (400, 500, 700, 800, 900, 1000, 1500, 2000)}
    values.update({f"at_less_{ms}": at - ms for ms in (2300, 2400, 2500)}, at_plus_5000=at + 5000)
    values.update(at_us=at * 1000, at_us_plus_1s=at * 1000 + 10**6)
    values.update(at_us_plus_5s=at * 1000 + 5 * 10**6, at_us_less_1s=at * 1000 - 10**6)
    return [part.format(key=key, at=at, **values) for part in command]


@pytest.mark.parametrize(
    "algorithm, state, windows_back, command",
    ODD_STATES,
    ids=[f"{algorithm}-{state}" for algorithm, state, _, _ in ODD_STATES],
)
async def test_runs_on_odd_state_decide_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, state: str, windows_back: int, command: tuple[str, ...]
) -> None:
    rng = random.Random(f"odd-{algorithm}-{state}")
    parts = [hot_part(algorithm)] * 4 + [run_part(rng, algorithm) for _ in range(12)]
    turns = [(0, parts), (0, [hot_part(algorithm, c) for c in (500, 1000, 1500, 2000)] * 4)]
    commands = [odd_state_command(algorithm, lua.now_ms, windows_back, command)]
    alone = await history(lua, algorithm, turns, None, commands)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm), commands)
    assert_alike(alone, together)


def many_identities_part(rng: random.Random, algorithm: str, identities: Sequence[str]) -> Part:
    """Mostly the hot key's check on one of ``identities`` (the client sends it as "K" after
    another identity's), now and then one whose arguments differ: another cost, a lowered
    limit, a peek, two policies, a cost past the capacity, a refusal, a cost INCRBY
    refuses."""
    identity = rng.choice(identities)
    kind = rng.random()
    if kind < 0.72:
        return hot_part(algorithm, identity=identity)
    if kind < 0.78:
        return hot_part(algorithm, rng.choice([500, 2000]), identity=identity)
    if kind < 0.82:
        return hot_part(algorithm, limit=4, identity=identity)
    if kind < 0.86:
        return hot_part(algorithm, rng.choice([0, 1000]), apply=False, identity=identity)
    if kind < 0.90:
        return hot_part(algorithm, wide=True, identity=identity)
    if kind < 0.93:
        return hot_part(algorithm, HOT_LIMIT * 1000 + 1000, identity=identity)
    if kind < 0.96:
        return hot_part(algorithm, "x", identity=identity)
    return hot_part(algorithm, "01000", identity=identity)


@pytest.mark.parametrize("layout", [client_call, full_call], ids=["client", "full"])
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_many_identities_decide_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, layout: Layout
) -> None:
    """Checks of many identities under one policy, each its own run (after the first,
    only the key piece, the read and the decision run: the policy's scalars stand), with
    every odd state on an identity of its own (a detour to the general path, which sets the
    scalars its own way), and other costs, policies and refusals between them; sent as the
    client sends them ("K" after a check of the same arguments) and every part in full."""
    rng = random.Random(f"many-{algorithm}")
    odd = [(back, command) for name, _, back, command in ODD_STATES if name == algorithm]
    identities = [f"id{i}" for i in range(12)] + [f"odd{i}" for i in range(len(odd))]
    setup = [
        odd_state_command(algorithm, lua.now_ms, back, command, f"odd{i}")
        for i, (back, command) in enumerate(odd)
    ]
    turns = []
    at_ms = 0
    for _ in range(12):
        at_ms += rng.choice([0, 0, 1, 250, 999, 1000, 2001])
        turns.append((at_ms, [many_identities_part(rng, algorithm, identities) for _ in range(16)]))
    alone = await history(lua, algorithm, turns, None, setup)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm), setup, layout)
    assert_alike(alone, together, every_kind=True)


# The algorithms whose straight-line path is split in pieces, and the Redis commands a
# batch of MAX_BATCH_PARTS checks on one new key (HOT_LIMIT admitted, the rest denied)
# runs: the state read once, the admissions written once, the denials decided in the run
# (issue 30: a denial charges nothing, so it neither ends the run nor adds a write); the
# sliding log's denials are its straight-line path's when nothing was admitted before
# them in their run (below).
DENIALS = MAX_BATCH_PARTS - HOT_LIMIT
SPLIT = {
    # the read's charge (INCRBY), the difference, the new counter's expiry
    "fixed_window": ["INCRBY", "INCRBY", "PEXPIREAT"],
    # the previous counter's GET, then as the fixed window's
    "sliding_window": ["GET", "INCRBY", "INCRBY", "PEXPIREAT"],
    # HMGET, EXISTS (a new bucket), the admissions' HSET and PEXPIREAT
    "token_bucket": ["HMGET", "EXISTS", "HSET", "PEXPIREAT"],
    "leaky_bucket": ["HMGET", "EXISTS", "HSET", "PEXPIREAT"],
    "gcra": ["HMGET", "EXISTS", "HSET", "PEXPIREAT"],
    # The sliding log: the read's ZRANGE (a new log: no entry, so no second), the admissions'
    # first entry, trim and expiry (a new log: due), then the other nine in one ZADD. The
    # first denial, after admissions in its run, is the general path's (its wait is a
    # search): the newest and the first entry in the window, ZCOUNT and ZCARD, a bisection
    # over the ten entries (4 ZRANGEs) and the entry found (1). The next opens a run: its
    # read (two ZRANGEs), then its denial on the log as read, the same search (ZCOUNT,
    # ZCARD, 4 ZRANGEs; the entry found is the last probed); the same check after it has
    # the same reply, searched no more.
    "sliding_log": ["ZRANGE", "ZADD", "ZREMRANGEBYSCORE", "PEXPIREAT", "ZADD"]
    + ["ZRANGE"] * 7
    + ["ZRANGE"] * 2
    + ["ZCOUNT", "ZCARD"] * 2
    + ["ZRANGE"] * 4,
}
# The same batch on the key once full: every check denied, the state read once and left
# as it was (the windows' charge by the read undone by one DECRBY).
FULL = {
    "fixed_window": ["INCRBY", "DECRBY"],
    "sliding_window": ["GET", "INCRBY", "DECRBY"],
    "token_bucket": ["HMGET"],
    "leaky_bucket": ["HMGET"],
    "gcra": ["HMGET"],
}


async def commands_run(lua: LuaHarness) -> list[str]:
    """The commands Redis ran since CONFIG RESETSTAT, a name per call, but the test's own
    (the batch call, the clock's GET, INFO)."""
    info = (await lua.execute("INFO", "commandstats")).decode()
    calls: list[str] = []
    for line in info.splitlines():
        if line.startswith("cmdstat_"):
            name, stats = line[len("cmdstat_") :].split(":", 1)
            calls += [name.upper()] * int(stats.split(",")[0].split("=")[1])
    calls.remove("GET")
    return sorted(call for call in calls if call not in ("EVALSHA", "INFO", "CONFIG|RESETSTAT"))


@pytest.mark.parametrize("algorithm", sorted(SPLIT))
async def test_a_run_on_one_key_reads_and_writes_its_state_once(
    lua: LuaHarness, algorithm: str
) -> None:
    await lua.flush()
    script = clocked_batch(algorithm)
    await lua.execute("SCRIPT", "LOAD", script.source)
    await lua.execute("CONFIG", "RESETSTAT")
    outcomes = await batched(lua, script, [hot_part(algorithm)] * MAX_BATCH_PARTS)
    assert [o[0] for o in outcomes if isinstance(o, list)] == [1] * HOT_LIMIT + [0] * (
        MAX_BATCH_PARTS - HOT_LIMIT
    )
    assert await commands_run(lua) == sorted(SPLIT[algorithm])
    if algorithm not in FULL:
        return
    before = await lua.dump()
    await lua.execute("CONFIG", "RESETSTAT")
    outcomes = await batched(lua, script, [hot_part(algorithm)] * MAX_BATCH_PARTS)
    assert [o[0] for o in outcomes if isinstance(o, list)] == [0] * MAX_BATCH_PARTS
    assert all(o == outcomes[0] for o in outcomes)
    assert await commands_run(lua) == sorted(FULL[algorithm])
    assert await lua.dump() == before


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_check_and_its_60_repeats_are_each_decided_as_alone(
    lua: LuaHarness, algorithm: str
) -> None:
    """The most checks a call takes (MAX_BATCH_UNITS: one in full, 60 repeats of a unit
    each): admitted up to the limit, then denied, each as alone, the state left the same."""
    parts = [hot_part(algorithm)] * (1 + MAX_BATCH_UNITS - BATCH_PART_UNITS)
    await lua.flush()
    expected = await one_by_one(lua, algorithm, parts)
    state = await lua.dump()
    await lua.flush()
    outcomes = await batched(lua, clocked_batch(algorithm), parts)
    assert outcomes == expected
    assert [o[0] for o in outcomes if isinstance(o, list)] == [1] * HOT_LIMIT + [0] * 51
    assert await lua.dump() == state


async def test_a_full_previous_window_denies_a_run_with_two_gets(lua: LuaHarness) -> None:
    """The sliding window, its previous counter full at the current window's start: no
    cost fits whatever the current counter holds, so each check only reads it (GET)."""
    algorithm = "sliding_window"
    await lua.flush()
    window_ms = HOT_WINDOW_S * 1000
    await lua.set_clock(lua.now_ms - lua.now_ms % window_ms + window_ms - 1)
    script = clocked_batch(algorithm)
    await lua.execute("SCRIPT", "LOAD", script.source)
    await batched(lua, script, [hot_part(algorithm)] * MAX_BATCH_PARTS)
    await lua.set_clock(lua.now_ms + 1)
    expected = await one_by_one(lua, algorithm, [hot_part(algorithm)] * MAX_BATCH_PARTS)
    before = await lua.dump()
    await lua.execute("CONFIG", "RESETSTAT")
    outcomes = await batched(lua, script, [hot_part(algorithm)] * MAX_BATCH_PARTS)
    assert outcomes == expected and {o[0] for o in outcomes if isinstance(o, list)} == {0}
    assert await commands_run(lua) == ["GET", "GET"]
    assert await lua.dump() == before


DENIED = ["sliding_window", "token_bucket", "leaky_bucket", "gcra", "fixed_window"]


def denial_part(rng: random.Random, algorithm: str, capacity_scaled: int, window_s: int) -> Part:
    """A check of a hot key whose limit is the bottleneck: mostly the common check, then
    costs that do not fit (a little more, several requests, past the capacity: permanent),
    fractions of a request, a peek, another key, two policies, a refusal."""
    hot = policy(algorithm, 0, window_s, "hot", capacity_scaled=capacity_scaled)
    kind = rng.random()
    cost = 1000
    if kind < 0.10:
        cost = rng.choice([1001, 1999, 2000, 3000, capacity_scaled])
    elif kind < 0.14:
        cost = capacity_scaled + rng.choice([1, 1000])
    elif kind < 0.20:
        cost = rng.choice([1, 250, 333, 999])
    policies = [hot]
    if 0.20 <= kind < 0.24:
        policies = [policy(algorithm, 0, window_s, "cold", capacity_scaled=capacity_scaled)]
    elif 0.24 <= kind < 0.27:
        policies.append(policy(algorithm, 50, window_s * 2, "wide"))
    args = script_args(algorithm, cost, not 0.27 <= kind < 0.30, policies)
    if 0.30 <= kind < 0.32:
        args[0] = "x"
    return [p.key for p in policies], args


def retries(outcomes: Sequence[Outcome]) -> list[int]:
    """The waits of a turn's one-policy temporary denials."""
    return [
        o[3] for o in outcomes if isinstance(o, list) and o[0] == 0 and len(o) == 5 and o[3] > 0
    ]


GENEROUS = "generous"


def beside_generous(algorithm: str, part: Part) -> Part:
    """A one-policy charging check with a second policy that always admits beside it: the
    script's general path decides it, the first policy deciding the reply."""
    keys, args = part
    if len(keys) != 1 or args[1] != "1":
        return part
    wide = policy(algorithm, 10**6, 60, GENEROUS)
    return [*keys, wide.key], [*args, *script_args(algorithm, 0, True, [wide])[2:]]


def as_one_policy(outcome: Outcome) -> Outcome:
    """A two-policy reply of beside_generous's check as the first policy's alone."""
    if isinstance(outcome, list) and len(outcome) == 8:
        assert outcome[1] == 0, outcome
        return [outcome[0], 0, *outcome[2:5]]
    return outcome


# (capacity_scaled, window_s): whole requests, and fractional rates (a capacity no whole
# number of requests, a window the capacity does not divide into whole milliseconds).
DENIAL_RATES = [(3000, 2), (2500, 3), (7001, 7), (1000, 1), (10_000, 60)]


@pytest.mark.parametrize("algorithm", DENIED)
@pytest.mark.parametrize("rate", range(len(DENIAL_RATES)))
async def test_runs_dominated_by_denials_decide_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, rate: int
) -> None:
    """A hot key whose limit is the bottleneck: batches of mostly denials, the clock moved
    between them to just before, exactly at and just after a denial's retry instant (so a
    denial, then an admission), to window ends and expiries, or by a little; each turn's
    replies and state equal to the same checks one by one. The instants are chosen from
    the one-by-one replies, then the batches replay them."""
    capacity_scaled, window_s = DENIAL_RATES[rate]
    rng = random.Random(f"denials-{algorithm}-{rate}")
    window_ms = window_s * 1000
    turns: list[tuple[int, list[Part]]] = []
    alone: list[tuple[list[Outcome], dict[str, tuple[bytes, int]]]] = []
    await lua.execute("FLUSHALL")
    start = lua.now_ms
    at_ms = 0
    for _ in range(36):
        parts = [denial_part(rng, algorithm, capacity_scaled, window_s) for _ in range(16)]
        turns.append((at_ms, parts))
        await lua.set_clock(start + at_ms)
        await lua.expire_due(start + at_ms)
        outcomes = await one_by_one(lua, algorithm, parts)
        alone.append((outcomes, await lua.dump()))
        waits = retries(outcomes)
        step = rng.random()
        if waits and step < 0.6:
            at_ms += rng.choice(waits) + rng.choice([-1, 0, 0, 1])
        elif step < 0.75:
            at_ms += window_ms - (start + at_ms) % window_ms + rng.choice([-1, 0, 1])
        else:
            at_ms += rng.choice([0, 1, 7, 333, 1000])
    lua.now_ms = start
    together = await history(lua, algorithm, turns, clocked_batch(algorithm))
    assert_alike(alone, together)
    # The script alone decides these denials on its straight-line path too: the same
    # checks, each beside a generous policy (so on the general path), must agree.
    general_turns = [
        (at, [beside_generous(algorithm, part) for part in parts]) for at, parts in turns
    ]
    general = await history(lua, algorithm, general_turns, None)
    for turn, ((_, parts), (expected, got)) in enumerate(zip(turns, zip(alone, general))):
        mapped = [as_one_policy(o) if len(k) == 1 else o for (k, _), o in zip(parts, got[0])]
        assert mapped == expected[0], f"turn {turn}: general differs"
        assert {k: v for k, v in got[1].items() if GENEROUS not in k} == expected[1]
    decided = [o for outcomes, _ in alone for o in outcomes if isinstance(o, list)]
    denied = [o for o in decided if o[0] == 0 and o[3] > 0]
    assert len(denied) > len(decided) / 3, "denials dominate"
    assert any(o[0] == 1 for o in decided)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_a_hot_key_batch_admits_exactly_the_limit(lua: LuaHarness, algorithm: str) -> None:
    p = policy(algorithm, 10, 60, "hot")
    part = ([p.key], script_args(algorithm, 1000, True, [p]))
    outcomes = await batched(lua, clocked_batch(algorithm), [part] * MAX_BATCH_PARTS)
    assert [o[0] for o in outcomes if isinstance(o, list)] == [1] * 10 + [0] * 6
    assert [o[2] for o in outcomes[:10] if isinstance(o, list)] == [
        9000 - 1000 * i for i in range(10)
    ]


@pytest.mark.parametrize(
    "args, keys",
    [
        ([], []),
        (["0"], []),
        ([str(MAX_BATCH_UNITS + 1)], []),
        # 17 parts in full weigh 68 units: more than 64.
        (["17", *["1", "4", "1000", "1", "10000", "60"] * 17], ["k"] * 17),
        (["1", "1", "4", "1000", "1", "10000"], ["k"]),  # one argument short
        (["1", "1", "4", "1000", "1", "10000", "60"], []),  # the key missing
        (["1", "x", "4", "1000", "1", "10000", "60"], ["k"]),
    ],
)
async def test_a_batch_that_does_not_add_up_is_refused_whole(
    lua: LuaHarness, args: list[str], keys: list[str]
) -> None:
    with pytest.raises(RedisReplyError, match=r"^MODERATO_ARG batch: "):
        await lua.client.evalsha(clocked_batch("fixed_window"), keys, args)
    assert await lua.keys() == []


def test_the_batched_scripts_are_made_of_the_scripts_own_text() -> None:
    for name in ALGORITHMS:
        # The script alone as loaded, but for its reply's return after the straight-line
        # path's pieces (from '--#batch end' to '--#batch shared'): the driver's, batched;
        # and its decide piece, checked on its own.
        text = _with_includes(scripts_dir(), (scripts_dir() / f"{name}.lua").read_bytes())
        assert without_comments(text) == load_script(name).source
        if b"\n--#batch end" in text:
            end = text.index(b"\n--#batch end")
            text = text[:end] + text[text.index(b"\n--#batch shared", end) :]
            # Its decide piece is spliced into the driver (after the general path), whole.
            decide = text.index(b"\n--#batch decide")
            write = text.index(b"\n--#batch write", decide)
            assert without_comments(text[decide:write]).strip() in batched_script(name).source
            text = text[:decide] + text[write:]
        source, batch = without_comments(text), batched_script(name).source
        # Everything else the script alone runs is in the batched script, in the same order.
        lines = batch.split(b"\n")
        at = 0
        for line in source.split(b"\n"):
            at = lines.index(line, at) + 1


# -- the call's layout: markers (a part as the part before it) and the flat reply --------

Step = tuple[Any, ...]
"""A part of a hand-made layout: ("full", keys, args), ("=",), ("K", keys), ("C", cost) or
("KC", keys, cost); expand() says which check each one is."""


def expand(steps: Sequence[Step]) -> tuple[list[Part], list[str], list[str]]:
    """The checks a hand-made layout stands for (lua/batch.lua's header, written out here
    on its own), and the call's keys and arguments."""
    parts: list[Part] = []
    keys: list[str] = []
    args = [str(len(steps))]
    for step in steps:
        kind = step[0]
        if kind == "full":
            part_keys, part_args = list(step[1]), list(step[2])
            args += [str(len(part_keys)), str(len(part_args)), *part_args]
        else:
            part_keys, part_args = list(parts[-1][0]), list(parts[-1][1])
            args.append(kind)
            if kind in ("K", "KC"):
                part_keys = list(step[1])
            if kind in ("C", "KC"):
                part_args[0] = str(step[-1])
                args.append(str(step[-1]))
        if kind in ("full", "K", "KC"):
            keys += part_keys
        parts.append((part_keys, part_args))
    return parts, keys, args


def hand_layouts(algorithm: str) -> dict[str, list[Step]]:
    hot_keys, hot_args = hot_part(algorithm)
    a_keys, _ = hot_part(algorithm, identity="a")
    wide_keys, wide_args = hot_part(algorithm, wide=True)
    other_wide = [hot_part(algorithm, identity="b")[0][0], wide_keys[1]]
    lowered = hot_part(algorithm, limit=4)[1]
    hot: Step = ("full", hot_keys, hot_args)
    return {
        "one hot identity": [hot, *[("=",)] * 15],
        "many identities": [
            ("full", [f"{hot_keys[0]}:0"], hot_args),
            *[("K", [f"{hot_keys[0]}:{i}"]) for i in range(1, 16)],
        ],
        "costs": [
            hot, ("C", 2000), ("=",), ("C", 500), ("C", 3000), ("C", 1000), ("=",),
            ("C", "01000"), ("=",), ("C", "x"), ("=",), ("C", 11000), ("=",), ("C", 1000),
            ("=",), ("=",),
        ],
        "keys and costs": [
            hot, ("KC", a_keys, 2000), ("K", hot_keys), ("KC", hot_keys, 1000), ("K", hot_keys),
            ("=",), ("KC", a_keys, 3000), ("=",), ("K", a_keys), ("C", 1000),
            ("KC", hot_keys, 500), ("=",), ("=",), ("=",),
        ],
        "policies between": [
            hot, ("=",), ("full", hot_keys, lowered), ("=",), ("=",),
            ("full", wide_keys, wide_args), ("=",), ("K", other_wide), ("C", 2000),
            ("KC", wide_keys, 1000), hot, ("=",), ("=",),
            ("full", a_keys, ["x", *hot_args[1:]]), ("=",), ("C", 1000),
        ],
    }  # fmt: skip


LAYOUT_NAMES = list(hand_layouts("fixed_window"))


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("name", LAYOUT_NAMES)
async def test_markers_decide_as_the_parts_they_stand_for_one_by_one(
    lua: LuaHarness, algorithm: str, name: str
) -> None:
    """Each marker ("=", "K", "C", "KC"), in runs and between other keys, costs and
    policies, refusals among them: every reply and the state after each batch are those
    of the checks it stands for, a call each; at several instants, across a window."""
    parts, keys, args = expand(hand_layouts(algorithm)[name])
    turns = [(0, parts), (1, parts), (HOT_WINDOW_S * 1000, parts)]
    layout: Layout = lambda _parts: (keys, args)  # noqa: E731
    alone = await history(lua, algorithm, turns, None)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm), layout=layout)
    assert_alike(alone, together)
    assert any(isinstance(o, list) and o[0] == 1 for o in alone[0][0])


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_the_client_sends_a_hot_identity_as_one_part_and_markers(
    lua: LuaHarness, algorithm: str
) -> None:
    keys, args = hot_part(algorithm)
    call_keys, call_args = batch_layout([(keys, args)] * MAX_BATCH_PARTS)
    assert call_keys == keys
    assert call_args == [MAX_BATCH_PARTS, 1, len(args), *args] + ["="] * (MAX_BATCH_PARTS - 1)
    outcomes = await batched(lua, clocked_batch(algorithm), [(keys, args)] * MAX_BATCH_PARTS)
    assert [o[0] for o in outcomes if isinstance(o, list)] == [1] * 10 + [0] * 6
    assert [o[2] for o in outcomes[:10] if isinstance(o, list)] == [
        9000 - 1000 * i for i in range(10)
    ]


def test_the_client_sends_only_what_differs_from_the_part_before() -> None:
    fields = ["1", "10000", "60"]
    one, two = ["1000", *fields], ["2000", *fields]
    wide = ["1000", "1", "10000", "60", "30000", "120"]
    parts: list[tuple[list[str], list[str]]] = [
        (["a"], one),
        (["a"], one),  # the part before again
        (["b"], one),  # its own key
        (["b"], two),  # its own cost
        (["c"], one),  # its own key and cost
        (["c"], ["1000", "0", "10000", "60"]),  # a peek: other policy fields, in full
        (["c", "w"], wide),  # two policies, in full
        (["d", "w"], wide),  # its own keys, as many
        (["d"], one),  # fewer keys: in full
    ]
    keys, args = batch_layout(parts)
    assert keys == ["a", "b", "c", "c", "c", "w", "d", "w", "d"]
    assert args == [
        9,
        *[1, 4, *one],
        "=",
        "K",
        "C",
        "2000",
        "KC",
        "1000",
        *[1, 4, "1000", "0", "10000", "60"],
        *[2, 6, *wide],
        "K",
        *[1, 4, *one],
    ]
    # Values that are not equal (an int and its text) are not taken for the same.
    assert batch_layout([(["a"], one), (["a"], ["1000", 1, "10000", "60"])])[1] == [
        2,
        *[1, 4, *one],
        *[1, 4, "1000", 1, "10000", "60"],
    ]


def test_a_flat_reply_is_cut_into_each_parts_reply() -> None:
    refusal = RedisReplyError("MODERATO_ARG ...")
    reply = [5, 1, 0, 9000, 0, 7, refusal, 8, 0, 1, 2, 3, 4, 5, 6, 7, 0]
    assert split_reply(reply, 4) == [[1, 0, 9000, 0, 7], refusal, [0, 1, 2, 3, 4, 5, 6, 7], []]
    for bad in ([5, 1, 0], [1, 1, 1], [-1, 0], [b"5", 1, 0, 9000, 0, 7], RedisReplyError("x")):
        assert split_reply(bad, 1) is None
    assert split_reply([1, 1], 2) is None
    assert split_reply([1, 1, 1, 1], 1) is None
    # A decision as what changed since the decision before: -1 - mask, then mask's entries.
    changed = [5, 1, 0, 9000, 0, 7, -5, 8000, -1, -21, 7000, 9, -17, 10]
    assert split_reply(changed, 5) == [
        [1, 0, 9000, 0, 7],
        [1, 0, 8000, 0, 7],
        [1, 0, 8000, 0, 7],
        [1, 0, 7000, 0, 9],
        [1, 0, 7000, 0, 10],
    ]
    for bad in ([-1], [refusal, -1], [2, 1, 0, -5, 7], [5, 1, 0, 9000, 0, 7, -21, 1]):
        assert split_reply(bad, 2) is None


async def test_the_reply_is_one_flat_array_a_refusal_in_its_place(lua: LuaHarness) -> None:
    await lua.flush()
    keys, args = hot_part("fixed_window")
    layout = [("full", keys, args), ("C", "x"), ("C", 1000), ("K", ["other"])]
    _, call_keys, call_args = expand(layout)
    now = lua.now_ms
    reset = now - now % 2000 + 2000
    reply = await lua.client.evalsha(clocked_batch("fixed_window"), call_keys, call_args)
    assert len(reply) == 1 + 5 + 1 + 1 + 5 + 2
    assert reply[:6] == [5, 1, 0, 9000, 0, reset]
    assert isinstance(reply[6], RedisReplyError) and str(reply[6]).startswith("MODERATO_ARG ")
    # After a refusal, a decision in full; the next, as what changed (remaining: -1 - 4).
    assert reply[7:] == [5, 1, 0, 8000, 0, reset, -5, 9000]
    assert split_reply(reply, 4)[2:] == [[1, 0, 8000, 0, reset], [1, 0, 9000, 0, reset]]


FIELDS = ["1000", "1", "10000", "60"]


@pytest.mark.parametrize(
    "args, keys, message",
    [
        (["1", "="], [], r'ARGV\[2\] \("="\) marks a part as the part before it'),
        (["1", "K"], ["k"], r'ARGV\[2\] \("K"\) marks a part'),
        (["1", "C", "1000"], [], r'ARGV\[2\] \("C"\) marks a part'),
        (["2", "KC", "1000", "1", "4", *FIELDS], ["k", "k"], r'ARGV\[2\] \("KC"\) marks'),
        (["2", "1", "0", "C", "1000"], ["k"], r'ARGV\[4\] \("C"\) gives a cost to a part of no'),
        (["2", "1", "4", *FIELDS, "C"], ["k"], r"the parts take 1 keys and 9 arguments"),
        (["2", "1", "4", *FIELDS, "K"], ["k"], r"the parts take 2 keys and 8 arguments"),
        (["2", "1", "4", *FIELDS, "="], ["k", "k"], r"take 1 keys and 8 arguments, the call has 2"),
        (["2", "1", "4", *FIELDS, "KC", "1000"], ["k"], r"the parts take 2 keys"),
        (["2", "1", "4", *FIELDS, "X"], ["k"], r"ARGV\[8\] and the next must be counts or ARGV"),
        (["3", "1", "4", *FIELDS, "=", "=", "="], ["k"], r"9 arguments, the call has 1 and 10"),
    ],
)
async def test_a_layout_of_markers_that_does_not_add_up_is_refused_whole(
    lua: LuaHarness, args: list[str], keys: list[str], message: str
) -> None:
    await lua.flush()
    with pytest.raises(RedisReplyError, match=r"^MODERATO_ARG batch: .*" + message):
        await lua.client.evalsha(clocked_batch("fixed_window"), keys, args)
    assert await lua.keys() == []


async def test_a_run_of_sliding_log_denials_searches_once_a_cost(lua: LuaHarness) -> None:
    """On a full log (the hot key's ten entries, five at 0 ms and five at 300), a batch of
    16 denials, eight of one cost then eight of another, reads the log once and searches
    once a cost: the two ZRANGEs, then per cost ZCOUNT, ZCARD and a bisection over the ten
    ranks (4 ZRANGEs; the entry found the last one probed); every reply and the log as the
    calls one by one leave them."""
    algorithm = "sliding_log"
    fill = [(0, [hot_part(algorithm)] * 5), (300, [hot_part(algorithm)] * 5)]
    denials = [hot_part(algorithm, 1000)] * 8 + [hot_part(algorithm, 6000)] * 8
    turns = [*fill, (500, denials)]
    start = lua.now_ms
    alone = await history(lua, algorithm, turns, None)
    together = await history(lua, algorithm, turns, clocked_batch(algorithm))
    assert together == alone
    # 1000 fits when the first entry (0 ms) leaves, 6000 when the sixth (300 ms) does: the
    # window is 2 s, the clock at 500 ms.
    leaving = start + HOT_WINDOW_S * 1000
    assert alone[2][0] == [[0, 0, 0, 1500, leaving]] * 8 + [[0, 0, 0, 1800, leaving + 300]] * 8
    await lua.flush()
    script = clocked_batch(algorithm)
    await lua.execute("SCRIPT", "LOAD", script.source)
    for at_ms, parts in fill:
        await lua.set_clock(start + at_ms)
        await batched(lua, script, parts)
    await lua.set_clock(start + 500)
    await lua.execute("CONFIG", "RESETSTAT")
    await batched(lua, script, denials)
    lua.now_ms = start
    assert await commands_run(lua) == sorted(
        ["ZRANGE"] * 2 + (["ZCOUNT", "ZCARD"] + ["ZRANGE"] * 4) * 2
    )


def written_hashes() -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """A hash the write brings up to date: (algorithm, what it holds, its fields, its fields
    after two admissions of 1000 at the instant). The write pieces set only the fields whose
    text changes, so the hash holds what setting all of them gives: each field's '%d' text
    (one read with leading zeros, which the read takes, is rewritten), in the order it had,
    other fields kept. "{at}" is the instant in ms, "{at_us_plus_*}" in µs."""
    buckets = {
        "token_bucket": ("tokens", "credited", "3000"),
        "leaky_bucket": ("level", "drained", "7000"),
    }
    hashes = []
    for state, zero in (("as written", ""), ("leading zeros", "0")):
        for algorithm, (amount, accrued, after) in buckets.items():
            fields = (amount, zero + "5000", "base", zero + "{at}", accrued, zero + "0")
            written = (amount, after, "base", "{at}", accrued, "0")
            hashes.append((algorithm, state, (*fields, "other", "x"), (*written, "other", "x")))
        fields = ("tat", "{at_us_plus_1s}", "frac", zero + "7", "other", "x")
        written = ("tat", "{at_us_plus_1_4s}", "frac", "7", "other", "x")
        hashes.append(("gcra", state, fields, written))
    return hashes


WRITTEN_HASHES = written_hashes()


@pytest.mark.parametrize("batch", [False, True], ids=["alone", "batched"])
@pytest.mark.parametrize(
    "algorithm, state, fields, written",
    WRITTEN_HASHES,
    ids=[f"{algorithm}-{state}" for algorithm, state, _, _ in WRITTEN_HASHES],
)
async def test_a_written_hash_holds_every_field_as_set_in_full(
    lua: LuaHarness,
    batch: bool,
    algorithm: str,
    state: str,
    fields: tuple[str, ...],
    written: tuple[str, ...],
) -> None:
    await lua.execute("FLUSHALL")
    at = lua.now_ms
    await lua.set_clock(at)
    values = {
        "at": at,
        "at_us_plus_1s": at * 1000 + 10**6,
        "at_us_plus_1_4s": at * 1000 + 1_400_000,  # 2 * 1000 * W / C = 400,000 µs on
    }
    key = policy(algorithm, HOT_LIMIT, HOT_WINDOW_S, "hot").key + SUFFIXES[algorithm]
    await lua.execute("HSET", key, *(field.format(**values) for field in fields))
    parts = [hot_part(algorithm)] * 2
    if batch:
        outcomes = await batched(lua, clocked_batch(algorithm), parts)
    else:
        outcomes = await one_by_one(lua, algorithm, parts)
    assert [outcome[0] for outcome in outcomes] == [1, 1]
    expected = [field.format(**values).encode() for field in written]
    assert await lua.execute("HGETALL", key) == expected
