"""Django REST framework throttles decided by moderato: exact across every worker.

Drop-in for DRF's own classes, with DRF's own settings::

    REST_FRAMEWORK = {
        "DEFAULT_THROTTLE_CLASSES": [
            "moderato.django.throttling.AnonRateThrottle",
            "moderato.django.throttling.UserRateThrottle",
        ],
        "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "user": "1000/day", "uploads": "20/hour"},
    }

``AnonRateThrottle``, ``UserRateThrottle`` and ``ScopedRateThrottle`` (a
view's ``throttle_scope``) take their rates from ``DEFAULT_THROTTLE_RATES``
(or a ``rate`` attribute), identify anonymous clients by address
(``MODERATO['TRUSTED_PROXIES']`` decides which forwarded hop is believed,
where DRF's ``NUM_PROXIES`` would count hops) and users by primary key, and
answer ``wait()`` with the seconds until the denied request would fit.
Several of them on one view are decided as one atomic step: a request one
refuses is charged by none (the first to run decides for all). DRF's
own classes read, decide and write in three steps on Django's cache, so
concurrent workers can admit more than the rate; these decide in one atomic
step in Redis.

``RateThrottle`` is the base of your own: set ``scope`` (or ``rate``) and
override ``get_identity(request, view)`` (None: not throttled), and
optionally ``algorithm``, ``cost`` and ``get_tenant``. When Redis cannot
decide, the request is answered 503 (``RateLimitUnavailable``), not let
through, unless ``MODERATO['FAIL_OPEN']``.
"""

from __future__ import annotations

from typing import Any, Optional

from django.core.exceptions import ImproperlyConfigured
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from ..errors import BackendError, RateLimitCallbackError, RateLimitConfigError
from ..results import CheckResult
from ..together import Check
from .decisions import record
from .keys import client_address, user_identity
from .limiters import get_limiter, get_settings

__all__ = [
    "AnonRateThrottle",
    "RateLimitUnavailable",
    "RateThrottle",
    "RequestTooCostly",
    "ScopedRateThrottle",
    "UserRateThrottle",
    "drf_rate",
]

_PERIODS = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


class RateLimitUnavailable(APIException):  # type: ignore[misc]
    """503: the backend could not decide (fail closed), or a callback failed."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Rate limit backend unavailable"
    default_code = "rate_limit_unavailable"


class RequestTooCostly(APIException):  # type: ignore[misc]
    """422: the request's cost exceeds the rate's capacity; waiting cannot help."""

    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "Rate limit exceeded: the request costs more than the rate allows"
    default_code = "rate_limit_cost"


def drf_rate(rate: str) -> str:
    """``rate`` as moderato reads it; DRF's own forms (``"10/min"``, ``"100/days"``: any word
    whose first letter is s, m, h or d) are accepted too, as DRF reads them."""
    from ..policy import policy_for

    try:
        policy_for(rate)
        return rate
    except (RateLimitConfigError, ValueError):
        pass
    count, slash, period = rate.partition("/")
    unit = _PERIODS.get(period.strip()[:1]) if slash else None
    if unit is None or not count.strip().isdigit():
        raise ImproperlyConfigured(
            f"throttle rate {rate!r} is neither moderato's nor REST framework's form "
            "('100/day', '10/min', '5/second')"
        )
    return f"{count.strip()}/{unit}"


class RateThrottle(BaseThrottle):  # type: ignore[misc]
    """A DRF throttle decided by moderato: subclass it with a ``scope`` and ``get_identity``.

    Attributes: ``scope`` (the key of ``DEFAULT_THROTTLE_RATES``, and the name
    of the quota), ``rate`` (overrides the settings), ``THROTTLE_RATES``
    (default: ``DEFAULT_THROTTLE_RATES`` as the settings are now), ``algorithm``
    (default ``MODERATO['DEFAULT_ALGORITHM']``), ``cost`` (units per request).
    """

    scope: Optional[str] = None
    rate: Optional[str] = None
    THROTTLE_RATES: Optional[dict[str, Optional[str]]] = None
    algorithm: Optional[str] = None
    cost: int = 1

    def __init__(self) -> None:
        if not getattr(self, "rate", None):
            self.rate = self.get_rate()
        self.result: Optional[CheckResult] = None

    def get_rate(self) -> Optional[str]:
        """The scope's rate from the settings; ImproperlyConfigured without one, as DRF."""
        scope = getattr(self, "scope", None)
        if not scope:
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle"
            )
        rates = self.THROTTLE_RATES
        if rates is None:
            rates = api_settings.DEFAULT_THROTTLE_RATES
        try:
            return rates[scope]
        except KeyError:
            raise ImproperlyConfigured(
                f"No default throttle rate set for '{self.scope}' scope"
            ) from None

    def get_identity(self, request: Any, view: Any) -> Optional[str]:
        """Who is charged for this request; None: it is not throttled. Must be overridden."""
        raise NotImplementedError(".get_identity() must be overridden")

    def get_tenant(self, request: Any, view: Any) -> Optional[str]:
        """The tenant whose quotas this request counts in (default: none)."""
        return None

    def get_ident(self, request: Any) -> str:
        """The client's address, by MODERATO's trusted proxies (DRF's name for it)."""
        return client_address(request, get_settings().proxy_rules)

    def allow_request(self, request: Any, view: Any) -> bool:
        check = self.check_of(request, view)
        if check is None:
            return True
        try:
            result = _decision(request, view, check)
        except (BackendError, RateLimitCallbackError) as error:
            raise RateLimitUnavailable() from error
        self.result = result
        if not result.allowed and result.retry_after is None:
            raise RequestTooCostly()
        return result.allowed

    def check_of(self, request: Any, view: Any) -> Optional[Check]:
        """What this throttle asks of the limiter for this request; None: not throttled."""
        if self.rate is None:
            return None
        identity = self.get_identity(request, view)
        if identity is None:
            return None
        return Check(
            identity,
            drf_rate(self.rate),
            f"drf:{self.scope or type(self).__name__}",
            self.cost,
            self.get_tenant(request, view),
            self.algorithm,
        )

    def wait(self) -> Optional[float]:
        """Seconds until the denied request would fit, from Redis's own clock (rounded up)."""
        if self.result is None or self.result.allowed or self.result.retry_after is None:
            return None
        return float(self.result.retry_after)


