"""One limit, as ``limit()`` and RateLimitMiddleware apply it to a Django request.

What can be checked before the first request is checked when the rule is
made (at import of the views module, so at start-up): the rate, the
algorithm, the key, the methods, a static cost against the capacity of the
rate's smallest policy. Per-request values come from callbacks, which fail
closed (callbacks.py).

A rule gives the arguments of its check for one request (``arguments``, or
``aarguments`` with its callbacks awaited); together.py decides a request's
rules as one: by the blocking limiter when its view runs in a thread (sync
views; any view under WSGI, where an async view's event loop lives for that
one request and a connection made on it would serve nothing else), and by the
asyncio limiter on the event loop of an ASGI server. Both share every quota
(limiters.py). On ``memory://`` the blocking limiter's in-process store
decides every view (its calls never wait), so that they share it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional, TypedDict, Union

from django.http import HttpRequest

from ..algorithms import DEFAULT_ALGORITHM, get_algorithm
from ..errors import RateLimitConfigError
from ..options import request_callback_option
from ..plans import Plans
from ..policy import validate_cost
from .callbacks import RequestFunction, call_async, call_sync, imported, unusable
from .conf import Settings
from .keys import Identity, KeySource, key_source
from .limiters import get_limiter

RateOption = Union[str, RequestFunction]
CostOption = Union[int, str, RequestFunction]
TenantOption = Union[str, RequestFunction, None]

ALL = None
"""``methods=ALL`` (the default): every request method counts."""
UNSAFE = ("DELETE", "PATCH", "POST", "PUT")
"""The methods that change state (django-ratelimit's ``UNSAFE``)."""

Arguments = tuple[Identity, str, int, Optional[str], str]
"""A check's identity, rate, cost, tenant and scope, as one request resolves them."""


class LimitOptions(TypedDict, total=False):
    """A limit's options besides its rate, declared once: LimitRule's keywords, which the
    ``limit()`` decorator takes and forwards (its docstring says what each means)."""

    key: object
    algorithm: Optional[str]
    cost: Optional[CostOption]
    scope: Optional[str]
    tenant: TenantOption
    methods: Union[str, Iterable[str], None]


class LimitRule:
    """A validated limit: what to charge whom, where, under which policy."""

    def __init__(
        self,
        rate: RateOption,
        *,
        key: object = None,
        algorithm: Optional[str] = None,
        cost: Optional[CostOption] = None,
        scope: Optional[str] = None,
        tenant: TenantOption = None,
        methods: Union[str, Iterable[str], None] = ALL,
    ) -> None:
        self.rate: RateOption = _callable_or_value("rate", rate, str)
        self.key: Optional[KeySource] = None if key is None else key_source(key)
        """None: ``MODERATO['KEY']``, read per request (``"ip"`` unless set)."""
        self.algorithm = None if algorithm is None else get_algorithm(algorithm).name
        self.cost: Union[int, RequestFunction] = (
            1 if cost is None else _callable_or_value("cost", cost, int)
        )
        self.tenant = None if tenant is None else _callable_or_value("tenant", tenant, str)
        if scope is not None and (not isinstance(scope, str) or not scope):
            raise RateLimitConfigError(f"scope must be a non-empty string, got {scope!r:.80}")
        self.scope = scope
        self.methods = _methods(methods)
        self._check_static_cost()

    def _check_static_cost(self) -> None:
        if not isinstance(self.rate, str):
            return
        # The rate's grammar and the algorithm's exact range (MODERATO's default
        # algorithm is not read here: the limiter checks the rate against it).
        plan = Plans(get_algorithm(self.algorithm or DEFAULT_ALGORITHM)).get(self.rate, None)
        if isinstance(self.cost, int):
            validate_cost(self.cost)
            capacity = plan.policy.smallest_limit
            if self.cost > capacity:
                raise RateLimitConfigError(
                    f"cost {self.cost} exceeds capacity {capacity} of policy '{self.rate}'; "
                    "such a request could never be admitted"
                )

    def applies(self, request: HttpRequest) -> bool:
        """False for a method this rule does not count (``methods=``)."""
        return self.methods is None or _method(request) in self.methods

    # -- a request's arguments, in a thread ---------------------------------------------

    def arguments(
        self, request: HttpRequest, settings: Settings, scope: Optional[str] = None
    ) -> Arguments:
        source = self.key if self.key is not None else settings.key
        identity = source.identify(request, settings.proxy_rules)
        rate = self.rate
        if not isinstance(rate, str):
            rate = self._rate(call_sync("rate", rate, request))
        tenant = self.tenant
        if tenant is not None and not isinstance(tenant, str):
            tenant = _tenant(call_sync("tenant", tenant, request))
        cost = self.cost
        if not isinstance(cost, int):
            cost = _cost(call_sync("cost", cost, request))
        return identity, rate, cost, tenant, scope or self.scope or route_scope(request)

    # -- the same, on the event loop ---------------------------------------------------

    async def aarguments(
        self, request: HttpRequest, settings: Settings, scope: Optional[str] = None
    ) -> Arguments:
        source = self.key if self.key is not None else settings.key
        identity = await source.aidentify(request, settings.proxy_rules)
        rate = self.rate
        if not isinstance(rate, str):
            rate = self._rate(await call_async("rate", rate, request))
        tenant = self.tenant
        if tenant is not None and not isinstance(tenant, str):
            tenant = _tenant(await call_async("tenant", tenant, request))
        cost = self.cost
        if not isinstance(cost, int):
            cost = _cost(await call_async("cost", cost, request))
        return identity, rate, cost, tenant, scope or self.scope or route_scope(request)

    def _rate(self, rate: object) -> str:
        try:
            get_limiter().plan_for(rate, self.algorithm)
        except RateLimitConfigError as error:
            raise unusable("rate", f"returned an unusable rate: {error}") from None
        return rate  # type: ignore[return-value]


def route_scope(request: HttpRequest) -> str:
    """The default scope: the method (HEAD counts as GET) and the URL pattern that matched.

    ``/items/1`` and ``/items/2`` share the quota of ``GET:/items/<int:pk>``,
    so a client cannot mint fresh quotas by varying a path parameter; two
    patterns leading to one view count apart. Without a resolved pattern (a
    view called directly) the view's dotted name stands in.
    """
    method = _method(request)
    match = getattr(request, "resolver_match", None)
    if match is None:
        return f"{method}:view"
    route = getattr(match, "route", None)
    if route:
        return f"{method}:/{route}"
    return f"{method}:view:{match.view_name}"


def view_method(request: HttpRequest) -> str:
    """The request's method as the limits count it (HEAD counts as GET)."""
    return _method(request)


def _method(request: HttpRequest) -> str:
    method = (request.method or "GET").upper()
    # Django answers HEAD with the GET view: one quota, not two.
    return "GET" if method == "HEAD" else method


def _methods(methods: Union[str, Iterable[str], None]) -> Optional[frozenset[str]]:
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = (methods,)
    chosen: set[str] = set()
    for method in methods:
        if not isinstance(method, str) or not method.isalpha():
            raise RateLimitConfigError(
                "methods must name HTTP methods such as 'POST' or ['GET', 'POST'], "
                f"got {method!r:.40}"
            )
        chosen.add("GET" if method.upper() == "HEAD" else method.upper())
    if not chosen:
        raise RateLimitConfigError("methods must name at least one method (or be ALL, None)")
    return frozenset(chosen)


def _callable_or_value(name: str, value: Any, kind: type) -> Any:
    """A value of ``kind``, a callable of the request, or a dotted path to one."""
    if isinstance(value, str) and kind is not str:
        value = imported(name, value)
    elif isinstance(value, str) and "/" not in value and "." in value and name != "tenant":
        value = imported(name, value)  # a rate is "10/minute": a dotted path has no "/"
    if callable(value) and not isinstance(value, type):
        request_callback_option(name, value, kind.__name__)
        return value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RateLimitConfigError(
            f"{name} must be an int, a callable of the request or its dotted path, "
            f"got {value!r:.80}"
        )
    if kind is str and not isinstance(value, str):
        raise RateLimitConfigError(
            f"{name} must be a string, a callable of the request or its dotted path, "
            f"got {value!r:.80}"
        )
    return value


def _tenant(value: object) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise unusable("tenant", f"returned {type(value).__name__}, not str or None")
    return value


def _cost(value: object) -> int:
    try:
        return validate_cost(value)
    except RateLimitConfigError as error:
        raise unusable("cost", f"returned an unusable cost: {error}") from None
