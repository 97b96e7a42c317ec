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
stopped (``_rest``; ``fast_check.finish``): the command is never sent twice.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, Optional

from . import _accel
from .backends.blocking_redis import BlockingRedisBackend
from .backends.replies import translated
from .errors import BackendError
from .fast_check import finish, limiter_fields, told_breaker
from .limiter_core import LimiterCore
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
    return _accel.RedisFastCheck(
        **limiter_fields(limiter),
        client=client,
        load_script=load_script,
        rest=_rest,
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

    def replied() -> object:
        try:
            script = load_script(plan.script_name)
            return client.evalsha_rest(
                connection, taken_at, script, keys, plan.unit_args, data, error
            )
        except RedisClientError as raised:
            raise translated(raised, plan.algorithm.name) from None

    try:
        reply = told_breaker(limiter, replied)
    except BackendError as raised:
        return limiter._undecided(plan, 1, raised)
    return finish(limiter, plan, scope, shadow, reply, None)  # decoded there
