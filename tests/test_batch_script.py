"""The batch script (lua/batch.lua) against the decision scripts sent one by one.

Hypothesis draws turns of calls -- every algorithm of the registry mixed in one turn,
1-3 policies, bursts, custom refill rates, costs from peeks to above capacity, refused
arguments, the same keys again and again (hot keys) -- and runs each turn twice, on two
redis-servers at the same test clock: one by one through the shipped scripts on one,
as one batch call on the other. Every part's reply is the lone call's, exactly (a
refusal word for word), and both servers hold the same keys, values and expiries after
every turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import pytest_asyncio
import reference_model as model
from differential_calls import policy_sets, redis_snapshot, script_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lua_harness import CLOCK_LINE, DAY_MS, ClockedScript, LuaHarness, clock_origin_ms, open_harness
from redis_servers import RedisServer

from moderato.algorithms import ALGORITHMS
from moderato.redis import RedisReplyError
from moderato.scripts import BATCH_INDEX, batch_script

ALGORITHM_NAMES = tuple(ALGORITHMS)
BATCH_TIME_LINE = b"local instant = real_redis.call('TIME')"
BATCH_CLOCK_LINE = CLOCK_LINE.replace(b"local time", b"local instant")


def clocked_batch() -> ClockedScript:
    """The shipped batch script whose one TIME read is the harness's clock key."""
    source = batch_script().source
    assert source.count(BATCH_TIME_LINE) == 1
    test_source = source.replace(BATCH_TIME_LINE, BATCH_CLOCK_LINE)
    return ClockedScript("batch", test_source, hashlib.sha1(test_source).hexdigest())


@dataclass(frozen=True)
class Call:
    algorithm: str
    keys: tuple[str, ...]
    args: tuple[Union[int, str], ...]


@st.composite
def calls(
    draw: st.DrawFn, policies_by_algorithm: dict[str, list[tuple[model.Policy, ...]]]
) -> Call:
    algorithm = draw(st.sampled_from(sorted(policies_by_algorithm)))
    policies = draw(st.sampled_from(policies_by_algorithm[algorithm]))
    capacity = policies[0].bucket_scaled
    cost = draw(
        st.one_of(
            st.sampled_from(
                [1000, 1000, 1000, 2000, capacity, capacity + 1, max(1, capacity // 3)]
            ),
            st.integers(1, 5000),
            st.just(model.MAX_SAFE_INTEGER),
        )
    )
    apply = draw(st.sampled_from([True, True, True, False]))
    args: list[Union[int, str]] = script_args(algorithm, cost, apply, policies)
    if draw(st.integers(0, 30)) == 0:
        args[0] = 0 if apply else "x"  # a refused argument: the part's refusal, in place
    return Call(algorithm, tuple(policy.key for policy in policies), tuple(args))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], list[list[Call]]]:
    algorithms = draw(
        st.lists(st.sampled_from(ALGORITHM_NAMES), min_size=1, max_size=6, unique=True)
    )
    policies_by_algorithm = {
        algorithm: draw(
            st.lists(
                policy_sets(algorithm, draw(st.sampled_from(["a", "b"]))), min_size=1, max_size=3
            )
        )
        for algorithm in algorithms
    }
    turn_count = draw(st.integers(1, 6))
    deltas = draw(
        st.lists(
            st.one_of(st.sampled_from([0, 1, 999, 1000]), st.integers(0, 2 * DAY_MS)),
            min_size=turn_count,
            max_size=turn_count,
        )
    )
    turns = draw(
        st.lists(
            st.lists(calls(policies_by_algorithm), min_size=1, max_size=12),
            min_size=turn_count,
            max_size=turn_count,
        )
    )
    return deltas, turns


@pytest_asyncio.fixture
async def one_by_one(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


@pytest_asyncio.fixture
async def batched(own_redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(own_redis_server) as harness:
        yield harness


def outcome(reply: Any) -> Any:
    """A reply as compared: an error by its text."""
    if isinstance(reply, RedisReplyError):
        return ("error", reply.message)
    return reply


async def lone_reply(lua: LuaHarness, call: Call) -> Any:
    try:
        return await lua.run(call.algorithm, call.keys, call.args)
    except RedisReplyError as error:
        return error


def batch_arguments(parts: Sequence[Call]) -> tuple[list[str], list[Union[int, str]]]:
    keys: list[str] = []
    arguments: list[Union[int, str]] = []
    for part in parts:
        keys.extend(part.keys)
        arguments.extend((BATCH_INDEX[part.algorithm], len(part.keys), len(part.args)))
        arguments.extend(part.args)
    return keys, arguments


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios())
async def test_a_batch_decides_as_its_parts_sent_one_by_one(
    one_by_one: LuaHarness, batched: LuaHarness, scenario: tuple[list[int], list[list[Call]]]
) -> None:
    deltas, turns = scenario
    script = clocked_batch()
    await one_by_one.flush()
    await batched.flush()
    now_ms = clock_origin_ms()
    for number, (delta_ms, parts) in enumerate(zip(deltas, turns)):
        now_ms += delta_ms
        for lua in (one_by_one, batched):
            await lua.set_clock(now_ms)
            await lua.expire_due(now_ms)
        expected = [outcome(await lone_reply(one_by_one, part)) for part in parts]
        keys, arguments = batch_arguments(parts)
        replies = await batched.client.evalsha(script, keys, arguments)
        where = f"turn {number} at +{now_ms - clock_origin_ms()} ms"
        assert [outcome(reply) for reply in replies] == expected, where
        assert await redis_snapshot(batched) == await redis_snapshot(one_by_one), where


async def test_a_lone_part_is_the_scripts_own_reply(lua: LuaHarness) -> None:
    policies = (model.Policy("t:tb:{x}:60", 5000, 60),)
    script = clocked_batch()
    keys, arguments = batch_arguments(
        [
            Call(
                "token_bucket",
                ("t:tb:{x}:60",),
                tuple(script_args("token_bucket", 1000, True, policies)),
            )
        ]
    )
    reply = await lua.client.evalsha(script, keys, arguments)
    assert reply == [[1, 0, 4000, 0, lua.now_ms + 12_000]]


async def test_a_wrong_layout_is_refused_whole(lua: LuaHarness) -> None:
    script = clocked_batch()
    for keys, arguments in (
        (["k"], [1, 1, 5, 1000, 1]),  # 5 arguments announced, 2 given
        (["k"], [99, 1, 2, 1000, 1]),  # no script 99
        (["k", "extra"], [1, 1, 4, 1000, 1, 5000, 60]),  # a key no part names
    ):
        try:
            await lua.client.evalsha(script, keys, arguments)
        except RedisReplyError as error:
            assert error.message.startswith("MODERATO_ARG batch: "), error.message
        else:
            raise AssertionError(f"{keys} {arguments} was not refused")
