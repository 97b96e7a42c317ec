"""The blocking limiter's commonest check over one Redis server in one C call
(csrc/fast_redis.c).

The blocking RateLimiter's ``check_with_info`` is an ``_accel.FastMethod``
(fast_check.py). Over a ``BlockingRedisBackend`` whose client is moderato's own
``RedisClient`` on a plain TCP or unix connection (no TLS, no Cluster or
Sentinel, no redis-py client), on Linux, where the connections' sockets are
blocking with kernel timeouts, the limiter's ``_fast_check`` is an
``_accel.RedisFastCheck``: the commonest check (text identity, rate and scope,
no tenant, a cost of 1, no burst, a plan already made; no metrics nor recorder,
the breaker settled, no outage being logged) is then taken in C: the keys, the
EVALSHA, an idle connection of the pool taken and given back as
``RedisClient.evalsha()`` does it, one ``send()`` and one ``recv()`` with the GIL
released, the reply framed and the result built. Whatever C does not finish
after the send comes back here, to go on the Python path's way from where C
stopped (``_rest``, ``_finish``): the command is never sent twice.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, Optional

from . import _accel
from .backends.blocking_redis import BlockingRedisBackend
from .backends.replies import decoded, translated
from .errors import BackendError
from .limiter_core import GLOBAL_SCOPE, LimiterCore, shadowed
from .plans import Plan
from .redis.blocking.client import IDLE_CHECK_AFTER_S, RedisClient
from .redis.blocking.connection import BlockingConnection
from .redis.errors import RedisClientError
from .results import CheckResult
from .scripts import load_script

# Where a connection's socket is blocking with kernel timeouts (connection.py).
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")


def redis_fast_check_for(limiter: LimiterCore[Any, Any], backend: object) -> Optional[Any]:
    """What the one-call path reads for this blocking limiter, or None when its backend
    is not one plain Redis server through moderato's own client (every check then the
    Python path's)."""
    if not _KERNEL_TIMEOUTS or type(backend) is not BlockingRedisBackend:
        return None
    client = backend.client
    if type(client) is not RedisClient or client.address.tls or limiter._node_of is not None:
        return None
    keyspace = limiter._keyspace
    plans = limiter._plans
    return _accel.RedisFastCheck(
        prefix=keyspace.prefix,
        secret=keyspace.identity_secret,
        client=client,
        defaults=plans.defaults,
        plans=plans,
        breaker=limiter.breaker,
        failure_log=limiter.failure_log,
        load_script=load_script,
        finish=_finish,
        rest=_rest,
        global_scope=GLOBAL_SCOPE,
        idle_check_after_s=IDLE_CHECK_AFTER_S,
    )


def _rest(
    limiter: LimiterCore[Any, Any],
    plan: Plan,
    scope: object,
    shadow: Optional[bool],
    connection: BlockingConnection,
    taken_at: float,
    keys: list[bytes],
    data: Optional[bytes],
    error: Optional[BaseException],
) -> CheckResult:
    """A one-call check sent whose first read C did not take as a whole reply: ``data``,
    what that read returned, or ``error``, what the send or the read raised. The rest
    of ``RedisClient.evalsha()`` (the connection closed on a failure, NOSCRIPT repaired,
    the connection given back), then ``check_now``'s and ``_decision``'s steps and the
    failure policy, as the Python path takes them."""
    backend: Any = getattr(limiter, "_backend")  # noqa: B009 (the blocking limiter's)
    client: RedisClient = backend.client
    try:
        try:
            try:
                reply = client.evalsha_rest(
                    connection,
                    taken_at,
                    load_script(plan.script_name),
                    keys,
                    plan.unit_args,
                    data,
                    error,
                )
            except RedisClientError as raised:
                raise translated(raised, plan.algorithm.name) from None
            result = decoded(plan, reply)  # a malformed reply: the BackendError naming it
        except BaseException as raised:
            limiter._failed("decide", raised, limiter.breaker)
            raise
    except BackendError as raised:
        return limiter._undecided(plan, 1, raised)
    return _finish(limiter, plan, scope, shadow, reply, result)


def _finish(
    limiter: LimiterCore[Any, Any],
    plan: Plan,
    scope: object,
    shadow: Optional[bool],
    reply: object,
    result: Optional[CheckResult],
) -> CheckResult:
    """A one-call check whose reply was read whole, its connection given back, that C
    does not end itself: ``result`` None (``check_result`` refused the reply), a denial
    (shadow mode), or a breaker, outage log or metrics that changed during the round
    trip. ``_decision``'s and ``check_with_info``'s last steps."""
    breaker = limiter.breaker
    if result is None:
        try:
            try:
                result = decoded(plan, reply)
            except BaseException as raised:
                limiter._failed("decide", raised, breaker)
                raise
        except BackendError as raised:
            return limiter._undecided(plan, 1, raised)
    if not breaker.settled or limiter.failure_log.active or limiter.metrics is not None:
        limiter._succeeded("decide", breaker)
    if not result.allowed and (limiter.shadow if shadow is None else shadow):
        result = shadowed(result, scope)
    if limiter.metrics is not None:
        limiter._observe(plan, result, 0.0)  # attached during the check: untimed
    return result
