"""RateLimiter: the manual API every integration is built on."""

from __future__ import annotations

import ssl
import time
from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union, cast

from .algorithms import DEFAULT_ALGORITHM
from .backends.base import AsyncBackend, Backend, SynchronousBackend
from .backends.denial_cache import with_denial_cache
from .backends.replies import DecisionReply, split_replies
from .backends.schemes import make_backend
from .breaker import CLOSED, CircuitBreaker
from .errors import BackendError
from .errors import exceeded as exceeded  # its home is errors.py; kept importable here
from .failure_log import DEFAULT_INTERVAL_S
from .fast_aredis import async_redis_fast_check_for
from .fast_check import awaited_check, fast_check_for, fast_method
from .keys import Identity
from .limiter_core import GLOBAL_SCOPE as GLOBAL_SCOPE
from .limiter_core import Decided, LimiterCore, ResetTargets, shadowed, tenant_alias, usage_of
from .options import count_option, seconds_option
from .plans import Plan
from .policy import SCALE, cost_scaled, validate_cost
from .recording import CheckRecorder
from .results import CheckResult
from .specs import (
    CostSpec,
    F,
    KeySpec,
    MessageChecker,
    MessageOptions,
    RateLimitDependency,
    RateSpec,
    RuleOptions,
    TenantSpec,
    check_specs,
)
from .steps import run_async
from .together import CallPart, Check, Together, TogetherCall

T = TypeVar("T")

if TYPE_CHECKING:
    from typing_extensions import Unpack


