"""reset.lua and the store's reset: what a reset deletes and what it refuses, on both
backends (the scripts on Redis at a test clock, memory://'s store: ``store``)."""

from __future__ import annotations

import pytest
from algorithm_behaviours import populated
from decision_stores import DecisionStore
from lua_calls import TAGS, decide, policy, state_key

from moderato.algorithms import ALGORITHMS, RESET_SUFFIXES
from moderato.errors import RedisReplyError

# The counting algorithms, and the three whose state is one key besides the base.
COUNTING = ["fixed_window", "token_bucket", "sliding_window"]
NEWER = ["gcra", "sliding_log", "leaky_bucket"]


async def test_algorithms_on_one_identity_use_separate_keys(store: DecisionStore) -> None:
    await store.set_clock(store.now_ms + 5000)
    for algorithm in ALGORITHMS:
        # each starts from a fresh quota, whatever the others stored
        reply = await decide(store, algorithm, [policy(algorithm, 10, 60)], 4000)
        assert reply[:4] == [1, 0, 6000, 0]
    keys = await store.keys()
    assert len(keys) == 6
    assert sorted(key.split(":")[1] for key in keys) == sorted(TAGS.values())
    assert set(keys) >= {state_key(a, policy(a, 10, 60)) for a in NEWER}
    bases = [policy(a, 10, 60).key for a in ALGORITHMS]
    deleted = await store.run("reset", bases, ["60"] * 6 + list(RESET_SUFFIXES))
    assert deleted == 6
    assert await store.keys() == []


async def test_reset_deletes_every_derived_key_of_the_given_bases(store: DecisionStore) -> None:
    t0 = store.now_ms
    for identity in ("alice", "bob"):
        for algorithm in COUNTING:
            for window_s in (1, 60):
                p = [policy(algorithm, 10, window_s, identity)]
                await decide(store, algorithm, p, 1000, at_ms=t0 + 59_500)
                await decide(store, algorithm, p, 1000, at_ms=t0 + 60_500)
    alice = [policy(a, 10, w, "alice").key for a in COUNTING for w in (1, 60)]
    # a legacy bucket and a key at the base itself go too
    await store.execute("SET", alice[2] + ":bucket", "1")
    await store.execute("SET", alice[0], "1")
    await store.expire_due(store.now_ms)  # the 1 s windows' counters of second 59
    bob_before = {k: v for k, v in (await store.snapshot()).items() if "bob" in k}
    alice_count = len([k for k in await store.keys() if "alice" in k])
    windows = ["1", "60"] * 3 + list(RESET_SUFFIXES)
    assert await store.run("reset", alice, windows) == alice_count
    remaining = await store.snapshot()
    assert remaining == bob_before
    assert await store.run("reset", alice, windows) == 0


async def test_reset_deletes_the_state_keys_of_gcra_log_and_leaky(store: DecisionStore) -> None:
    t0 = store.now_ms
    for identity in ("alice", "bob"):
        for algorithm in NEWER:
            for window_s in (1, 60):
                await decide(
                    store, algorithm, [policy(algorithm, 10, window_s, identity)], 1000, at_ms=t0
                )
    alice = [policy(a, 10, w, "alice").key for a in NEWER for w in (1, 60)]
    bob_before = {k: v for k, v in (await store.dump()).items() if "bob" in k}
    assert await store.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 6
    assert await store.dump() == bob_before
    assert await store.run("reset", alice, ["1", "60"] * 3 + list(RESET_SUFFIXES)) == 0


@pytest.mark.parametrize(
    ("keys", "args", "message"),
    [
        ([], [], "expected 1..256 keys"),
        ([f"k{i}" for i in range(257)], ["60"] * 258, "expected 1..256 keys"),
        (["k"], [], "expected one window_s argument per key (1) and then at least one"),
        (["k"], ["60"], "at least one state suffix, got 1 arguments"),
        (["k"], ["60", "bucket"], 'ARGV[2] (a state suffix) must be ":" and up to 31'),
        (["k"], ["60", ":" + "x" * 32], "ARGV[2] (a state suffix)"),
        (["k"], ["60", ":a b"], "ARGV[2] (a state suffix)"),
        (["k"], ["0", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k"], ["311040001", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k"], ["0311040001", ":log"], "ARGV[1] (window_s of KEYS[1])"),
        (["k", "j"], ["60", "1m", ":log"], "ARGV[2] (window_s of KEYS[2])"),
    ],
)
async def test_reset_refuses_bad_arguments(
    store: DecisionStore, keys: list[str], args: list[str], message: str
) -> None:
    before = await populated(store, "fixed_window")
    with pytest.raises(RedisReplyError) as refused:
        await store.run("reset", keys, args)
    assert refused.value.message.startswith("MODERATO_ARG ") and message in refused.value.message
    assert await store.dump() == before
