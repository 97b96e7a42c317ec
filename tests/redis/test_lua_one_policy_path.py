"""The scripts' one-policy straight-line path against their general path.

A call with one policy, charging, takes a script's straight-line path (where the
script has one); the same policy beside a second, generous policy takes the general
path. After the same history, both must give that policy the same verdict, the same
remaining, retry and reset, and leave the same state (values and expiry) behind.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from typing import Union

import pytest
import pytest_asyncio
import reference_model as model
from lua_calls import MINUTE_MS, decide
from lua_harness import LuaHarness, open_harness
from redis_servers import RedisServer

from moderato.scripts import SCRIPT_NAMES

ALGORITHMS = [name for name in SCRIPT_NAMES if name != "reset"]

# A step: (ms after the start, cost_scaled, capacity of the policy in units), a decision
# of both policies; or ("hset"/"set", suffix, value): the same raw state on both keys.
Step = Union[tuple[int, int, int], tuple[str, str, object]]

HISTORIES: dict[str, list[Step]] = {
    "fresh": [],
    "used": [(0, 3000, 10), (1000, 5000, 10)],
    "full": [(0, 10_000, 10)],
    "capacity_lowered": [(0, 15_000, 20), (500, 4000, 20)],
    "idle_one_window": [(-61_000, 6000, 10)],
    "idle_two_windows": [(-125_000, 6000, 10), (-124_000, 1000, 10)],
    "clock_stepped_back": [(20_000, 4000, 10)],
}

RAW_STATES: dict[str, list[Step]] = {
    "token_bucket": [
        ("hset", ":bucket:v2", {"tokens": "2000", "base": "{t-130000}", "credited": "10000"}),
        ("hset", ":bucket:v2", {"tokens": "2000", "base": "{t-1000}", "credited": "9500"}),
        ("hset", ":bucket:v2", {"tokens": "2000", "base": "{t-70000}", "credited": "100"}),
        ("hset", ":bucket:v2", {"tokens": "0100", "base": "{t-1000}", "credited": "0"}),
    ],
    "leaky_bucket": [
        ("hset", ":leaky", {"level": "8000", "base": "{t-130000}", "drained": "10000"}),
        ("hset", ":leaky", {"level": "8000", "base": "{t-1000}", "drained": "9500"}),
        ("hset", ":leaky", {"level": "8000", "base": "{t-70000}", "drained": "100"}),
    ],
    "sliding_log": [
        # the running total next to 2^53: an admission renumbers (the general path's)
        ("zadd", ":log", [(-5000, "9007199254738993:3000"), (-1000, "9007199254739993:1000")]),
        ("zadd", ":log", [(-70_000, "0000000000005000:5000"), (-1000, "0000000000006000:1000")]),
    ],
    "gcra": [
        ("hset", ":gcra", {"tat": "{t_us+90000000}", "frac": "3"}),
        ("hset", ":gcra", {"tat": "{t_us+30000000}", "frac": "99999"}),
        ("hset", ":gcra", {"tat": "{t_us-5000}", "frac": "7"}),
    ],
}

QUERIES = [1000, 4000, 9999, 10_000, 0]  # cost_scaled; 0 is a peek (always general)


@pytest_asyncio.fixture
async def lua(redis_server: RedisServer) -> AsyncIterator[LuaHarness]:
    async with open_harness(redis_server) as harness:
        yield harness


def _cases() -> list[tuple[str, str, list[Step]]]:
    cases = [(a, name, steps) for a in ALGORITHMS for name, steps in HISTORIES.items()]
    for algorithm, states in RAW_STATES.items():
        cases += [(algorithm, f"raw{i}", [state]) for i, state in enumerate(states)]
    return cases


def _raw_value(value: object, t0: int) -> dict[str, str]:
    assert isinstance(value, dict)
    out = {}
    for field, text in value.items():
        if text.startswith("{t_us"):
            text = str(t0 * 1000 + int(text[5:-1]))
        elif text.startswith("{t"):
            text = str(t0 + int(text[2:-1]))
        out[field] = text
    return out


async def _state(lua: LuaHarness, base: str) -> dict[str, tuple[object, ...]]:
    """Every key of one policy, by its suffix: type, contents and PEXPIRETIME."""
    state: dict[str, tuple[object, ...]] = {}
    for key in await lua.keys():
        if not key.startswith(base + ":"):
            continue
        kind = await lua.execute("TYPE", key)
        if kind in (b"string", "string"):
            contents = await lua.execute("GET", key)
        elif kind in (b"hash", "hash"):
            contents = sorted(await lua.execute("HGETALL", key))
        else:
            contents = await lua.execute("ZRANGE", key, "0", "-1", "WITHSCORES")
        state[key[len(base) :]] = (kind, contents, await lua.execute("PEXPIRETIME", key))
    return state


@pytest.mark.parametrize("query_cost", QUERIES)
@pytest.mark.parametrize(("algorithm", "history", "steps"), _cases())
async def test_one_policy_path_answers_as_the_general_path(
    lua: LuaHarness, algorithm: str, history: str, steps: Sequence[Step], query_cost: int
) -> None:
    t0 = lua.now_ms - lua.now_ms % MINUTE_MS + 2 * MINUTE_MS + 15_000
    alone, beside, generous = (
        model.Policy(f"app:{algorithm}:{{t:{identity}}}:60", capacity_scaled, 60, None)
        for identity, capacity_scaled in (("alone", 10_000), ("beside", 10_000), ("big", 10**9))
    )
    for step in steps:
        if isinstance(step[0], str):
            kind, suffix, value = step
            if kind == "zadd":
                assert isinstance(value, list)
                pairs = [x for at_ms, member in value for x in (str(t0 + at_ms), member)]
                for p in (alone, beside):
                    await lua.execute("ZADD", p.key + str(suffix), *pairs)
                continue
            fields = _raw_value(value, t0)
            for p in (alone, beside):
                await lua.execute(
                    "HSET", p.key + str(suffix), *(x for kv in fields.items() for x in kv)
                )
            continue
        at_ms, cost_scaled, limit = step
        for p in (alone, beside):
            resized = model.Policy(p.key, int(limit) * 1000, 60, None)
            await decide(
                lua, algorithm, [resized, generous], int(cost_scaled), at_ms=t0 + int(at_ms)
            )
    await lua.set_clock(t0 + 2000)
    apply = query_cost > 0
    try:
        single = await decide(lua, algorithm, [alone], query_cost, apply=apply)
    except Exception as error:  # a refusal must be the same refusal
        single = [str(error)]
    try:
        both = await decide(lua, algorithm, [beside, generous], query_cost, apply=apply)
        general = [both[0], 0, *both[2:5]]
    except Exception as error:
        general = [str(error).replace("beside", "alone")]
    assert single == general
    assert await _state(lua, alone.key) == await _state(lua, beside.key)


def _random_log(rng: random.Random, t0: int) -> list[str]:
    """A log (ZADD's score, member, ...) of 1..40 entries, some before the window: running
    totals rising by each entry's cost, but now and then one that falls, an odd member or
    a fractional score; every denial's search then meets it or not."""
    entries: list[str] = []
    total, at_ms = rng.randrange(0, 10**6), t0 - rng.randrange(55_000, 90_000)
    for _ in range(rng.randrange(1, 41)):
        at_ms += rng.choice((0, 0, 1, 700, 3000))
        cost = rng.choice((1000, 1000, 500, 2500, 7000))
        total += cost
        member, score = f"{total:016d}:{cost}", str(at_ms)
        odd = rng.random()
        if odd < 0.03:
            member = f"{max(cost, total - rng.randrange(1, 20_000)):016d}:{cost}"  # falls
        elif odd < 0.05:
            member = f"{total}:{cost}"  # not 16 digits
        elif odd < 0.07:
            score = f"{at_ms}.5"
        entries += [score, member]
    return entries


@pytest.mark.parametrize("seed", range(40))
async def test_a_sliding_log_denial_answers_as_the_general_path(lua: LuaHarness, seed: int) -> None:
    """A denial on the log as read is decided on the straight-line path (its wait the
    general path's search): on random logs, odd entries and falling totals included, the
    same reply (or refusal) and state as the general path's, for costs up to the capacity."""
    rng = random.Random(seed)
    t0 = lua.now_ms - lua.now_ms % MINUTE_MS + 2 * MINUTE_MS + 15_000
    await lua.set_clock(t0)
    for case in range(5):
        alone, beside, generous = (
            model.Policy(f"app:sliding_log:{{t:{identity}{case}}}:60", capacity, 60, None)
            for identity, capacity in (
                ("alone", 0),
                ("beside", 0),
                ("big", 10**12),
            )
        )
        log = _random_log(rng, t0)
        for p in (alone, beside):
            await lua.execute("ZADD", p.key + ":log", *log)
        capacity = rng.choice((1000, 3000, 10_000, 40_000, 100_000))
        alone, beside = (model.Policy(p.key, capacity, 60, None) for p in (alone, beside))
        cost = rng.randrange(1, capacity + 1)
        try:
            single = await decide(lua, "sliding_log", [alone], cost)
        except Exception as error:
            single = [str(error)]
        try:
            both = await decide(lua, "sliding_log", [beside, generous], cost)
            general = [both[0], 0, *both[2:5]]
        except Exception as error:
            general = [str(error).replace("beside", "alone")]
        assert single == general, (seed, case, log, capacity, cost)
        assert await _state(lua, alone.key) == await _state(lua, beside.key)
