"""What the asyncio RateLimiter (limiter.py) and the blocking one (sync/) share.

Everything about a check except waiting for the backend: the options and
their checks, plans, keys, the circuit breakers, metrics, the failure policy
(fail closed, or a counted bypass), shadow mode, usage snapshots and the
keys and patterns of a reset. Each limiter calls these from its own
``check_with_info``, awaiting or blocking on the backend in between, so a sync
and an async limiter on one URL and ``key_prefix`` decide every check by the
same rules on the same keys. ``get_usage`` and ``reset`` are defined here once,
for both: each limiter gives the one step that waits for the backend
(``_usage``, ``_reset``), a coroutine for the asyncio limiter (so its calls
are awaited) and the value itself for the blocking one.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any, Callable, Generic, NamedTuple, Optional, TypeVar, Union

from .algorithms import ALGORITHMS, Algorithm, get_algorithm
from .backends.replies import DecisionReply
from .breaker import BreakerSet, CircuitBreaker
from .errors import (
    BackendError,
    BackendUnavailableError,
    RateLimitConfigError,
    UnknownOptionError,
)
from .failure_log import OutageLog
from .habits import HABITS, refuse_habits
from .keys import Identity, KeyPartError, KeySpace
from .metrics import WANTED_BY_FAIL_OPEN, WANTED_BY_OPTION, Metrics, metrics_for
from .options import count_option, seconds_option
from .plans import Plan, Plans, burst_policy
from .policy import cost_scaled, policy_for, validate_cost
from .recording import CheckRecorder
from .results import CheckResult, PolicyState
from .together import (
    CallPart,
    Check,
    Together,
    TogetherCall,
    call_parts,
    deciding_check,
    distinct_keys,
    one_slot,
    results_of,
)

GLOBAL_SCOPE = "global"

Decided = tuple[bool, list[CheckResult]]
"""Whether a call's checks were admitted, and each one's result."""

DecisionKeys = Callable[[Plan, Any, Optional[str], Any], list[bytes]]
"""A backend's ``decision_keys``: a check's keys from its plan, identity, tenant and scope."""

_Limiter = TypeVar("_Limiter", bound="LimiterCore[Any, Any]")
Usage = TypeVar("Usage")
"""What ``get_usage`` returns: the snapshot (blocking), or an awaitable of it (asyncio)."""
Deleted = TypeVar("Deleted")
"""What ``reset`` returns: the count of keys deleted, or an awaitable of it."""

logger = logging.getLogger("moderato")

__all__ = [
    "GLOBAL_SCOPE",
    "LimiterCore",
    "ResetTargets",
    "shadowed",
    "tenant_alias",
    "usage_of",
]


class ResetTargets(NamedTuple):
    """What a reset deletes: exact keys (and their windows), or SCAN patterns."""

    keys: list[bytes]
    windows_s: list[int]
    patterns: list[bytes]
    route: Optional[bytes]
    """A key or pattern whose node's circuit breaker answers for the reset (None: all)."""


