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

``check`` is the same ``FastMethod`` with ``then``: ``check_with_info``'s call
(its parameters, defined once, the one-call path included), whose result
``then`` makes ``check``'s answer (True, or the denial raised). The asyncio
limiter's ``then`` takes the awaitable of the result and returns a coroutine.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, cast

from . import _accel
from .backends.memory import MemoryBackend, _store_error, wall_clock_ms
from .backends.replies import decoded
from .errors import BackendError, exceeded
from .limiter_core import GLOBAL_SCOPE, LimiterCore, shadowed
from .plans import Plan
from .results import CheckResult

if TYPE_CHECKING:
    from typing import Concatenate, ParamSpec

    P = ParamSpec("P")
    L = TypeVar("L")

F = Callable[..., Any]
T = TypeVar("T")


def fast_method(function: F, *, blocking: bool) -> F:
    """``check_with_info``, taken in one C call when it can be (the module doc)."""
    method: F = _accel.FastMethod(function, blocking=blocking)
    return method


CHECK_DOC = """Charge ``cost`` if every policy of ``rate`` admits it; else raise RateLimitExceeded.

Returns True when admitted (also for a fail-open bypass or a shadow denial). Its
parameters are ``check_with_info``'s.
"""


def awaited_check(
    check_with_info: Callable[Concatenate[L, P], Coroutine[Any, Any, CheckResult]],
) -> Callable[Concatenate[L, P], Coroutine[Any, Any, bool]]:
    """The asyncio limiter's ``check``: ``check_with_info``'s call, then True or the
    denial raised (the module doc)."""
    return _check_method(check_with_info, _admitted_when_awaited, blocking=False)


def blocking_check(
    check_with_info: Callable[Concatenate[L, P], CheckResult],
) -> Callable[Concatenate[L, P], bool]:
    """The blocking limiter's ``check``: ``check_with_info``'s call, then True or the
    denial raised (the module doc)."""
    return _check_method(check_with_info, _admitted, blocking=True)


def _check_method(function: F, then: F, *, blocking: bool) -> F:
    signature = inspect.signature(function).replace(return_annotation="bool")
    method: F = _accel.FastMethod(
        function, blocking=blocking, then=then, name="check", doc=CHECK_DOC, signature=signature
    )
    return method


def _admitted(result: CheckResult) -> bool:
    """``check``'s answer: True when admitted (a shadowed denial and a fail-open
    bypass are), else the denial raised."""
    if result.allowed:
        return True
    raise exceeded(result)


async def _admitted_when_awaited(outcome: Awaitable[CheckResult]) -> bool:
    return _admitted(await outcome)


def fast_check_for(limiter: LimiterCore[Any, Any], backend: object) -> Optional[Any]:
    """What the one-call path reads for this limiter, or None when its backend is not
    ``memory://``'s own (a wrapped or another backend: every check the Python path's)."""
    if type(backend) is not MemoryBackend or limiter._node_of is not None:
        return None
    return _accel.FastCheck(
        **limiter_fields(limiter),
        backend=backend,
        store=backend.store,
        wall_clock=wall_clock_ms,
        shadowed=shadowed,
    )


def limiter_fields(
    limiter: LimiterCore[Any, Any], end: Optional[Callable[..., CheckResult]] = None
) -> _accel._LimiterFields:
    """What every one-call check (this one, fast_redis.py's and fast_aredis.py's) reads
    of the limiter, and the one Python end of a check C took but does not end
    (``finish``; ``end`` instead where given: the asyncio check over Redis's
    ``_settle``): their C objects' common head (csrc/fast_common.h), as constructor
    keywords."""
    keyspace = limiter._keyspace
    plans = limiter._plans
    return {
        "prefix": keyspace.prefix,
        "secret": keyspace.identity_secret,
        "defaults": plans.defaults,
        "plans": plans,
        "breaker": limiter.breaker,
        "failure_log": limiter.failure_log,
        "global_scope": GLOBAL_SCOPE,
        "finish": finish if end is None else end,
    }


def told_breaker(limiter: LimiterCore[Any, Any], step: Callable[[], T]) -> T:
    """``step()`` of a one-call check that C did not end, whatever it raises told to
    the breaker first (``_failed``), as ``_decision`` tells it; the caller then takes a
    BackendError through the failure policy (``_undecided``)."""
    try:
        return step()
    except BaseException as raised:
        limiter._failed("decide", raised, limiter.breaker)
        raise


def finish(
    limiter: LimiterCore[Any, Any],
    plan: Plan,
    scope: object,
    shadow: Optional[bool],
    reply: object,
    outcome: Optional[object],
) -> CheckResult:
    """A one-call check (this one or fast_redis.py's) that C took as far as the store's
    or the server's reply but does not end itself, the rest of the Python path's way.
    ``outcome`` is what C made of it: a CheckResult (a denial, for shadow mode; or a
    breaker, outage log or metrics that changed meanwhile), what the clock or the store
    raised (a ValueError is the store's refusal), or None: ``reply``, which C did not
    decode. Through the breaker and the failure policy, then ``_decision``'s and
    ``check_with_info``'s last steps."""
    breaker = limiter.breaker
    if not isinstance(outcome, CheckResult):

        def result() -> CheckResult:
            if outcome is None:
                return decoded(plan, reply)  # raises the BackendError naming the script
            if isinstance(outcome, ValueError):
                raise _store_error(plan.script_name, outcome) from None
            raise cast(BaseException, outcome)

        try:
            outcome = told_breaker(limiter, result)
        except BackendError as raised:
            return limiter._undecided(plan, 1, raised)
    if not breaker.settled or limiter.failure_log.active or limiter.metrics is not None:
        limiter._succeeded("decide", breaker)
    if not outcome.allowed and (limiter.shadow if shadow is None else shadow):
        outcome = shadowed(outcome, scope)
    if limiter.metrics is not None:
        limiter._observe(plan, outcome, 0.0)  # attached during the check: untimed
    return outcome
