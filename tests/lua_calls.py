"""Calls of the shipped decision scripts for the Lua tests: keys, arguments, replies.

Keys are shaped like ``_accel.build_keys``'s, with every algorithm's tag from
the registry; ``decide`` runs one script at a chosen instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import reference_model as model
from lua_harness import LuaHarness

from moderato.algorithms import ALGORITHMS as REGISTRY

TAGS = {name: algorithm.key_tag for name, algorithm in REGISTRY.items()}
SUFFIXES = {name: algorithm.state_suffixes[0] for name, algorithm in REGISTRY.items()}
MAX_CAPACITY = model.MAX_CAPACITY_SCALED
MINUTE_MS = 60_000
DAY_MS = 86_400_000


def base_key(algorithm: str, window_s: int, identity: str = "client") -> str:
    """A base key shaped like build_keys' output."""
    return f"app:{TAGS[algorithm]}:{{tenant:scope:{identity}}}:{window_s}"


def policy(
    algorithm: str,
    limit: int,
    window_s: int,
    identity: str = "client",
    *,
    capacity_scaled: Optional[int] = None,
    refill: Optional[float] = None,
    burst: Optional[int] = None,
) -> model.Policy:
    capacity = limit * 1000 if capacity_scaled is None else capacity_scaled
    burst_scaled = None if burst is None else burst * 1000
    return model.Policy(
        base_key(algorithm, window_s, identity), capacity, window_s, refill, burst_scaled
    )


def script_args(
    algorithm: str, cost_scaled: int, apply: bool, policies: Sequence[model.Policy]
) -> list[str]:
    args = [str(cost_scaled), "1" if apply else "0"]
    return args + [str(field) for field in model.script_fields(algorithm, policies)]


async def decide(
    lua: LuaHarness,
    algorithm: str,
    policies: Sequence[model.Policy],
    cost_scaled: int,
    *,
    apply: bool = True,
    at_ms: Optional[int] = None,
) -> list[int]:
    if at_ms is not None:
        await lua.set_clock(at_ms)
    reply = await lua.run(
        algorithm, [p.key for p in policies], script_args(algorithm, cost_scaled, apply, policies)
    )
    assert all(type(value) is int for value in reply), reply
    return list(reply)


def state_key(algorithm: str, p: model.Policy) -> str:
    return p.key + SUFFIXES[algorithm]


async def hash_of(lua: LuaHarness, key: str) -> dict[str, str]:
    raw = await lua.execute("HGETALL", key)
    return {raw[i].decode(): raw[i + 1].decode() for i in range(0, len(raw), 2)}


async def log_of(lua: LuaHarness, key: str) -> list[tuple[str, int]]:
    raw = await lua.execute("ZRANGE", key, 0, -1, "WITHSCORES")
    return [(raw[i].decode(), int(raw[i + 1])) for i in range(0, len(raw), 2)]


def member(total_scaled: int, cost_scaled: int) -> str:
    return f"{total_scaled:016d}:{cost_scaled}"
