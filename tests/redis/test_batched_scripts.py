"""The batched decision scripts (moderato.scripts.batched_script) against the scripts alone.

Random sequences of checks (several identities, repeated ones, one or two policies, peeks,
costs past the capacity, bursts and custom rates where the algorithm takes them, bad
arguments) are sent twice on one Redis at the same test-clock instants (tests/lua_harness.py
gives both the clock key in place of TIME): once a call each, in order, and once as batches
of up to MAX_BATCH_PARTS. Every reply (decision or refusal) and, after every batch, every
key's DUMP and expiry must be equal.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any, Union

import pytest
import pytest_asyncio
from lua_calls import policy, script_args
from lua_harness import CLOCK_LINE, TIME_LINE, ClockedScript, LuaHarness, open_harness
from redis_servers import RedisServer

from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisReplyError
from moderato.scripts import MAX_BATCH_PARTS, batched_script, load_script

Part = tuple[list[str], list[str]]
Outcome = Union[list[Any], tuple[str, str]]

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


def batch_call(parts: Sequence[Part]) -> tuple[list[str], list[str]]:
    keys = [key for part_keys, _ in parts for key in part_keys]
    args = [str(len(parts))]
    for part_keys, part_args in parts:
        args += [str(len(part_keys)), str(len(part_args)), *part_args]
    return keys, args


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


async def batched(lua: LuaHarness, script: ClockedScript, parts: Sequence[Part]) -> list[Outcome]:
    keys, args = batch_call(parts)
    reply = await lua.client.evalsha(script, keys, args)
    assert len(reply) == len(parts)
    return [
        ("error", str(item)) if isinstance(item, RedisReplyError) else list(item) for item in reply
    ]


async def history(
    lua: LuaHarness,
    algorithm: str,
    turns: Sequence[tuple[int, list[Part]]],
    script: Union[ClockedScript, None],
) -> list[tuple[list[Outcome], dict[str, tuple[bytes, int]]]]:
    """Every turn's outcomes and the keys after it, a call each (script None) or batched."""
    await lua.execute("FLUSHALL")
    start = lua.now_ms
    seen = []
    for at_ms, parts in turns:
        await lua.set_clock(start + at_ms)
        await lua.expire_due(start + at_ms)
        if script is None:
            outcomes = await one_by_one(lua, algorithm, parts)
        else:
            outcomes = await batched(lua, script, parts)
        seen.append((outcomes, await lua.dump()))
    lua.now_ms = start
    return seen


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("seed", range(4))
async def test_a_batch_decides_as_the_calls_one_by_one(
    lua: LuaHarness, algorithm: str, seed: int
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
    together = await history(lua, algorithm, turns, clocked_batch(algorithm))
    assert any(outcomes for outcomes, _ in alone)
    for turn, (expected, got) in enumerate(zip(alone, together)):
        assert got[0] == expected[0], f"turn {turn}: replies differ"
        assert got[1] == expected[1], f"turn {turn}: state differs"
    allowed = [o for outcomes, _ in alone for o in outcomes if isinstance(o, list) and o[0] == 1]
    denied = [o for outcomes, _ in alone for o in outcomes if isinstance(o, list) and o[0] == 0]
    refused = [o for outcomes, _ in alone for o in outcomes if isinstance(o, tuple)]
    assert allowed and denied and refused


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
        ([str(MAX_BATCH_PARTS + 1)], []),
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
        source, batch = load_script(name).source, batched_script(name).source
        # Everything the script alone runs is in the batched script, in the same order.
        lines = batch.split(b"\n")
        at = 0
        for line in source.split(b"\n"):
            at = lines.index(line, at) + 1
