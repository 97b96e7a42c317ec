"""Runs the shipped Lua scripts against a real Redis with a test clock.

The scripts read the time once, on the line ``local time = redis.call('TIME')``.
The harness derives a test-only copy of each script in which that line reads
a clock key instead (milliseconds, set by the test), so tests choose the
instant of every decision. The shipped files are never changed; everything
else in the copy is byte for byte the shipped script.

The test clock must stay ahead of the real clock: the scripts set absolute
expiries (PEXPIREAT) from it, and an expiry in the real past deletes a key at
once. ``clock_origin_ms()`` gives a safe starting point. Keys whose expiry has
passed in test time are dropped by ``expire_due()``, standing in for Redis's
own expiry.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Union

from redis_servers import RedisServer
from reference_model import Entry, State

from moderato.redis import RedisClient
from moderato.scripts import SCRIPT_NAMES, load_script

CLOCK_KEY = "moderato-test:clock"
TIME_LINE = b"local time = redis.call('TIME')"
# TIME's reply shape, {seconds, microseconds}, from the clock key's milliseconds.
CLOCK_LINE = (
    b"local time = (function() "
    b"local clock_ms = tonumber(redis.call('GET', '" + CLOCK_KEY.encode() + b"')) "
    b"return { math.floor(clock_ms / 1000), (clock_ms % 1000) * 1000 } end)()"
)
DAY_MS = 86_400_000

Snapshot = dict[str, tuple[str, Union[str, dict[str, str]], int]]
"""{key: (type, value, pexpiretime)}: the value as Redis stores it, -1 for no expiry."""


@dataclass(frozen=True)
class ClockedScript:
    """A script as RedisClient.evalsha() takes it."""

    name: str
    source: bytes
    sha: str


def shipped_source(name: str) -> bytes:
    """The script exactly as the package loads it (lua/)."""
    return load_script(name).source


def clocked(name: str) -> ClockedScript:
    """The test-only copy of a shipped script whose clock is CLOCK_KEY."""
    source = shipped_source(name)
    if source.count(TIME_LINE) != 1:
        raise AssertionError(
            f"{name}.lua must read the time exactly once, on the line {TIME_LINE!r}"
        )
    if source.count(b"redis.call('TIME')") != 1:
        raise AssertionError(f"{name}.lua calls TIME more than once")
    test_source = source.replace(TIME_LINE, CLOCK_LINE)
    return ClockedScript(name, test_source, hashlib.sha1(test_source).hexdigest())


def clock_origin_ms() -> int:
    """A day boundary at least a day ahead of the real clock."""
    return (int(time.time() * 1000) // DAY_MS + 2) * DAY_MS


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


class LuaHarness:
    """One Redis connection, the clocked scripts, and state snapshots."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.scripts = {name: clocked(name) for name in SCRIPT_NAMES}
        self.now_ms = clock_origin_ms()

    async def execute(self, *args: Any) -> Any:
        return await self.client.execute(*args)

    async def set_clock(self, now_ms: int) -> None:
        self.now_ms = now_ms
        await self.client.execute("SET", CLOCK_KEY, str(now_ms))

    async def advance(self, delta_ms: int) -> int:
        await self.set_clock(self.now_ms + delta_ms)
        return self.now_ms

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Union[str, int]]) -> Any:
        """Runs the clocked script; an error reply raises RedisReplyError."""
        return await self.client.evalsha(self.scripts[name], list(keys), list(args))

    async def flush(self) -> None:
        await self.client.execute("FLUSHALL")
        await self.set_clock(self.now_ms)

    async def keys(self) -> list[str]:
        found = await self.client.execute("KEYS", "*")
        return sorted(_text(key) for key in found if _text(key) != CLOCK_KEY)

    async def snapshot(self) -> Snapshot:
        """Every key but the clock: type, stored value (strings, as stored) and PEXPIRETIME."""
        keys = await self.keys()
        if not keys:
            return {}
        types = await self.client.execute_many([("TYPE", key) for key in keys])
        reads: list[tuple[str, ...]] = []
        for key, kind in zip(keys, types):
            kind_text = _text(kind)
            if kind_text == "string":
                reads.append(("GET", key))
            elif kind_text == "hash":
                reads.append(("HGETALL", key))
            else:
                raise AssertionError(f"unexpected {kind_text} key {key!r}")
            reads.append(("PEXPIRETIME", key))
        replies = await self.client.execute_many(reads)
        snapshot: Snapshot = {}
        for i, (key, kind) in enumerate(zip(keys, types)):
            raw, expire_at = replies[2 * i], replies[2 * i + 1]
            if isinstance(raw, list):
                value: Union[str, dict[str, str]] = {
                    _text(raw[j]): _text(raw[j + 1]) for j in range(0, len(raw), 2)
                }
            else:
                value = _text(raw)
            snapshot[key] = (_text(kind), value, int(expire_at))
        return snapshot

    async def dump(self) -> dict[str, tuple[bytes, int]]:
        """Every key's DUMP and PEXPIRETIME: equal before and after means nothing was written."""
        keys = await self.keys()
        replies = await self.client.execute_many(
            [command for key in keys for command in (("DUMP", key), ("PEXPIRETIME", key))]
        )
        return {key: (replies[2 * i], replies[2 * i + 1]) for i, key in enumerate(keys)}

    async def expire_due(self, now_ms: int) -> None:
        """Deletes the keys whose expiry passed by now_ms in test time (Redis: now > expiry)."""
        keys = await self.keys()
        if not keys:
            return
        expiries = await self.client.execute_many([("PEXPIRETIME", key) for key in keys])
        due = [key for key, at in zip(keys, expiries) if at >= 0 and at < now_ms]
        if due:
            await self.client.execute("DEL", *due)

    async def load_state(self, state: State) -> None:
        """Writes a model state into Redis (values as decimal strings, expiries absolute)."""
        for key, entry in state.items():
            if isinstance(entry.value, dict):
                fields = [
                    item for name, value in entry.value.items() for item in (name, str(value))
                ]
                await self.client.execute("HSET", key, *fields)
            else:
                await self.client.execute("SET", key, str(entry.value))
            if entry.expire_at_ms is not None:
                await self.client.execute("PEXPIREAT", key, entry.expire_at_ms)