class RateLimiter(LimiterCore[Awaitable[dict[str, Any]], Awaitable[int]]):
    """Decides whether a request may proceed, atomically, on Redis's clock.

    ``redis_url`` selects the backend: ``redis://``, ``rediss://`` (TLS),
    ``unix://``, ``redis+cluster://host:port[,host:port...]`` (a Redis
    Cluster from its seed nodes), ``redis+sentinel://host:port[,...]/service``
    (the primary the sentinels name) or ``memory://`` (in process); or, instead
    of a URL, an application's own ``redis.asyncio.Redis`` or ``RedisCluster``
    client (``moderato[redis-py]``), whose own settings then apply. Nothing
    connects until ``connect()`` or the first check, so an application can
    start while Redis is down.

    Failure policy: by default a check Redis cannot decide raises
    ``BackendError`` (fail closed). ``fail_open=True`` lets it through
    instead, logged and counted in metrics (which it therefore turns on).
    ``shadow=True`` decides and counts but never denies, for rolling out a
    new limit. After ``breaker_failures`` consecutive backend failures,
    checks fail fast for ``breaker_cooldown_s`` before one probe is tried.

    Logs survive an outage: its first failure is logged at once, then at
    most one summary per ``failure_log_interval_s`` (counts of bypassed and
    denied checks and of backend errors), and one line when the backend
    answers again (``failure_log``, an OutageLog; tests may replace its
    ``clock``). Metrics still count every event.

    ``key``, ``tenant`` and ``cost`` are the defaults of every HTTP rule
    (decorator, dependency, middleware, message limit) that does not set its
    own: values or callbacks of the request, as the rules take them. By
    default the client address, no tenant, and a cost of 1.

    Every check is one script call to Redis, which decides it. Opt-in, on a
    single server: ``denial_cache_size=N`` remembers up to N identities'
    denials and repeats them without a Redis call until they could end
    (undone in every process by ``reset()``, but not by keys deleted by hand,
    for up to 10 s); docs/operations.md ("The denial cache") says when it
    pays and what it changes. The default, 0, keeps it off.
    """

    _start_check: Callable[..., Union[Awaitable[Any], CheckResult]]
    """The remote backend's ``start_check``, bound once (every check calls it)."""

    _other_limiters_options = (
        (
            "max_connections",
            "is moderato.sync.RateLimiter's pool size; this asyncio RateLimiter multiplexes "
            "its commands over connections_per_loop= connections per event loop",
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
        # Two connections let Redis work on one batch while this process handles
        # the other's replies; with one they take turns (see BENCHMARKS.md).
        connections_per_loop: int = 2,
        ssl_context: Optional[ssl.SSLContext] = None,
        client_name: Optional[str] = None,
        shadow: bool = False,
        breaker_failures: int = 5,
        breaker_cooldown_s: float = 1.0,
        metrics_namespace: str = "moderato",
        metrics_registry: Optional[Any] = None,
        failure_log_interval_s: float = DEFAULT_INTERVAL_S,
        key: Optional[KeySpec] = None,
        tenant: Optional[TenantSpec] = None,
        cost: Optional[CostSpec] = None,
        denial_cache_size: int = 0,
    ) -> None:
        connect_timeout_s = seconds_option("connect_timeout_s", connect_timeout_s)
        command_timeout_s = seconds_option("command_timeout_s", command_timeout_s)
        connections_per_loop = count_option("connections_per_loop", connections_per_loop)
        self.key = key
        self.tenant = tenant
        self.cost = cost
        check_specs(key=key, tenant=tenant, cost=cost)
        self.redis_url = redis_url
        self.connections_per_loop = connections_per_loop
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
        # Denials repeated locally until they expire (backends/denial_cache.py): opt-in,
        # a single server only; 0 (the default) leaves every decision to Redis.
        self._backend: Backend = with_denial_cache(
            make_backend(
                redis_url,
                connect_timeout_s=connect_timeout_s,
                command_timeout_s=command_timeout_s,
                connections_per_loop=connections_per_loop,
                ssl_context=ssl_context,
                client_name=client_name,
            ),
            denial_cache_size,
            key_prefix=key_prefix,
            breaker=self.breaker,
            metrics=self.metrics,
        )
        self._bound(self._backend)
        # An in-process backend decides without waiting: checks call it directly;
        # a remote one hands over its client's future, awaited here.
        self._check_now: Optional[Callable[..., CheckResult]] = None
        # Used only when the backend is not synchronous (typed once here, not per check).
        self._remote = cast(AsyncBackend, self._backend)
        if self._backend.synchronous:
            self._check_now = cast(SynchronousBackend, self._backend).check_now
        else:
            self._start_check = self._remote.start_check
        self.recorder: Optional[CheckRecorder] = None
        """Told every check's outcome when set (recording.py; the operator's dashboard
        attaches one); None, the default, keeps the check path free of it."""
        # memory://'s commonest check in one C call (fast_check.py), or one Redis
        # server's (fast_aredis.py); None: never.
        self._fast_check = fast_check_for(self, self._backend) or async_redis_fast_check_for(
            self, self._backend
        )

    @property
    def backend(self) -> Backend:
        """What decides this limiter's checks: a ``RedisBackend`` or a ``MemoryBackend``.

        For tests on ``memory://``: its ``clock`` attribute (a callable
        returning Unix milliseconds) can be replaced to drive time by hand.
        """
        return self._backend

    # -- lifecycle ---------------------------------------------------------------

    async def connect(self) -> None:
        """Connect now (optional: checks connect lazily); raises BackendError on failure."""
        await self._backend.connect()

    async def close(self) -> None:
        """Stop what ``on_close`` registered (the dashboard's publisher: its task ends,
        awaited), then close the connections. The limiter stays usable: the next check
        reconnects, and a recorded limiter's publisher starts again with it."""
        try:
            await self._close_hooks_awaited()
        finally:
            await self._backend.close()

    async def __aenter__(self) -> RateLimiter:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        await self.close()

    # -- decisions ---------------------------------------------------------------

    async def check_with_info(
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
        plans = self._plans
        try:  # the commonest checks' plans, by rate text alone or with the algorithm's name
            if burst is None:
                plan = plans.defaults[rate] if algorithm is None else plans._plans[rate, algorithm]
            else:
                plan = plans.get(rate, algorithm, burst)
        except (KeyError, TypeError):  # a rate not seen yet, or not text (refused here)
            plan = plans.get(rate, algorithm, burst)
        if type(cost) is not int or cost < 1:
            cost = validate_cost(cost)  # raises for anything but a positive int
        timed = self.metrics is not None or self.recorder is not None
        started_s = time.perf_counter() if timed else 0.0
        try:
            charged_scaled = SCALE if cost == 1 else cost_scaled(cost)
            decision = self._decision("decide", plan, key, tenant_type, scope, charged_scaled)
            result = (
                decision if type(decision) is CheckResult else await decision  # type: ignore[misc]
            )
        except BackendError as error:
            if self.recorder is not None:
                return self._recorded_undecided(plan, cost, scope, error)
            return self._undecided(plan, cost, error)  # raises, or bypasses under fail-open
        if not result.allowed and (self.shadow if shadow is None else shadow):
            result = shadowed(result, scope)
        if self.metrics is not None:
            self._observe(plan, result, started_s)
        recorder = self.recorder
        if recorder is not None:
            recorder.decided(plan, key, scope, result, started_s)
        return result

    check = awaited_check(check_with_info)

    async def _usage(
        self, plan: Plan, key: Identity, tenant_type: Optional[str], scope: str
    ) -> dict[str, Any]:
        result = self._decision("usage", plan, key, tenant_type, scope, 0, apply=False)
        if type(result) is not CheckResult:
            result = await result  # type: ignore[misc]
        return usage_of(result)

    async def _reset(self, targets: ResetTargets) -> int:
        if targets.keys:
            call = self._backend.reset(targets.keys, targets.windows_s)
        else:
            call = self._delete_matching(targets.patterns)
        deleted: int = await self._guarded("reset", call, route=targets.route)
        # Whoever remembers denials of these keys forgets them (backends/announce.py).
        await self._backend.announce_reset()
        return deleted

    async def _delete_matching(self, patterns: list[bytes]) -> int:
        deleted = 0
        for pattern in patterns:  # disjoint patterns: the counts add up
            deleted += await self._backend.delete_matching(pattern)
        return deleted

    # -- internals ---------------------------------------------------------------

    async def _guarded(
        self, operation: str, call: Awaitable[T], *, route: Optional[bytes] = None
    ) -> T:
        """Run one backend call through the circuit breaker of the node ``route`` lives on."""
        breaker = self._breaker_for(route)
        if not breaker.allow():
            _discard(call)
            raise self._short_circuit(operation, breaker)
        try:
            result = await call
        except BaseException as error:
            self._failed(operation, error, breaker)
            raise
        self._succeeded(operation, breaker)
        return result

    async def _check_together(self, checks: Sequence[Check]) -> Together:
        """``_decide_together``, each check's outcome told to the recorder if one is attached."""
        if self.recorder is None:
            return await self._decide_together(checks)
        started_s = time.perf_counter()
        try:
            together = await self._decide_together(checks)
        except BackendError as error:
            self._record_together(checks, None, started_s, error)
            raise
        self._record_together(checks, together, started_s)
        return together

    async def _decide_together(self, checks: Sequence[Check]) -> Together:
        """Decide several checks as one (together.py): admitted only if every one admits,
        and then every one is charged; when one refuses, none is (the rules:
        ``LimiterCore._together_steps``)."""
        steps = self._together_steps(checks, self._backend.decision_keys)
        return await run_async(steps, self._decide_checks)

    def _decide_checks(self, call: TogetherCall) -> Awaitable[Decided]:
        return run_async(self._checks_decision(call), self._replies)

    async def _replies(self, parts: list[CallPart]) -> Union[list[DecisionReply], BaseException]:
        """The backend's replies to these script calls, made as one; or what it raised."""
        backend = self._backend
        try:
            if len(parts) == 1:
                part = parts[0]
                reply = await backend.direct_reply(part.algorithm, part.keys, part.arguments)
                return split_replies([len(part.keys)], reply)
            return await backend.decide_together(
                [(p.algorithm, p.keys, p.arguments) for p in parts]
            )
        except BaseException as error:  # the rules (_checks_decision) raise it
            return error

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
    ) -> Union[CheckResult, Awaitable[CheckResult]]:
        """One decision (or peek) by the backend, through the circuit breaker: the
        result itself from a backend that answers at once (memory://: no coroutine
        on its checks' path), else a coroutine to await for it.

        _guarded's steps (allow, _short_circuit, _failed, _succeeded) without its
        coroutine: this is the path of every check.
        """
        keys = self._backend.decision_keys(plan, key, tenant_type, scope)  # the backend's keys
        breaker = self.breaker if self._node_of is None else self._breaker_for(keys[0])
        if breaker.state != CLOSED and not breaker.allow():  # closed: allow() says yes
            raise self._short_circuit(operation, breaker)
        check_now = self._check_now
        if check_now is None:
            return self._remote_decision(operation, plan, keys, breaker, charged_scaled, apply)
        try:
            result = check_now(plan, keys, charged_scaled, apply)
        except BaseException as error:
            self._failed(operation, error, breaker)
            raise
        if not breaker.settled or self.failure_log.active or self.metrics is not None:
            self._succeeded(operation, breaker)  # else it would change nothing
        return result

    async def _remote_decision(
        self,
        operation: str,
        plan: Plan,
        keys: list[bytes],
        breaker: CircuitBreaker,
        charged_scaled: int,
        apply: bool,
    ) -> CheckResult:
        """``_decision`` by a remote backend: its client's future, awaited here."""
        try:
            pending = self._start_check(plan, keys, charged_scaled, apply)
            if type(pending) is CheckResult:
                # Answered without asking (a denial the backend remembers): no
                # backend call was made, so the breaker and its metrics saw none.
                return pending
            try:
                reply = await pending  # type: ignore[misc]  # not a CheckResult: awaitable
            except BaseException as error:  # the client's own errors, translated here
                refusal = self._remote.check_failed(plan, pending, error)
                if refusal is error:
                    raise
                raise refusal from None
            result = self._remote.finish_check(plan, pending, reply)
        except BaseException as error:
            self._failed(operation, error, breaker)
            raise
        self._answered(operation, breaker)
        return result

    def _answered(self, operation: str, breaker: CircuitBreaker) -> None:
        """``_succeeded``, unless it would change nothing (a closed breaker that counted
        no failure, no outage being logged, no metrics): the remote check's last step
        (memory://'s checks ask the same inline)."""
        if not breaker.settled or self.failure_log.active or self.metrics is not None:
            self._succeeded(operation, breaker)

    # -- HTTP integration (moderato.integrations) ---------------------------------
    #
    # The one way the core reaches the web layer, and only when called: these
    # conveniences import moderato.integrations inside the method, so
    # importing (or using) the manual API never loads Starlette. Nothing in
    # the integrations is imported at module level here; the integrations
    # import the core, never the other way round (docs/architecture.md).

    def limit(self, rate: RateSpec, **options: Unpack[RuleOptions]) -> Callable[[F], F]:
        """Decorate a FastAPI or Starlette endpoint (``async def`` or ``def``) with a limit.

        ``rate``, ``key``, ``tenant`` and ``cost`` may be values or callbacks of the
        request (sync or async). ``key``, ``tenant`` and ``cost`` default to the
        limiter's own (else the client IP, none, 1); ``scope`` to the
        route's method and templates. ``shadow=True`` observes the limit (metrics,
        logs) without denying. ``exempt_when``, a predicate of the request (sync
        or async), skips the limit when it returns True. On a websocket route the
        handshake is limited. Static configuration errors, including a static
        cost above capacity, raise RateLimitConfigError here. The options are
        ``RuleOptions`` (moderato.specs).
        """
        from .integrations.decorator import limit

        return limit(self, rate, **options)

    def dependency(self, rate: RateSpec, **options: Unpack[RuleOptions]) -> RateLimitDependency:
        """The same limit as a FastAPI dependency, for ``Depends(...)`` or router dependencies."""
        from .integrations.dependency import dependency

        return dependency(self, rate, **options)

    def message_limit(self, rate: RateSpec, **options: Unpack[MessageOptions]) -> MessageChecker:
        """A per-message limit for an open websocket (a MessageLimit):
        ``await it.check(websocket)``."""
        from .integrations.websocket import MessageLimit

        return MessageLimit(self, rate, **options)


# The commonest check on memory:// in one C call; any other, the method above (fast_check.py).
RateLimiter.check_with_info = fast_method(  # type: ignore[method-assign]
    RateLimiter.check_with_info, blocking=False
)


def _discard(call: Awaitable[Any]) -> None:
    close = getattr(call, "close", None)
    if close is not None:
        close()  # a coroutine never awaited would warn