def _decision(request: Any, view: Any, check: Check) -> CheckResult:
    """This throttle's result: the first moderato throttle of the view to run decides
    every one of them (``view.get_throttles()``) as one atomic step, so a request one
    refuses is charged by none; the others then take their result, once each."""
    target = getattr(request, "_request", request)
    pending: Optional[dict[Check, CheckResult]] = target.__dict__.get(_THROTTLED)
    if pending is not None and check in pending:
        return pending.pop(check)
    checks = [check]
    get_throttles = getattr(view, "get_throttles", None)
    for other in get_throttles() if get_throttles is not None else ():
        if isinstance(other, RateThrottle):
            other_check = other.check_of(request, view)
            if other_check is not None and other_check not in checks:
                checks.append(other_check)
    limiter = get_limiter()
    if len(checks) == 1:
        identity, rate, scope, cost, tenant, algorithm = check[:6]
        results: tuple[Optional[CheckResult], ...] = (
            limiter.check_with_info(
                identity, rate, cost=cost, tenant_type=tenant, scope=scope, algorithm=algorithm
            ),
        )
    else:
        results = limiter._check_together(checks).results
    decided: dict[Check, CheckResult] = {}
    for each, each_result in zip(checks, results):
        assert each_result is not None  # no check is left out here (shadow or not)
        decided[each] = each_result
        record(request, each_result)
    result = decided.pop(check)
    target.__dict__[_THROTTLED] = decided
    return result


_THROTTLED = "_moderato_throttled"
"""On the request: the results the first throttle decided for the others, until taken."""


def _user_or_address(throttle: RateThrottle, request: Any) -> str:
    return user_identity(getattr(request, "user", None)) or throttle.get_ident(request)


class AnonRateThrottle(RateThrottle):
    """Anonymous requests, by address (``DEFAULT_THROTTLE_RATES["anon"]``); users go free."""

    scope = "anon"

    def get_identity(self, request: Any, view: Any) -> Optional[str]:
        if user_identity(getattr(request, "user", None)) is not None:
            return None
        return self.get_ident(request)


class UserRateThrottle(RateThrottle):
    """Users by primary key, anonymous requests by address (``["user"]``)."""

    scope = "user"

    def get_identity(self, request: Any, view: Any) -> Optional[str]:
        return _user_or_address(self, request)


class ScopedRateThrottle(RateThrottle):
    """The view's ``throttle_scope`` names the rate; users by primary key, others by address.

    Views without ``throttle_scope`` are not throttled by it.
    """

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        # The rate depends on the view: found in allow_request, as DRF's own does.
        self.result = None

    def check_of(self, request: Any, view: Any) -> Optional[Check]:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return None
        self.rate = self.get_rate()
        return super().check_of(request, view)

    def get_identity(self, request: Any, view: Any) -> Optional[str]:
        return _user_or_address(self, request)