def model_snapshot(state: State) -> Snapshot:
    """The snapshot Redis should show for a model state: integers as decimal strings."""
    snapshot: Snapshot = {}
    for key, entry in state.items():
        expire_at = -1 if entry.expire_at_ms is None else entry.expire_at_ms
        if isinstance(entry.value, dict):
            snapshot[key] = ("hash", {name: str(v) for name, v in entry.value.items()}, expire_at)
        else:
            snapshot[key] = ("string", str(entry.value), expire_at)
    return snapshot


def state_from_snapshot(snapshot: Snapshot) -> State:
    """The model state of a snapshot (for tests that start from what Redis holds)."""
    state: State = {}
    for key, (kind, value, expire_at) in snapshot.items():
        expiry = None if expire_at < 0 else expire_at
        if kind == "hash":
            assert isinstance(value, dict)
            state[key] = Entry({name: int(v) for name, v in value.items()}, expiry)
        else:
            assert isinstance(value, str)
            state[key] = Entry(int(value), expiry)
    return state


@asynccontextmanager
async def open_harness(server: RedisServer) -> AsyncIterator[LuaHarness]:
    """A harness on the server, flushed, with the clock at clock_origin_ms().

    Test modules wrap it in a fixture (``async with open_harness(redis_server) as lua``).
    """
    client = RedisClient.from_url(server.url, command_timeout_s=10.0, connect_timeout_s=5.0)
    harness = LuaHarness(client)
    try:
        await harness.flush()
        yield harness
    finally:
        await client.close()
