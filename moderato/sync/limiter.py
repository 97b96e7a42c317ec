"""The blocking RateLimiter: moderato.RateLimiter's API and rules for threads, without asyncio."""

from __future__ import annotations

import ssl
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

from ..algorithms import DEFAULT_ALGORITHM
from ..backends.base import BlockingBackend
from ..backends.replies import DecisionReply, split_replies
from ..backends.schemes import make_blocking_backend
from ..breaker import CLOSED
from ..errors import BackendError, RateLimitConfigError
from ..failure_log import DEFAULT_INTERVAL_S
from ..fast_check import blocking_check, fast_check_for, fast_method
from ..fast_redis import redis_fast_check_for
from ..keys import Identity
from ..limiter_core import (
    GLOBAL_SCOPE,
    Decided,
    LimiterCore,
    ResetTargets,
    shadowed,
    tenant_alias,
    usage_of,
)
from ..options import count_option, seconds_option
from ..plans import Plan
from ..policy import SCALE, cost_scaled, validate_cost
from ..redis.blocking import DEFAULT_MAX_CONNECTIONS
from ..results import CheckResult
from ..specs import CallLimitOptions, CostOf, F, KeyOf, TenantOf, check_spec_types
from ..steps import run
from ..together import CallPart, Check, Together, TogetherCall

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")

__all__ = ["RateLimiter"]