class LimiterCore(Generic[Usage, Deleted]):
    """The state and rules both RateLimiters share (see the module doc)."""

    metrics: Optional[Metrics]
    breaker: CircuitBreaker
    failure_log: OutageLog
    _node_of: Optional[Callable[[bytes], Optional[str]]]

    recorder: Optional[CheckRecorder] = None
    """Told every check's outcome when set (recording.py; the operator's dashboard
    attaches one); None, the default, keeps the check path free of it."""

    _close_hooks: tuple[Callable[[], Any], ...] = ()
    """What ``on_close`` registered, called in that order by every ``close()``."""

    _other_limiters_options: tuple[tuple[str, str], ...] = ()
    """Keywords of the other RateLimiter (asyncio or blocking) this one does not take,
    with what it takes instead."""

    def __new__(cls: type[_Limiter], *args: Any, **options: Any) -> _Limiter:
        # Only to answer other libraries' keywords (storage_uri=, key_func=...), and
        # the other limiter's, with moderato's names before __init__'s bare
        # TypeError would; type checkers and editors read __init__'s signature.
        if options and not HABITS.keys().isdisjoint(options):
            accepted = inspect.signature(cls.__init__).parameters
            refuse_habits(f"{cls.__name__}()", options, accepted)
        for name, advice in cls._other_limiters_options:
            if name in options:
                raise UnknownOptionError(f"{cls.__name__}(): {name}= {advice}")
        return super().__new__(cls)

    def _configure(
        self,
        *,
        key_prefix: str,
        default_algorithm: str,
        enable_metrics: bool,
        fail_open: bool,
        identity_secret: Optional[bytes],
        shadow: bool,
        breaker_failures: int,
        breaker_cooldown_s: float,
        metrics_namespace: str,
        metrics_registry: Optional[Any],
        failure_log_interval_s: float,
    ) -> None:
        """Check and keep the options both limiters take, before the backend is made."""
        breaker_failures = count_option("breaker_failures", breaker_failures)
        breaker_cooldown_s = seconds_option("breaker_cooldown_s", breaker_cooldown_s)
        failure_log_interval_s = seconds_option("failure_log_interval_s", failure_log_interval_s)
        self.key_prefix = key_prefix
        self._default_algorithm = get_algorithm(default_algorithm)
        self.default_algorithm = self._default_algorithm.name
        self.fail_open = bool(fail_open)
        self.shadow = bool(shadow)
        # A bypass must always be counted: fail-open turns metrics on.
        self.enable_metrics = bool(enable_metrics) or self.fail_open
        self.metrics = None
        if self.enable_metrics:
            wanted_by = WANTED_BY_OPTION if enable_metrics else WANTED_BY_FAIL_OPEN
            self.metrics = metrics_for(metrics_namespace, metrics_registry, wanted_by=wanted_by)
        try:
            # One breaker per cluster node (see breaker.py); self.breaker is the
            # backend-wide one: a single server's only breaker.
            self._breakers = BreakerSet(
                CircuitBreaker(breaker_failures, breaker_cooldown_s), self._breaker_changed
            )
        except ValueError as error:
            raise RateLimitConfigError(str(error)) from None
        self.breaker = self._breakers.default
        if self.metrics is not None:
            self.metrics.set_breaker_state(self.breaker.state)
        self.failure_log = OutageLog(fail_open=self.fail_open, interval_s=failure_log_interval_s)
        self._keyspace = KeySpace(key_prefix, identity_secret, self._default_algorithm.key_tag)
        self._plans = Plans(self._default_algorithm)

    def plan_for(
        self, rate: object, algorithm: Optional[str] = None, burst: Optional[int] = None
    ) -> Plan:
        """``rate`` and ``algorithm`` (default: the limiter's), and a burst if any, worked
        out for checks, once; RateLimitConfigError for a bad rate, algorithm, burst or pair."""
        return self._plans.get(rate, algorithm, burst)

    def get_usage(
        self,
        key: Identity,
        rate: str,
        *,
        tenant_type: Optional[str] = None,
        scope: str = GLOBAL_SCOPE,
        algorithm: Optional[str] = None,
        tenant: Optional[str] = None,
        burst: Optional[int] = None,
    ) -> Usage:
        """A read-only snapshot (not a reservation) of the identity's quota (awaited
        on the asyncio limiter).

        ``current`` and ``remaining`` are whole requests of the most
        restrictive policy; ``policies`` lists every policy of ``rate``.
        ``tenant`` is an alias of ``tenant_type``; ``burst`` as ``check``'s (the
        snapshot's ``limit`` is then the burst, its ``refill`` the rate's limit).
        """
        if tenant is not None:
            tenant_type = tenant_alias("get_usage()", tenant_type, tenant)
        return self._usage(self._plans.get(rate, algorithm, burst), key, tenant_type, scope)

    def reset(
        self,
        key: Identity,
        *,
        rate: Optional[str] = None,
        tenant_type: Optional[str] = None,
        scope: Optional[str] = None,
        algorithm: Optional[str] = None,
        tenant: Optional[str] = None,
        burst: Optional[int] = None,
    ) -> Deleted:
        """Forget the identity's usage; returns the number of keys deleted (awaited on
        the asyncio limiter).

        ``scope=None`` (the default) means every scope: the identity's usage on
        every route, whatever the rate and algorithm. ``tenant_type`` (alias
        ``tenant``) selects one tenant's keys; without it only the keys checked
        without a tenant are reset. ``rate`` and ``algorithm`` narrow the reset
        to those policies' windows and that algorithm; ``burst`` (with ``rate``)
        to that rate's burst, whose keys are its own.

        With both ``rate`` and ``scope`` the keys are known exactly and deleted
        in one script call. Otherwise they are found with SCAN, which walks the
        whole keyspace (every primary of a cluster when no scope is given):
        fine for an admin action, not for a request path.
        """
        if tenant is not None:
            tenant_type = tenant_alias("reset()", tenant_type, tenant)
        return self._reset(self._reset_targets(key, rate, tenant_type, scope, algorithm, burst))

    def _usage(self, plan: Plan, key: Identity, tenant_type: Optional[str], scope: str) -> Usage:
        """``get_usage``'s peek by the backend, through the breaker (each limiter's own)."""
        raise NotImplementedError

    def _reset(self, targets: ResetTargets) -> Deleted:
        """``reset``'s deletion through the breaker, then its announcement (each
        limiter's own)."""
        raise NotImplementedError

    # -- closing ---------------------------------------------------------------------

    def on_close(self, hook: Callable[[], Any]) -> None:
        """Call ``hook`` at every ``close()``, before the connections close, so what runs
        beside the limiter (the dashboard's publisher) stops with it and can still send
        its last word. The asyncio limiter awaits what a hook returns; the blocking
        one's hooks must return None. A hook that raises is logged; the rest still run
        and the connections still close. Registered once, it stays for a limiter that
        is used (reopened) after closing."""
        self._close_hooks = (*self._close_hooks, hook)

    def _closing(self) -> list[Any]:
        """Every ``on_close`` hook called; the awaitables they returned."""
        pending = []
        for hook in self._close_hooks:
            try:
                outcome = hook()
            except Exception:  # one failing hook must not keep the connections open
                logger.exception("moderato: an on_close hook failed")
                continue
            if inspect.isawaitable(outcome):
                pending.append(outcome)
        return pending

    async def _close_hooks_awaited(self) -> None:
        """The asyncio limiter's closing: every hook called, what it returned awaited."""
        for pending in self._closing():
            try:
                await pending
            except Exception:
                logger.exception("moderato: an on_close hook failed")

    def _close_hooks_called(self) -> None:
        """The blocking limiter's closing: every hook called; one that returned an
        awaitable (nothing here would ever run it) is logged and its coroutine closed."""
        for pending in self._closing():
            logger.error("moderato: an on_close hook of a blocking limiter returned %r", pending)
            close = getattr(pending, "close", None)
            if close is not None:
                close()

    def _bound(self, backend: Any) -> None:
        """``backend`` builds its keys from this limiter's KeySpace from now on."""
        backend.bind(self._keyspace)
        # On a cluster: the node owning a key (None until the slot map is loaded).
        self._node_of = getattr(backend, "node_of", None)
        # On a cluster: reload the slot map (a node's open breaker hides its failover).
        self._reload_routes: Optional[Callable[[], None]] = getattr(backend, "reload_routes", None)

    # -- a check's outcome -----------------------------------------------------------

    def _undecided(self, plan: Plan, cost: int, error: BackendError) -> CheckResult:
        """A check the backend could not decide: raise ``error`` (fail closed), or let
        it through counted and logged (fail open). A cost no quota could ever hold is
        never let through: that is a denial, not an outage."""
        if not self.fail_open or cost > plan.policy.smallest_limit:
            if self.metrics is not None:
                self.metrics.checks.labels(plan.algorithm.name, "error").inc()
            self.failure_log.failed("denied", error)
            raise error
        return self._bypass(plan, error)

    def _recorded_undecided(
        self, plan: Plan, cost: int, scope: object, error: BackendError
    ) -> CheckResult:
        """``_undecided``, its outcome (a bypass, or the error raised) told to the recorder."""
        recorder = self.recorder
        assert recorder is not None
        try:
            bypass = self._undecided(plan, cost, error)
        except BackendError:
            recorder.failed(plan, scope, error, False)
            raise
        recorder.failed(plan, scope, error, True)
        return bypass

    def _record_together(
        self,
        checks: Sequence[Check],
        together: Optional[Together],
        started_s: float,
        error: Optional[BackendError] = None,
    ) -> None:
        """Tell the recorder how checks decided together ended: each one's result, or
        the ``error`` that kept every one of them undecided."""
        recorder = self.recorder
        assert recorder is not None
        plans = self._plans
        if together is None:
            assert error is not None
            for check in checks:
                plan = plans.get(check.rate, check.algorithm, check.burst)
                recorder.failed(plan, check.scope, error, False)
            return
        for check, result in zip(checks, together.results):
            if result is not None:  # None: a shadow check left undecided
                plan = plans.get(check.rate, check.algorithm, check.burst)
                recorder.decided(plan, check.key, check.scope, result, started_s)

    def _observe(self, plan: Plan, result: CheckResult, started_s: float) -> None:
        """Count a decided check in the metrics (only called when they are on)."""
        metrics = self.metrics
        assert metrics is not None
        name = plan.algorithm.name
        metrics.check_duration.labels(name).observe(time.perf_counter() - started_s)
        if result.shadow_denied:
            outcome = "shadow_denied"
        else:
            outcome = "allowed" if result.allowed else "denied"
        metrics.checks.labels(name, outcome).inc()
        if not result.allowed:
            metrics.limit_exceeded.labels(name).inc()

    def _bypass(self, plan: Plan, error: BackendError) -> CheckResult:
        policy, algorithm = plan.policy, plan.algorithm
        self.failure_log.failed("bypassed", error)
        if self.metrics is not None:
            self.metrics.fail_open.labels(algorithm.name).inc()
            self.metrics.checks.labels(algorithm.name, "bypassed").inc()
        # Each policy's limit and window as a decision states them (a burst's: the burst,
        # and the refill beside it).
        unknown = tuple(
            PolicyState(limits[0], limits[1], None, None, None, (*limits, None)[2])
            for limits in plan.result_shape[4]
        )
        tightest = min(unknown, key=lambda state: state.limit)
        return CheckResult(
            allowed=True,
            limit=tightest.limit,
            remaining=None,
            retry_after=None,
            reset_at=None,
            window_seconds=tightest.window_seconds,
            rate=policy.text,
            algorithm=algorithm.name,
            policies=unknown,
            bypassed=True,
            refill=tightest.refill,
        )

    # -- several checks decided as one (together.py) ------------------------------------

    def _together_steps(
        self, checks: Sequence[Check], decision_keys: DecisionKeys
    ) -> Generator[TogetherCall, tuple[bool, list[CheckResult]], Together]:
        """``_check_together``'s rules, as the atomic calls it makes: each call is
        yielded, its outcome (admitted, and each check's result) sent back, and the
        decision returned. Each limiter makes the calls its own way (awaiting or
        blocking, ``_decide_checks``).

        Admitted only if every check admits, and then every one is charged; when
        one refuses, none is. The checks in shadow mode are decided after the
        others, among themselves, when those admitted the request, and never refuse
        it; when the others refused, they are not decided (their result is None).
        Fail-open bypasses every check of a call the backend could not decide, as
        ``check_with_info`` bypasses one. ``decision_keys``: the backend's.
        """
        plans = [self._plans.get(check.rate, check.algorithm, check.burst) for check in checks]
        costs = [
            check.cost if type(check.cost) is int and check.cost > 0 else validate_cost(check.cost)
            for check in checks
        ]
        keys: list[list[bytes]] = [
            decision_keys(plan, check.key, check.tenant_type, check.scope)
            for plan, check in zip(plans, checks)
        ]
        distinct_keys(checks, keys)
        if self._node_of is not None:
            one_slot(checks, keys)
        shadows = [self.shadow if check.shadow is None else check.shadow for check in checks]
        if not any(shadows):  # the usual case: one call, every check enforced
            allowed, decided = yield TogetherCall(plans, keys, costs, False)
            return Together(allowed, tuple(decided), deciding_check(allowed, decided))
        results: list[Optional[CheckResult]] = [None] * len(checks)
        allowed = True
        for shadow in (False, True):
            chosen = [index for index, flag in enumerate(shadows) if flag is shadow]
            if not chosen or not allowed:
                continue
            chosen_allowed, chosen_results = yield TogetherCall(
                [plans[i] for i in chosen],
                [keys[i] for i in chosen],
                [costs[i] for i in chosen],
                shadow,
            )
            for index, result in zip(chosen, chosen_results):
                if not chosen_allowed and shadow and not result.allowed:
                    result = shadowed(result, checks[index].scope)
                results[index] = result
            allowed = chosen_allowed or shadow
        decided = [result for result in results if result is not None]
        deciding = deciding_check(allowed, decided)
        return Together(allowed, tuple(results), results.index(decided[deciding]))

    def _checks_decision(
        self, call: TogetherCall
    ) -> Generator[list[CallPart], Union[list[DecisionReply], BaseException], Decided]:
        """One atomic backend call for these checks, through the breaker, the failure
        policy and the metrics, as ``check_with_info`` takes one check through them.

        The script calls to make are yielded (the limiter makes them as one, awaiting
        or blocking) and their replies sent back, or what making them raised.
        """
        started_s = time.perf_counter() if self.metrics is not None else 0.0
        plans, keys = call.plans, call.keys
        parts = call_parts(plans, keys, [cost_scaled(cost) for cost in call.costs])
        breaker = self._breaker_for(keys[0][0])
        try:
            if not breaker.allow():
                raise self._short_circuit("decide", breaker)
            try:
                replies = yield parts
                if isinstance(replies, BaseException):
                    raise replies  # the backend's error, met here as the breaker's failure
                allowed, results = results_of(plans, parts, replies)
            except BaseException as error:
                self._failed("decide", error, breaker)
                raise
            self._succeeded("decide", breaker)
        except BackendError as error:
            return self._checks_undecided(call, error)  # raises, or bypasses under fail-open
        if self.metrics is not None:
            self._checks_observed(call, results, started_s)
        return allowed, results

    def _checks_undecided(
        self, call: TogetherCall, error: BackendError
    ) -> tuple[bool, list[CheckResult]]:
        """A call of ``_check_together`` the backend could not decide: raise ``error``
        (fail closed), or bypass every check (fail open), as ``_undecided`` does one."""
        plans = call.plans
        feasible = all(cost <= plan.policy.smallest_limit for plan, cost in zip(plans, call.costs))
        if not self.fail_open or not feasible:
            if self.metrics is not None:
                for plan in plans:
                    self.metrics.checks.labels(plan.algorithm.name, "error").inc()
            self.failure_log.failed("denied", error)
            raise error
        return True, [self._bypass(plan, error) for plan in plans]

    def _checks_observed(
        self, call: TogetherCall, results: Sequence[CheckResult], started_s: float
    ) -> None:
        """Count a decided call of ``_check_together`` (only called when metrics are on):
        each check's own verdict; one that fitted a request another refused counts as
        allowed (though nothing was charged), as it would alone."""
        metrics = self.metrics
        assert metrics is not None
        duration_s = time.perf_counter() - started_s
        for plan, result in zip(call.plans, results):
            name = plan.algorithm.name
            metrics.check_duration.labels(name).observe(duration_s)
            if result.allowed:
                metrics.checks.labels(name, "allowed").inc()
            elif call.shadow:
                metrics.checks.labels(name, "shadow_denied").inc()
            else:
                metrics.checks.labels(name, "denied").inc()
                metrics.limit_exceeded.labels(name).inc()

    # -- the circuit breakers --------------------------------------------------------

    def _breaker_for(self, key: Optional[bytes]) -> CircuitBreaker:
        """The breaker of the cluster node owning ``key``; the only one for a single server."""
        node_of = self._node_of
        if node_of is None or key is None:
            return self.breaker
        return self._breakers.for_node(node_of(key))

    def _succeeded(self, operation: str, breaker: CircuitBreaker) -> None:
        breaker.success()
        if self.failure_log.active:
            self.failure_log.recovered()
        if self.metrics is not None:  # checked here too: this runs on every check
            self._count_operation(operation, "ok")

    def _failed(self, operation: str, error: BaseException, breaker: CircuitBreaker) -> None:
        """Tell the breaker how a backend call that raised ended (the caller re-raises)."""
        if isinstance(error, KeyPartError):
            breaker.abandon()  # refused before the backend was asked: it proved nothing
        elif isinstance(error, RateLimitConfigError):
            # The backend answered (it refused an argument): it is healthy.
            breaker.success()
            if self.failure_log.active:
                self.failure_log.recovered()
        elif isinstance(error, BackendUnavailableError):
            # No answer (unreachable, timed out, connection lost): what the breaker is for.
            breaker.failure()
            self._count_operation(operation, "error")
            self.failure_log.failed("errors", error)
        elif isinstance(error, BackendError):
            # An answer, if an error one (NOPERM, WRONGTYPE, OOM, corrupt state):
            # the backend is up and the failure is this call's alone, so other
            # calls, routes and algorithms must not be short-circuited for it.
            breaker.success()
            self._count_operation(operation, "error")
            self.failure_log.failed("errors", error)
        else:  # cancelled, or a bug: it proved nothing either way
            breaker.abandon()

    def _short_circuit(self, operation: str, breaker: CircuitBreaker) -> BackendError:
        """The error of a call the open breaker refused (counted here)."""
        self._count_operation(operation, "short_circuited")
        if breaker.node is not None and self._reload_routes is not None:
            # The node's slots may have a new owner by now, with its own breaker.
            self._reload_routes()
        return BackendUnavailableError(
            f"{breaker.describe()} is open after repeated failures; "
            f"next attempt in {breaker.retry_in_s():.2f} s"
        )

    def _count_operation(self, operation: str, status: str) -> None:
        if self.metrics is not None:
            self.metrics.backend_operations.labels(operation, status).inc()

    def _breaker_changed(self, state: str) -> None:
        if self.metrics is not None:
            self.metrics.set_breaker_state(state)

    # -- reset -------------------------------------------------------------------------

    def _reset_targets(
        self,
        key: Identity,
        rate: Optional[str],
        tenant_type: Optional[str],
        scope: Optional[str],
        algorithm: Optional[str],
        burst: Optional[int] = None,
    ) -> ResetTargets:
        """The keys a reset deletes (a rate and a scope: known exactly), else its SCAN
        patterns (every scope means every primary of a cluster). With a burst, those of
        the rate with that burst, which are its own."""
        keyspace = self._keyspace
        chosen = [self._algorithm(algorithm)] if algorithm else list(ALGORITHMS.values())
        policy = None if rate is None else policy_for(rate)
        if burst is not None:
            if policy is None:
                raise RateLimitConfigError(
                    "reset() got burst= without rate=: a burst's keys are those of one rate "
                    "with that burst; pass both (or neither, to reset every rate)"
                )
            if not algorithm:  # the algorithms that keep a burst's state
                chosen = [each for each in chosen if each.burst_bound_s]
            policy = burst_policy(policy, chosen[0], burst)
        if policy is not None and scope is not None:
            keys = keyspace.reset_keys(
                [each.key_tag for each in chosen], policy, key, tenant_type, scope
            )
            return ResetTargets(keys, list(policy.windows_s) * len(chosen), [], keys[0])
        patterns = keyspace.reset_patterns(
            key,
            tenant_type,
            scope,
            key_tag=self._algorithm(algorithm).key_tag if algorithm else None,
            windows_s=policy.windows_s if policy is not None else None,
            burst=policy.burst if policy is not None else None,
        )
        # One scope's patterns share a hash tag, so one node's breaker answers for
        # them; every scope means every primary, which the limiter-wide one does.
        return ResetTargets([], [], patterns, patterns[0] if scope is not None else None)

    def _algorithm(self, name: Optional[str]) -> Algorithm:
        if name is None:
            return self._default_algorithm
        return get_algorithm(name)


