"""The two places a decision is made, behind one test interface.

The per-algorithm behaviour files (tests/test_<algorithm>.py) run every case on
both backends: the shipped scripts on a real Redis with a test clock
(``LuaHarness``, tests/lua_harness.py) and memory://'s C store
(``MemoryHarness`` below) on the same clock. ``MemoryHarness`` answers the few
Redis commands those tests use to read and plant state (GET, SET, HSET,
HGETALL, ZADD, ZRANGE, PERSIST, PEXPIRETIME, KEYS), as Redis answers them, and
raises the store's refusals as the ``RedisReplyError`` a script's error reply
is, so a case reads the same on either backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Union

from lua_harness import LuaHarness, Snapshot, clock_origin_ms

from moderato import _accel
from moderato.errors import RedisReplyError

BACKENDS = ("redis", "memory")

_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)")


class Unrepresentable(ValueError):
    """A value memory://'s typed store cannot hold (text where it keeps integers)."""


def _integer(value: Union[str, bytes, int]) -> int:
    text = value.decode() if isinstance(value, bytes) else str(value)
    if not _DECIMAL.fullmatch(text):
        raise Unrepresentable(f"memory:// stores integers, not {text!r}")
    return int(text)


class MemoryHarness:
    """memory://'s store at a test clock, with LuaHarness's interface."""

    def __init__(self) -> None:
        self.store = _accel.MemoryStore(1_000_000)
        self.now_ms = clock_origin_ms()

    async def set_clock(self, now_ms: int) -> None:
        self.now_ms = now_ms

    async def advance(self, delta_ms: int) -> int:
        self.now_ms += delta_ms
        return self.now_ms

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Union[str, int]]) -> Any:
        """Runs the store's twin of a script; a refusal raises RedisReplyError."""
        encoded = [key.encode() for key in keys]
        try:
            if name == "reset":
                return self.store.reset(encoded, list(args), self.now_ms)
            return self.store.decide(name, encoded, list(args), self.now_ms)
        except ValueError as error:
            raise RedisReplyError(str(error)) from None

    async def flush(self) -> None:
        self.store.clear()

    def _live(self) -> dict[bytes, tuple[Any, int]]:
        # Every key held, its expiry passed in test time or not, as the Redis harness
        # shows them (Redis expires keys on the real clock, which the test clock is ahead
        # of); a decision reads an expired key as absent on both.
        return dict(self.store.dump(0))

    async def expire_due(self, now_ms: int) -> None:
        """Deletes the keys whose expiry passed by now_ms (as LuaHarness.expire_due)."""
        live = self.store.dump(now_ms)
        for key in self._live():
            if key not in live:
                self.store.delete_matching(re.sub(rb"([*?\[\]\\])", rb"\\\1", key))

    async def keys(self) -> list[str]:
        return sorted(key.decode() for key in self._live())

    async def dump(self) -> dict[str, tuple[Any, int]]:
        """Every key's value and expiry: equal before and after means nothing was written."""
        return {key.decode(): entry for key, entry in self._live().items()}

    async def snapshot(self) -> Snapshot:
        """As LuaHarness.snapshot() shows Redis's keys: values as decimal text."""
        found: Snapshot = {}
        for key, (value, expire_at) in self._live().items():
            if isinstance(value, dict):
                fields = {name: str(field) for name, field in value.items()}
                found[key.decode()] = ("hash", fields, expire_at)
            elif isinstance(value, list):
                raise AssertionError(f"unexpected zset key {key!r}")
            else:
                found[key.decode()] = ("string", str(value), expire_at)
        return found

    async def execute(self, command: str, *args: Any) -> Any:
        """The Redis commands the behaviour tests read and plant state with."""
        name = command.upper()
        live = self._live()
        key = str(args[0]).encode() if args else b""
        value, expire_at = live.get(key, (None, -2))
        if name == "PEXPIRETIME":
            return expire_at
        if name == "PERSIST":
            if value is None or expire_at == -1:
                return 0
            self.store.load(key, value, -1)
            return 1
        if name == "GET":
            return None if value is None else str(value).encode()
        if name == "HGETALL":
            assert value is None or isinstance(value, dict), value
            return [
                item for k, v in (value or {}).items() for item in (k.encode(), str(v).encode())
            ]
        if name == "ZRANGE":
            assert list(args[1:]) == [0, -1, "WITHSCORES"], args
            pairs = value or []
            return [item for member, at in pairs for item in (member.encode(), str(at).encode())]
        if name == "SET":
            self.store.load(key, _integer(args[1]), -1)
            return b"OK"
        if name == "HSET":
            fields = dict(value or {})
            for i in range(1, len(args), 2):
                fields[str(args[i])] = _integer(args[i + 1])
            try:
                self.store.load(key, fields, -1)
            except ValueError as error:
                raise Unrepresentable(str(error)) from None
            return len(args) // 2
        if name == "ZADD":
            members = dict(value or [])
            for i in range(1, len(args), 2):
                members[str(args[i + 1])] = int(args[i])
            pairs = sorted(((m, at) for m, at in members.items()), key=lambda p: (p[1], p[0]))
            self.store.load(key, pairs, -1)
            return len(args) // 2
        raise AssertionError(f"MemoryHarness does not answer {command}")


DecisionStore = Union[LuaHarness, MemoryHarness]


HASH_LAYOUTS = ({"tokens", "base", "credited"}, {"tat", "frac"}, {"level", "base", "drained"})


def holds(backend: str, value: object) -> bool:
    """Whether the backend can hold a planted value: memory:// keeps integers (a "{now}"
    stands for one) and the hashes of its algorithms, each with all its fields."""
    if backend == "redis" or isinstance(value, list):
        return True
    if isinstance(value, dict):
        return set(value) in HASH_LAYOUTS and all(holds(backend, v) for v in value.values())
    text = str(value)
    return text.startswith("{") or _DECIMAL.fullmatch(text) is not None