class RateLimiter(LimiterCore[dict[str, Any], int]):
    """Decides whether a call may proceed, atomically, on Redis's clock; every method blocks.

    The asyncio ``moderato.RateLimiter``'s constructor, methods, results,
    exceptions and rules, for threads: Flask and Django views, Celery and RQ
    workers, scripts. A blocking limiter and an asyncio one on the same URL
    and ``key_prefix`` share every quota exactly: the same keys, the same Lua
    scripts, one decision per check in Redis.

    ``redis_url`` takes the same URLs (``redis://``, ``rediss://``,
    ``unix://``, ``redis+cluster://``, ``redis+sentinel://``, ``memory://``),
    or an application's own blocking ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` client (``moderato[redis-py]``), whose own
    settings then apply. Nothing connects until ``connect()`` or the first
    check.

    One limiter is safe to share between threads. Connections: a bounded
    pool of ``max_connections`` per Redis server (per node of a cluster); a
    thread that finds every one busy waits for one at most
    ``command_timeout_s``, then gets BackendError (never a hang). A connect
    takes at most ``connect_timeout_s``, a command ``command_timeout_s``.
    After ``fork()`` the child opens its own connections on first use.

    Failure policy, shadow mode, the circuit breaker, metrics and logs are
    the asyncio limiter's (see its docstring): fail closed by default
    (BackendError), ``fail_open=True`` lets checks through counted, and so
    on. ``key``, ``tenant`` and ``cost`` are the defaults of ``limit()``:
    values, or callables of the decorated function's arguments. The denial
    cache is the asyncio limiter's alone (``denial_cache_size`` must be 0);
    resets made here still reach the asyncio limiters' caches.
    """

    _other_limiters_options = (
        (
            "connections_per_loop",
            "is the asyncio RateLimiter's (connections per event loop); this blocking "
            "RateLimiter's pool is max_connections= (per Redis server)",
        ),
    )

    def __init__(
        self,
        redis_url: Union[str, Any] = "redis://localhost:6379",
        *,
        key_prefix: str = "moderato",
        default_algorithm: str = DEFAULT_ALGORITHM,
        enable_metrics: bool = False,
        fail_open: bool = False,
        identity_secret: Optional[bytes] = None,
        connect_timeout_s: float = 1.0,
        command_timeout_s: float = 0.5,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        ssl_context: Optional[ssl.SSLContext] = None,
        client_name: Optional[str] = None,
        shadow: bool = False,
        breaker_failures: int = 5,
        breaker_cooldown_s: float = 1.0,
        metrics_namespace: str = "moderato",
        metrics_registry: Optional[Any] = None,
        failure_log_interval_s: float = DEFAULT_INTERVAL_S,
        key: Optional[KeyOf] = None,
        tenant: Optional[TenantOf] = None,
        cost: Optional[CostOf] = None,
        denial_cache_size: int = 0,
    ) -> None:
        connect_timeout_s = seconds_option("connect_timeout_s", connect_timeout_s)
        command_timeout_s = seconds_option("command_timeout_s", command_timeout_s)
        max_connections = count_option("max_connections", max_connections)
        if denial_cache_size != 0:
            raise RateLimitConfigError(
                f"denial_cache_size={denial_cache_size!r}: the denial cache is the asyncio "
                "RateLimiter's; the blocking one asks Redis for every check (0 only)"
            )
        check_spec_types(key, tenant, cost, "the decorated function's arguments")
        self.key = key
        self.tenant = tenant
        self.cost = cost
        self.redis_url = redis_url
        self.max_connections = max_connections
        self._configure(
            key_prefix=key_prefix,
            default_algorithm=default_algorithm,
            enable_metrics=enable_metrics,
            fail_open=fail_open,
            identity_secret=identity_secret,
            shadow=shadow,
            breaker_failures=breaker_failures,
            breaker_cooldown_s=breaker_cooldown_s,
            metrics_namespace=metrics_namespace,
            metrics_registry=metrics_registry,
            failure_log_interval_s=failure_log_interval_s,
        )
        self._backend: BlockingBackend = make_blocking_backend(
            redis_url,
            connect_timeout_s=connect_timeout_s,
            command_timeout_s=command_timeout_s,
            max_connections=max_connections,
            ssl_context=ssl_context,
            client_name=client_name,
        )
        self._bound(self._backend)
        # The commonest check in one C call, on memory:// (fast_check.py) or one Redis
        # server (fast_redis.py); None: never.
        self._fast_check = fast_check_for(self, self._backend) or redis_fast_check_for(
            self, self._backend
        )

    @property
    def backend(self) -> BlockingBackend:
        """What decides this limiter's checks: a ``BlockingRedisBackend`` or a ``MemoryBackend``
        (whose ``clock`` tests may replace)."""
        return self._backend

    # -- lifecycle ---------------------------------------------------------------

    def connect(self) -> None:
        """Connect now (optional: checks connect lazily); raises BackendError on failure."""
        self._backend.connect_now()

    def close(self) -> None:
        """Stop what ``on_close`` registered (the dashboard's publisher: its thread ends,
        joined), then close the connections. The limiter stays usable: the next check
        reconnects, and a recorded limiter's publisher starts again with it."""
        try:
            self._close_hooks_called()
        finally:
            self._backend.close_now()

    def __enter__(self) -> RateLimiter:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    # -- decisions ---------------------------------------------------------------

    def check_with_info(
        self,
        key: Identity,
        rate: str,
        *,
        cost: int = 1,
        tenant_type: Optional[str] = None,
        scope: str = GLOBAL_SCOPE,
        algorithm: Optional[str] = None,
        shadow: Optional[bool] = None,
        tenant: Optional[str] = None,
        burst: Optional[int] = None,
    ) -> CheckResult:
        """Decide and charge; always returns a CheckResult, denied or not.

        ``shadow`` (default: the limiter's setting) turns a denial into an
        admission that is logged and counted as ``shadow_denied``. ``tenant``
        is an alias of ``tenant_type``. ``burst`` (token_bucket, gcra,
        leaky_bucket; a rate of one policy): the bucket holds ``burst`` requests
        and refills ``rate``'s limit per window (the result's ``limit`` is then the
        burst, its ``refill`` the rate's limit).
        """
        if tenant is not None:
            tenant_type = tenant_alias("check() or check_with_info()", tenant_type, tenant)
        plan = self._plans.get(rate, algorithm, burst)
        if type(cost) is not int or cost < 1:
            cost = validate_cost(cost)  # raises for anything but a positive int
        recorder = self.recorder
        timed = self.metrics is not None or recorder is not None
        started_s = time.perf_counter() if timed else 0.0
        try:
            charged_scaled = SCALE if cost == 1 else cost_scaled(cost)
            result = self._decision("decide", plan, key, tenant_type, scope, charged_scaled)
        except BackendError as error:
            if recorder is not None:
                return self._recorded_undecided(plan, cost, scope, error)
            return self._undecided(plan, cost, error)  # raises, or bypasses under fail-open
        if not result.allowed and (self.shadow if shadow is None else shadow):
            result = shadowed(result, scope)
        if self.metrics is not None:
            self._observe(plan, result, started_s)
        if recorder is not None:
            recorder.decided(plan, key, scope, result, started_s)
        return result

    check = blocking_check(check_with_info)

    def _usage(
        self, plan: Plan, key: Identity, tenant_type: Optional[str], scope: str
    ) -> dict[str, Any]:
        return usage_of(self._decision("usage", plan, key, tenant_type, scope, 0, apply=False))

    def _reset(self, targets: ResetTargets) -> int:
        backend = self._backend
        if targets.keys:
            deleted = self._guarded(
                "reset",
                lambda: backend.reset_now(targets.keys, targets.windows_s),
                route=targets.route,
            )
        else:
            deleted = self._guarded(
                "reset",
                lambda: sum(backend.delete_matching_now(p) for p in targets.patterns),
                route=targets.route,
            )
        # The asyncio limiters that remember denials of these keys forget them.
        backend.announce_reset_now()
        return deleted

    def limit(self, rate: str, **options: Unpack[CallLimitOptions]) -> Callable[[F], F]:
        """Decorate a plain function: every call is checked first, and a denied one raises
        RateLimitExceeded instead of running.

        ``key``, ``tenant`` and ``cost`` are values or callables taking the
        function's own arguments (default: the limiter's, else one quota for
        every call, no tenant, a cost of 1); ``scope`` defaults to the
        function's module and qualified name; ``burst`` as ``check``'s.
        Configuration errors (a bad rate, algorithm, burst or static cost)
        raise RateLimitConfigError here; a callback that raises fails the call
        with RateLimitCallbackError. The options are ``CallLimitOptions``
        (moderato.specs); another keyword raises UnknownOptionError.
        """
        from .decorator import limit

        return limit(self, rate, **options)

    # -- internals ---------------------------------------------------------------

    def _decision(
        self,
        operation: str,
        plan: Plan,
        key: object,
        tenant_type: Optional[str],
        scope: object,
        charged_scaled: int,
        *,
        apply: bool = True,
    ) -> CheckResult:
        """One decision (or peek) by the backend, through the circuit breaker of its node.

        _guarded's steps without its closure, as the asyncio limiter's _decision: this
        is every check's path, so a closed breaker is asked nothing and a settled one
        is told nothing.
        """
        backend = self._backend
        keys = backend.decision_keys(plan, key, tenant_type, scope)
        breaker = self.breaker if self._node_of is None else self._breaker_for(keys[0])
        if breaker.state != CLOSED and not breaker.allow():  # closed: allow() says yes
            raise self._short_circuit(operation, breaker)
        try:
            result = backend.check_now(plan, keys, charged_scaled, apply)
        except BaseException as error:
            self._failed(operation, error, breaker)
            raise
        if not breaker.settled or self.failure_log.active or self.metrics is not None:
            self._succeeded(operation, breaker)  # else it would change nothing
        return result

    def _check_together(self, checks: Sequence[Check]) -> Together:
        """``_decide_together``, each check's outcome told to the recorder if one is attached."""
        if self.recorder is None:
            return self._decide_together(checks)
        started_s = time.perf_counter()
        try:
            together = self._decide_together(checks)
        except BackendError as error:
            self._record_together(checks, None, started_s, error)
            raise
        self._record_together(checks, together, started_s)
        return together

    def _decide_together(self, checks: Sequence[Check]) -> Together:
        """Decide several checks as one (together.py), as the asyncio limiter's
        ``_decide_together`` does: admitted only if every one admits, and then every one
        is charged; when one refuses, none is (``LimiterCore._together_steps``)."""
        return run(self._together_steps(checks, self._backend.decision_keys), self._decide_checks)

    def _decide_checks(self, call: TogetherCall) -> Decided:
        return run(self._checks_decision(call), self._replies)

    def _replies(self, parts: list[CallPart]) -> Union[list[DecisionReply], BaseException]:
        """The backend's replies to these script calls, made as one; or what it raised."""
        backend = self._backend
        try:
            if len(parts) == 1:
                part = parts[0]
                reply = backend.decide_now(part.algorithm, part.keys, part.arguments)
                return split_replies([len(part.keys)], reply)
            return backend.decide_together_now([(p.algorithm, p.keys, p.arguments) for p in parts])
        except BaseException as error:  # the rules (_checks_decision) raise it
            return error

    def _guarded(
        self, operation: str, call: Callable[[], T], *, route: Optional[bytes] = None
    ) -> T:
        """Run one backend call through the circuit breaker of the node ``route`` lives on."""
        breaker = self._breaker_for(route)
        if not breaker.allow():
            raise self._short_circuit(operation, breaker)
        try:
            result = call()
        except BaseException as error:
            self._failed(operation, error, breaker)
            raise
        self._succeeded(operation, breaker)
        return result


# The commonest check on memory:// or one Redis server in one C call; any other, the
# method above (fast_check.py, fast_redis.py).
RateLimiter.check_with_info = fast_method(  # type: ignore[method-assign]
    RateLimiter.check_with_info, blocking=True
)
