"""Several checks decided as one by the blocking RateLimiter (moderato.sync), exactly.

The asyncio limiter's together-step (tests/redis/test_together.py) for threads: the
same rules (limiter_core.py ``_together_steps``), the same composite script in
Redis, the same in-process step on memory://. Each case runs on a real
redis-server, through moderato's own blocking client and a user's redis.Redis,
and on memory:// with a frozen clock.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from redis_servers import PATIENT_TIMEOUT_S, RedisServer

from moderato import BackendError, RateLimitConfigError
from moderato.algorithms import ALGORITHMS
from moderato.sync import RateLimiter
from moderato.together import Check

FROZEN_MS = 1_800_000_030_000


@pytest.fixture(params=["memory", "built-in", "redis-py"])
def limiter(request: pytest.FixtureRequest) -> Iterator[RateLimiter]:
    if request.param == "memory":
        limiter = RateLimiter("memory://", key_prefix="tg")
        limiter.backend.clock = lambda: FROZEN_MS  # type: ignore[attr-defined]
        with limiter:
            yield limiter
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    server.command("FLUSHALL")
    if request.param == "built-in":
        with RateLimiter(
            server.url, command_timeout_s=PATIENT_TIMEOUT_S, key_prefix="tg"
        ) as limiter:
            yield limiter
        return
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        with RateLimiter(client, key_prefix="tg") as limiter:
            yield limiter
    finally:
        client.close()


def current(limiter: RateLimiter, check: Check) -> int:
    usage = limiter.get_usage(check.key, check.rate, scope=check.scope, algorithm=check.algorithm)
    used: int = usage["current"]
    return used


def admitted(limiter: RateLimiter, checks: list[Check], attempts: int) -> list[bool]:
    return [limiter._check_together(checks).allowed for _ in range(attempts)]


# Day windows: no refill, leak or rollover shows within a test.
PAIRS = list(itertools.product(ALGORITHMS, repeat=2))


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_every_pair_of_algorithms_is_all_or_nothing(
    limiter: RateLimiter, first: str, second: str
) -> None:
    # 5/day at cost 2 admits two requests; 3/day at cost 1 would admit three alone.
    wide = Check("user", "3/day", "wide", cost=1, algorithm=first)
    costly = Check("user", "5/day", "costly", cost=2, algorithm=second)
    assert admitted(limiter, [wide, costly], 4) == [True, True, False, False]
    assert (current(limiter, wide), current(limiter, costly)) == (2, 4)
    # The refusals charged nothing: the first limit still has its third request.
    assert admitted(limiter, [wide], 2) == [True, False]


def test_an_app_wide_limit_is_not_charged_for_what_a_narrower_one_refuses(
    limiter: RateLimiter,
) -> None:
    app = Check("client", "5/minute", "app")
    view = Check("client", "2/minute", "GET:/narrow")
    assert admitted(limiter, [app, view], 4) == [True, True, False, False]
    assert current(limiter, app) == 2
    # Another path finds the app-wide limit's three other requests.
    other = Check("client", "10/minute", "GET:/other")
    assert admitted(limiter, [app, other], 4) == [True, True, True, False]


def test_a_refused_request_writes_nothing(redis_server: RedisServer) -> None:
    redis_server.command("FLUSHALL")
    with RateLimiter(redis_server.url, key_prefix="tg") as limiter:
        checks = [Check("user", "2/day", "a", algorithm=name) for name in ALGORITHMS] + [
            Check("user", "1/day", "last", cost=1, algorithm="token_bucket")
        ]
        assert limiter._check_together(checks).allowed
        before = _dump(redis_server)
        assert not limiter._check_together(checks).allowed
        assert _dump(redis_server) == before


def _dump(server: RedisServer) -> dict[bytes, bytes]:
    keys = re.findall(rb"\$\d+\r\n([^\r]+)\r\n", server.command("KEYS", "*"))
    return {key: server.command("DUMP", key.decode()) for key in sorted(keys)}


def test_the_deciding_check_waits_longest_or_has_fewest_left(limiter: RateLimiter) -> None:
    minute = Check("user", "2/minute", "minute")
    day = Check("user", "5/day", "day")
    first = limiter._check_together([day, minute])
    assert (first.allowed, first.deciding) == (True, 1)  # 1 left of 2, 4 of 5
    limiter._check_together([day, minute])
    refused = limiter._check_together([day, minute])
    assert (refused.allowed, refused.deciding) == (False, 1)
    day_result, minute_result = refused.results
    assert day_result is not None and minute_result is not None
    assert (day_result.allowed, day_result.remaining, day_result.retry_after) == (True, 3, 0)
    assert (minute_result.allowed, minute_result.remaining) == (False, 0)


def test_a_part_that_fit_reports_its_quota_uncharged(limiter: RateLimiter) -> None:
    roomy = Check("user", "10/day", "roomy", algorithm="sliding_log")
    tight = Check("user", "1/day", "tight", algorithm="gcra")
    assert limiter._check_together([roomy, tight]).allowed
    refused = limiter._check_together([roomy, tight])
    roomy_result = refused.results[0]
    assert not refused.allowed and roomy_result is not None
    assert (roomy_result.allowed, roomy_result.remaining) == (True, 9)
    assert current(limiter, roomy) == 1


def test_more_policies_than_one_call_takes(limiter: RateLimiter) -> None:
    checks = [Check("user", f"{n + 2}/day", f"scope-{n}") for n in range(17)]
    checks.append(Check("user", "1/day", "tightest"))
    assert admitted(limiter, checks, 2) == [True, False]
    assert [current(limiter, check) for check in checks] == [1] * 18


def test_checks_that_would_share_a_key_are_refused(limiter: RateLimiter) -> None:
    with pytest.raises(RateLimitConfigError, match="would count in one counter"):
        limiter._check_together([Check("user", "10/minute", "x"), Check("user", "4/minute", "x")])


def test_shadow_checks_are_decided_after_and_never_refuse(limiter: RateLimiter) -> None:
    enforced = Check("user", "3/day", "enforced")
    observed = Check("user", "1/day", "observed", shadow=True)
    decisions = [limiter._check_together([observed, enforced]) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    second = decisions[1].results[0]
    assert second is not None and second.shadow_denied and second.allowed
    assert decisions[3].results[0] is None
    assert (current(limiter, observed), current(limiter, enforced)) == (1, 3)


def test_fail_open_bypasses_every_check_of_a_call(own_redis_server: RedisServer) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        fail_open=True,
        metrics_registry=CollectorRegistry(),
        connect_timeout_s=0.2,
    )
    own_redis_server.stop()
    decision = limiter._check_together(
        [Check("user", "3/day", "a"), Check("user", "5/day", "b", algorithm="gcra")]
    )
    assert decision.allowed
    assert all(r is not None and r.bypassed and r.remaining is None for r in decision.results)
    with pytest.raises(BackendError):
        limiter._check_together(
            [Check("user", "3/day", "a"), Check("user", "5/day", "b", cost=6, algorithm="gcra")]
        )
    limiter.close()


def test_unreadable_state_in_one_part_is_a_backend_error(redis_server: RedisServer) -> None:
    redis_server.command("FLUSHALL")
    with RateLimiter(redis_server.url, key_prefix="tg") as limiter:
        good = Check("user", "3/day", "good")
        broken = Check("user", "3/day", "broken", algorithm="token_bucket")
        assert limiter._check_together([good, broken]).allowed
        keys = re.findall(rb"tg:tb:[^\r]+", redis_server.command("KEYS", "tg:tb:*"))
        for key in keys:
            redis_server.command("SET", key.decode(), "not a hash")
        with pytest.raises(BackendError, match=r"MODERATO_STATE key .* cannot be read"):
            limiter._check_together([good, broken])
        assert current(limiter, good) == 1


def test_a_sync_and_an_asyncio_limiter_decide_together_on_one_quota(
    redis_server: RedisServer,
) -> None:
    import asyncio

    import moderato

    redis_server.command("FLUSHALL")
    app = Check("client", "5/minute", "app")
    view = Check("client", "2/minute", "GET:/narrow")
    with RateLimiter(redis_server.url, key_prefix="tg") as blocking:
        assert admitted(blocking, [app, view], 3) == [True, True, False]

        async def asyncio_side() -> list[bool]:
            async with moderato.RateLimiter(redis_server.url, key_prefix="tg") as limiter:
                return [(await limiter._check_together([app, view])).allowed]

        assert asyncio.run(asyncio_side()) == [False]
        assert current(blocking, app) == 2


def test_checks_in_two_cluster_slots_are_refused_before_any_call() -> None:
    limiter = RateLimiter("redis+cluster://127.0.0.1:1")
    with pytest.raises(RateLimitConfigError, match="different Redis Cluster slots"):
        limiter._check_together(
            [Check("user", "10/minute", "app"), Check("user", "4/minute", "GET:/x")]
        )
