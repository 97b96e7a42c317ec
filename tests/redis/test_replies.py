"""moderato/backends/replies.py: one reading of refusals and replies for every backend.

The mapping itself, then the same refusals through Redis and through
memory://, which must raise the same exception with the same words.
"""

from __future__ import annotations

import re
import time

import pytest
from redis_servers import RedisServer

from moderato import BackendError, RateLimitConfigError, RateLimiter
from moderato.backends.memory import MemoryBackend
from moderato.backends.replies import (
    ALLOWED,
    DECIDING,
    POLICY_FIELDS,
    RETRY,
    policy_at,
    refusal,
    reply_size,
    split_replies,
)

NOW_MS = 1_800_000_000_000  # memory://'s clock: a minute window starts here


def test_each_prefix_maps_to_one_exception() -> None:
    argument = refusal("gcra", "MODERATO_ARG ARGV[3] (window_s of policy 1) must be ...")
    assert type(argument) is RateLimitConfigError
    assert str(argument) == "gcra: MODERATO_ARG ARGV[3] (window_s of policy 1) must be ..."
    state = refusal("gcra", 'MODERATO_STATE key "k:gcra" holds "x"')
    assert type(state) is BackendError
    assert str(state) == 'gcra: MODERATO_STATE key "k:gcra" holds "x"'
    denied = refusal("gcra", "MODERATO_STATE key k cannot be read: NOPERM no access")
    assert str(denied).startswith("NOPERM: the Redis user may not run a command the gcra script")
    assert str(refusal("gcra", "OOM command not allowed")) == "OOM command not allowed"
    foreign = refusal("gcra", "clock out of range", foreign="memory:// gcra: ")
    assert (type(foreign), str(foreign)) == (BackendError, "memory:// gcra: clock out of range")


def test_the_reply_layout_is_named_once() -> None:
    reply = [0, 1, 5000, 0, 60_000, 0, 1500, 61_000]  # two policies, the second denies
    assert (reply[ALLOWED], reply[DECIDING]) == (0, 1)
    assert reply[policy_at(reply[DECIDING]) + RETRY] == 1500
    assert reply_size(2) == len(reply) and POLICY_FIELDS == 3
    # Two decisions of one policy each, taken as one call: one reply after the other.
    together = [1, 0, 4000, 0, 60_000, 0, 0, 0, 1500, 61_000]
    assert split_replies([1, 1], together) == [together[:5], together[5:]]
    assert split_replies([2], reply) == [reply]
    with pytest.raises(BackendError, match="8 fields for 2 parts that need 10"):
        split_replies([1, 1], reply)


@pytest.mark.parametrize("url", ["memory://", "redis"])
async def test_both_backends_word_their_refusals_alike(url: str, redis_server: RedisServer) -> None:
    redis_server.command("FLUSHALL")
    limiter = RateLimiter(redis_server.url if url == "redis" else url, key_prefix="rf")
    try:
        backend = limiter.backend
        if isinstance(backend, MemoryBackend):
            backend.clock = lambda: NOW_MS
            window = NOW_MS // 60_000
            backend.store.load(b"k:%d" % window, -5, -1)
        else:
            window = int(time.time()) // 60
            for index in (window, window + 1):  # whichever minute the script reads
                redis_server.command("SET", f"k:{index}", "-5")
        with pytest.raises(BackendError) as state:
            await backend.decide(b"k", capacity_scaled=5000, window_s=60)
        assert re.fullmatch(
            r'fixed_window: MODERATO_STATE key "k:\d+" holds "-5", '
            r"not a decimal integer 0\.\.9007199254740992",
            str(state.value),
        ), state.value
        with pytest.raises(RateLimitConfigError) as argument:
            await backend.decide(b"k", capacity_scaled=0, window_s=60)
        assert str(argument.value).startswith("fixed_window: MODERATO_ARG ARGV[3]")
    finally:
        await limiter.close()