def usage_of(result: CheckResult) -> dict[str, Any]:
    """``get_usage()``'s snapshot from a peek's result."""
    return {
        "limit": result.limit,
        "current": result.limit - (result.remaining or 0),
        "remaining": result.remaining,
        "reset_at": result.reset_at,
        "window_seconds": result.window_seconds,
        "rate": result.rate,
        "algorithm": result.algorithm,
        "policies": [
            {
                "limit": state.limit,
                "window_seconds": state.window_seconds,
                "current": state.limit - (state.remaining or 0),
                "remaining": state.remaining,
                "reset_at": state.reset_at,
            }
            for state in result.policies
        ],
    }


def tenant_alias(where: str, tenant_type: Optional[str], tenant: str) -> str:
    """``tenant=``, the rules' name, given to a manual call whose own is ``tenant_type=``."""
    if tenant_type is not None:
        raise RateLimitConfigError(
            f"{where} got both tenant_type= and tenant= (its alias); pass one of them"
        )
    return tenant


def shadowed(result: CheckResult, scope: object) -> CheckResult:
    """A denial shadow mode lets through: logged, and counted as shadow_denied."""
    logger.info(
        "moderato: shadow mode let through a request denied by %s (scope %r)",
        result.rate,
        scope,
    )
    return replace(result, allowed=True, shadow_denied=True)
