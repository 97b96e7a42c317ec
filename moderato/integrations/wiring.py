"""``install(app, limiter)``: the one call that wires a limiter into a FastAPI or Starlette app.

It adds the middleware (RateLimitHeadersMiddleware, or RateLimitMiddleware
when an app-wide ``rate`` is given), and wraps the app's lifespan, keeping
the one the app already has: on startup it checks that no ``@limiter.limit``
sits above its route decorator and that every route's limits (with the
app-wide one) can be decided as one (combinations.py), then connects the limiter,
then runs the app's own startup; on shutdown the app's own shutdown runs
first, then the limiter closes.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Optional

from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from ..errors import BackendError, RateLimitConfigError
from ..specs import RULE_OPTIONS, CostSpec, KeySpec, RateSpec, TenantSpec, check_specs
from ..web.headers import HeaderStyle, validate_style
from .combinations import check_routes
from .middleware import MIDDLEWARE_OPTIONS, RateLimitHeadersMiddleware, RateLimitMiddleware
from .order import check_order
from .request_limits import Limit
from .rule import check_options

if TYPE_CHECKING:
    from ..limiter import RateLimiter

logger = logging.getLogger("moderato")

_INSTALLED = "moderato_limiter"
"""The attribute of ``app.state`` holding the installed limiter (also handy in endpoints)."""


def install(
    app: Starlette,
    limiter: RateLimiter,
    *,
    rate: Optional[RateSpec] = None,
    headers: HeaderStyle = "legacy",
    require_backend: bool = True,
    key: Optional[KeySpec] = None,
    tenant: Optional[TenantSpec] = None,
    cost: Optional[CostSpec] = None,
    **app_limit: Any,
) -> None:
    """Wire ``limiter`` into ``app``: middleware, connect/close on the lifespan, route-order check.

    - ``rate`` (optional): an app-wide limit on every request; ``app_limit``
      then takes RateLimitMiddleware's other options (``exempt_paths``,
      ``costs``, ``exempt_when``, ``scope``...). Without it, RateLimitHeadersMiddleware
      reports the decorators' and dependencies' decisions.
    - ``headers``: ``"legacy"``, ``"ietf"``, ``"both"`` or None, as for the middlewares.
    - ``key``, ``tenant``, ``cost``: the defaults of every rule that does not
      set its own (decorators, dependencies, the app-wide limit), set on the
      limiter as ``RateLimiter(key=..., tenant=..., cost=...)`` would;
      RateLimitConfigError if the limiter already has a different one.
    - ``require_backend``: True (the default) fails startup when the backend
      cannot be reached; False logs a warning and starts anyway (checks then
      connect by themselves, failing open or closed as the limiter says).

    Call it once, before the app starts; routes may be added before or after.
    """
    if not isinstance(app, Starlette):
        raise RateLimitConfigError(
            f"install() takes a FastAPI or Starlette application, got {type(app).__name__}"
        )
    if getattr(app.state, _INSTALLED, None) is not None:
        raise RateLimitConfigError("install() was already called for this application")
    check_options("install()", app_limit, INSTALL_OPTIONS)
    validate_style(headers)
    _set_defaults(limiter, key=key, tenant=tenant, cost=cost)
    app_wide: list[Limit] = []
    if rate is not None:
        # Built once now so that a bad option fails here, not at the first request.
        validated = RateLimitMiddleware(
            _unused_app, limiter=limiter, rate=rate, headers=headers, **app_limit
        )
        app_wide.append(Limit(validated.rule, validated.bucket_scope))
        app.add_middleware(
            RateLimitMiddleware, limiter=limiter, rate=rate, headers=headers, **app_limit
        )
    elif app_limit:
        raise RateLimitConfigError(
            f"install() options {', '.join(sorted(app_limit))} configure an app-wide limit "
            "and need rate=... as well"
        )
    else:
        app.add_middleware(RateLimitHeadersMiddleware, headers=headers)
    setattr(app.state, _INSTALLED, limiter)
    existing = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(lifespan_app: Any) -> AsyncIterator[Any]:
        check_order(app)
        check_routes(app, app_wide)
        await _connect(limiter, require_backend)
        try:
            async with existing(lifespan_app) as state:
                yield state
        finally:
            await limiter.close()

    app.router.lifespan_context = lifespan


INSTALL_OPTIONS: frozenset[str] = (
    frozenset(inspect.signature(install).parameters) | MIDDLEWARE_OPTIONS | RULE_OPTIONS
) - {"app", "limiter", "app_limit"}
"""install()'s keywords: its own, and the app-wide limit's (RateLimitMiddleware's)."""


def _set_defaults(limiter: RateLimiter, **defaults: Any) -> None:
    given = {name: value for name, value in defaults.items() if value is not None}
    for name, value in given.items():
        current = getattr(limiter, name)
        if current is not None and current is not value:
            raise RateLimitConfigError(
                f"install() {name}= conflicts with the limiter's own default {name}; "
                "set it in one place"
            )
    check_specs(**defaults)
    for name, value in given.items():
        setattr(limiter, name, value)


async def _unused_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("only validates install()'s options")  # pragma: no cover


async def _connect(limiter: RateLimiter, require_backend: bool) -> None:
    try:
        await limiter.connect()
    except BackendError as error:
        if require_backend:
            raise
        logger.warning("moderato: starting without its backend (checks will retry): %s", error)
