"""The asyncio limiter's commonest check over one Redis server in one C call
(csrc/fast_aredis.c).

The asyncio RateLimiter's ``check_with_info`` is an ``_accel.FastMethod``
(fast_check.py). Over a ``RedisBackend`` of its own, with or without the denial
cache, whose client is moderato's own asyncio ``RedisClient`` (TCP, TLS or
unix; no Cluster, Sentinel or redis-py client), the limiter's ``_fast_check``
is an ``_accel.AsyncRedisFastCheck``: the commonest check (text identity, rate and
scope, no tenant, a cost of 1, no burst, a plan already made; no metrics nor
recorder, the breaker settled, no outage being logged; a running loop whose
pool the client holds) then builds its keys and EVALSHA in C and queues it on
the connection ``RedisClient.evalsha()`` would choose, through that
connection's own ``send_script()``: pipelining, the command timeout, NOSCRIPT
repair and connection loss as for every command. It returns an
``_accel.PendingCheck``, a coroutine-like awaitable that waits on the
connection's future and builds the result from the reply in C. An error or a
cancellation thrown in, a reply that does not decode, a shadowed denial, or a
breaker, outage log, metrics or recorder that changed during the round trip
goes to ``_settle``: the Python path's steps from its await on. The command
is never sent twice.

With the denial cache (backends/denial_cache.py), C takes
``DenialCachingBackend``'s steps: a check whose identity the cache remembers
a denial for is declined before anything is sent (the Python path looks it
up: a local answer, or a send); any other is sent with the cache's ticket
(its clock and generation read before the send); an admitted reply forgets
the denial it contradicts, and a denial is remembered by ``_settle``
(``DenialCache.record``).

Like memory://'s one-call check, it is sent when called rather than when first
awaited (a coroutine of the Python path sends at its first step).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, cast

from . import _accel
from .backends.denial_cache import DenialCache, DenialCachingBackend
from .backends.redis import RedisBackend
from .backends.replies import decoded, translated
from .errors import BackendError
from .fast_check import limiter_fields
from .limiter_core import LimiterCore, shadowed
from .plans import Plan
from .policy import SCALE
from .redis.client import RedisClient
from .results import CheckResult
from .scripts import load_script


def async_redis_fast_check_for(limiter: LimiterCore[Any, Any], backend: object) -> Optional[Any]:
    """What the one-call path reads for this asyncio limiter, or None when its backend
    is not one Redis server through moderato's own client, its denials remembered or
    not (every check then the Python path's)."""
    cache: Optional[DenialCache] = None
    if type(backend) is DenialCachingBackend:
        cache = backend.cache
        backend = backend.backend
    if type(backend) is not RedisBackend or limiter._node_of is not None:
        return None
    client = backend.client
    if type(client) is not RedisClient:
        return None
    return _accel.AsyncRedisFastCheck(
        **limiter_fields(limiter, _settle),
        client=client,
        load_script=load_script,
        get_running_loop=asyncio.get_running_loop,
        cache=cache,
    )


def _settle(
    limiter: Any,
    plan: Plan,
    key: str,
    scope: str,
    shadow: Optional[bool],
    reply: object,
    error: Optional[BaseException],
    cache: Optional[DenialCache],
    first_key: Optional[bytes],
    issued_s: Optional[float],
    generation: Optional[int],
) -> CheckResult:
    """A one-call check whose outcome C does not end itself: ``error``, what its await
    raised (the client's error, a cancellation), or a ``reply`` that did not decode,
    a denial (shadow mode, or one the denial ``cache`` may remember), or a breaker,
    outage log, metrics or recorder that changed during the round trip.
    ``check_with_info``'s steps from its await on, as the Python path takes them (the
    check was sent untimed: no metrics nor recorder were attached); with the cache,
    its ticket (``first_key``, ``issued_s``, ``generation``) as
    ``DenialCachingBackend.finish_check`` reads it."""
    breaker = limiter.breaker
    try:
        try:
            if error is not None:
                refusal = translated(error, plan.algorithm.name)
                if refusal is error:
                    raise error
                raise refusal from None
            result = decoded(plan, reply)  # a malformed reply: the BackendError naming it
            if cache is not None:  # decoded cleanly: remembered, or the entry forgotten
                cache.record(
                    plan, cast(bytes, first_key), SCALE, cast(float, issued_s),
                    cast(int, generation), cast("list[int]", reply),
                )  # fmt: skip
        except BaseException as raised:
            limiter._failed("decide", raised, breaker)
            raise
        limiter._answered("decide", breaker)
    except BackendError as raised:
        if limiter.recorder is not None:
            recorded: CheckResult = limiter._recorded_undecided(plan, 1, scope, raised)
            return recorded
        undecided: CheckResult = limiter._undecided(plan, 1, raised)
        return undecided
    if not result.allowed and (limiter.shadow if shadow is None else shadow):
        result = shadowed(result, scope)
    if limiter.metrics is not None:
        limiter._observe(plan, result, 0.0)
    recorder = limiter.recorder
    if recorder is not None:
        recorder.decided(plan, key, scope, result, 0.0)
    return result
