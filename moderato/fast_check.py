"""memory://'s commonest check in one C call (csrc/fast_check.c).

Both RateLimiters' ``check_with_info`` is an ``_accel.FastMethod``: a method
descriptor around the Python method. A check with a text identity, rate and
scope, no tenant, a cost of 1 and no burst, on a limiter over ``memory://``
with no metrics nor recorder attached, its breaker settled and no outage being
logged, and a plan already made for its rate and algorithm, is taken in C: the
keys, the store's decision and the result, by the very C functions the Python
path calls with the same arguments; shadow mode as the Python path applies it.
Every other check (and any whose keys C refuses) is the Python method's,
unchanged. Every condition is read on every call, so anything attached or
changed later counts from the next check.

The asyncio limiter's method then returns an ``_accel.ReadyCheck``, a
completed coroutine: awaited (or run by ``asyncio.run`` or a task) it returns
the result or raises the error. The check is decided when the method is
called rather than when it is first awaited; errors are raised when it is
awaited, as from a coroutine. The blocking limiter's returns the result.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _accel
from .backends.memory import MemoryBackend, _store_error, wall_clock_ms
from .backends.replies import decoded
from .errors import BackendError
from .limiter_core import GLOBAL_SCOPE, LimiterCore, shadowed
from .plans import Plan
from .results import CheckResult

F = Callable[..., Any]


def fast_method(function: F, *, blocking: bool) -> F:
    """``check_with_info``, taken in one C call when it can be (the module doc)."""
    method: F = _accel.FastMethod(function, blocking=blocking)
    return method


def fast_check_for(limiter: LimiterCore[Any, Any], backend: object) -> Optional[Any]:
    """What the one-call path reads for this limiter, or None when its backend is not
    ``memory://``'s own (a wrapped or another backend: every check the Python path's)."""
    if type(backend) is not MemoryBackend or limiter._node_of is not None:
        return None
    keyspace = limiter._keyspace
    plans = limiter._plans
    return _accel.FastCheck(
        prefix=keyspace.prefix,
        secret=keyspace.identity_secret,
        backend=backend,
        store=backend.store,
        defaults=plans.defaults,
        plans=plans,
        breaker=limiter.breaker,
        failure_log=limiter.failure_log,
        wall_clock=wall_clock_ms,
        finish=_finish,
        shadowed=shadowed,
        global_scope=GLOBAL_SCOPE,
    )


def _finish(
    limiter: LimiterCore[Any, Any],
    plan: Plan,
    scope: object,
    shadow: Optional[bool],
    reply: object,
    error: Optional[BaseException],
) -> CheckResult:
    """A one-call check whose decision did not give a result, the rest of the Python
    path's way: ``error`` raised by the clock or the store (a ValueError is the store's
    refusal), or a ``reply`` C did not decode. Through the breaker (``_failed``) and the
    failure policy (``_undecided``); no metrics nor recorder are attached on this path."""
    try:
        try:
            if error is None:
                result = decoded(plan, reply)  # raises the BackendError naming the script
            elif isinstance(error, ValueError):
                raise _store_error(plan.script_name, error) from None
            else:
                raise error
        except BaseException as raised:
            limiter._failed("decide", raised, limiter.breaker)
            raise
    except BackendError as raised:
        return limiter._undecided(plan, 1, raised)
    if not result.allowed and (limiter.shadow if shadow is None else shadow):
        result = shadowed(result, scope)
    return result
