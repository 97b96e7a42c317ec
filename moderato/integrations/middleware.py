"""The two pure-ASGI middlewares.

``RateLimitHeadersMiddleware`` reports what decorators and dependencies
decided (quota headers on their responses) and turns moderato's exceptions
into responses. ``RateLimitMiddleware`` does the same and also enforces an
app-wide rule before the application sees the request.

Both translate only moderato's exceptions, and only before the response has
started: once headers are on the wire a second response would corrupt the
stream, so the error propagates instead. In a mounted sub-application,
install the middleware on the child: the child's own error middleware answers
500 before an exception reaches the parent.

``RateLimitMiddleware`` limits websocket handshakes as well, by default
(``websockets=False`` lets them through): the app-wide limit is meant for
every request, and an upgrade request left out would be a way around it. A
refused handshake gets the same 429 as an HTTP request where the server
offers the denial-response extension, else a close before accept (1008),
see websocket_errors.py.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn, Optional, cast

from starlette.requests import HTTPConnection, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from .. import _accel
from ..errors import RateLimitConfigError
from ..options import request_callback_option
from ..results import CheckResult
from ..specs import RULE_OPTIONS, CostSpec, RateSpec, RequestCallback, RuleOptions
from ..web.addresses import ProxyHeader
from ..web.headers import HeaderList, HeaderStyle, legacy_for_one, render, report, validate_style
from ..web.paths import ExemptPaths, exact_paths, normalize
from ..web.responses import error_response
from . import stack
from .callbacks import call_callback, callback_returned_unusable
from .decisions import DECISIONS, HEADERS_DONE, MIDDLEWARE, claim_headers, mark_middleware
from .declared import declare
from .exempt_apps import exempt_mount_paths
from .identity import ClientIdentity
from .order import log_misplaced
from .request_limits import Limit
from .responses import denial_headers, send_json
from .rule import LimitRule, check_options
from .websocket_errors import refuse

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..limiter import RateLimiter

ExemptPredicate = RequestCallback[bool]


class _RoutesChecked:
    """What both middlewares do on their first HTTP request: log every limit the
    app's routes hold in the wrong place (the request path tests ``routes_checked``)."""

    routes_checked: bool

    def _check_routes(self, scope: Scope) -> None:
        self.routes_checked = True
        log_misplaced(scope.get("app"))


class RateLimitHeadersMiddleware(_RoutesChecked):
    """Adds rate-limit headers to limited responses; answers 429/422/503 for moderato errors.

    ``headers``: ``"legacy"`` (X-RateLimit-*), ``"ietf"`` (RateLimit-Policy and
    RateLimit), ``"both"``, or None (no quota headers; Retry-After stays).
    """

    def __init__(self, app: ASGIApp, *, headers: HeaderStyle = "legacy") -> None:
        self.app = app
        self.headers = validate_style(headers)
        self.routes_checked = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.routes_checked:
            self._check_routes(scope)
        # serve() written out: this coroutine is resumed on every suspension of the
        # request below it (its Redis round trip), a second one would be too.
        style = self.headers
        send_with_headers = _SENDERS(scope, send, style)
        scope[MIDDLEWARE] = scope.get("app")  # mark_middleware(scope), without the call
        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as error:
            if send_with_headers.started or not await send_error(error, scope, send, style):
                raise


class RateLimitMiddleware(_RoutesChecked):
    """An app-wide limit, enforced before the application runs; rejected requests never reach it.

    - ``rate``: one or more policies (``"50/second;10000/day"``), decided atomically;
    - ``key``: identity callback; by default the limiter's ``key``, else the
      client IP (forwarding headers believed only from ``trusted_proxies``).
      ``api_key_header`` opts in to keying on that header's value when sent:
      unvalidated, it lets a client mint a fresh identity per request, so
      validate keys in a ``key`` callback instead (see docs/http.md);
    - ``cost`` for every request, or ``costs`` per exact path (``{"/export": 20}``);
    - ``exempt_paths``: exact paths (a trailing slash is ignored), or prefixes
      ending in ``*`` (``"/static/*"``), see paths.py; ``exempt``:
      predicates of the request (sync or async). Health checks belong here:
      limiting them gets healthy instances restarted under load;
      ``exempt_when``: one more such predicate, named as for the decorator;
    - ``websockets``: limit websocket handshakes too (the default);
    - ``scope``: the bucket's name, shared by every path (give two app-wide
      middlewares different scopes);
    - ``headers``: as for RateLimitHeadersMiddleware, whose job this middleware
      also does for decorated endpoints below it.

    Paths are matched without the ASGI root path, so the same configuration
    works behind a proxy prefix or on a mounted sub-application.
    """

    moderato_app_wide = True
    """Marks the class for request_limits.py, which looks for it in mounted applications."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: RateLimiter,
        rate: RateSpec,
        costs: Optional[Mapping[str, int]] = None,
        exempt_paths: Iterable[str] = (),
        exempt: Iterable[ExemptPredicate] = (),
        websockets: bool = True,
        headers: HeaderStyle = "legacy",
        api_key_header: Optional[str] = None,
        trusted_proxies: Iterable[str] = (),
        proxy_header: ProxyHeader = "x-forwarded-for",
        **options: Unpack[RuleOptions],
    ) -> None:
        check_options("RateLimitMiddleware()", options, RULE_OPTIONS | MIDDLEWARE_OPTIONS)
        self.app = app
        self.headers = validate_style(headers)
        # An app-wide rule's own default: one "app" bucket. (Its name is the
        # option scope=; in this file a bare `scope` is always the ASGI scope.)
        bucket_scope = options.setdefault("scope", "app")
        if not isinstance(bucket_scope, str) or not bucket_scope:
            raise RateLimitConfigError("scope must be a non-empty string")
        self.bucket_scope = bucket_scope
        if not isinstance(websockets, bool):
            raise RateLimitConfigError(
                f"websockets must be True or False, got {type(websockets).__name__}"
            )
        self.websockets = websockets
        if options.get("key") is None and (api_key_header is not None or trusted_proxies):
            # Identity options given here; otherwise the limiter's default key applies.
            options["key"] = ClientIdentity(
                api_key_header=api_key_header,
                trusted_proxies=trusted_proxies,
                proxy_header=proxy_header,
            )

        def rule_for(charge: Optional[CostSpec]) -> LimitRule:
            charged: RuleOptions = {**options, "cost": charge}
            return LimitRule(limiter, rate, **charged)

        self.rule = LimitRule(limiter, rate, **options)
        self.path_rules = {
            path: rule_for(charge) for path, charge in exact_paths("costs", costs or {}).items()
        }
        for rule in (self.rule, *self.path_rules.values()):
            rule.origin = "RateLimitMiddleware"
            declare(rule)
        self._inner: Optional[list[RateLimitMiddleware]] = None
        """The RateLimitMiddlewares inside this one, found at the first request."""
        self.exempt_paths = ExemptPaths(exempt_paths)
        self.mounts_checked = False
        """Whether the exempt applications mounted below (the dashboard) were looked for."""
        self.routes_checked = False
        self.exempt = tuple(exempt)
        for predicate in self.exempt:
            if not callable(predicate):
                raise RateLimitConfigError(
                    f"exempt predicates must be callable, got {predicate!r:.80}"
                )
            request_callback_option("exempt", predicate, "bool")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.websockets:
            await self._handshake(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.routes_checked:
            self._check_routes(scope)
        path = route_path(scope)
        if self._exempt_path(path):
            await serve(self.app, scope, receive, send, self.headers)
            return
        mark_middleware(scope)
        # No receive: callbacks may read headers, never the body the app still needs.
        request = Request(scope)
        try:
            limits = self._limits_now(request)
            if limits is None:
                limits = await self._limits(request)
            await stack.decide_for_middleware(limits, request, limits_inside)
        except Exception as error:
            if not await send_error(error, scope, send, self.headers):
                raise
            return
        await serve(self.app, scope, receive, send, self.headers)

    async def _handshake(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Limit a websocket handshake; a refused one never reaches the application."""
        if not self._exempt_path(route_path(scope)):
            # No receive, no send: callbacks read the handshake's headers, nothing else.
            connection = WebSocket(scope, _no_receive, _no_send)
            try:
                await stack.decide_for_middleware(
                    await self._limits(connection), connection, limits_inside
                )
            except Exception as error:
                if not await refuse(error, scope, send, self.headers):
                    raise
                return
        await self.app(scope, receive, send)

    def _limits_now(self, connection: HTTPConnection) -> Optional[list[Limit]]:
        """``_limits`` without a coroutine when no ``exempt`` predicate must be asked."""
        if self._inner is None:
            self._inner = _inner_middlewares(self.app)
        if self.exempt or any(inner.exempt for inner in self._inner):
            return None
        if not self._inner:
            limit = self.limit_for_path(connection.scope)
            return [] if limit is None else [limit]
        limits = (m.limit_for_path(connection.scope) for m in (self, *self._inner))
        return [limit for limit in limits if limit is not None]

    async def _limits(self, connection: HTTPConnection) -> list[Limit]:
        """This middleware's limit for the request, then those of the RateLimitMiddlewares
        inside it (the same application's), which are decided with it."""
        if self._inner is None:
            self._inner = _inner_middlewares(self.app)
        return await _limits_of((self, *self._inner), connection)

    def limit_for_path(self, scope: Scope) -> Optional[Limit]:
        """The limit this middleware applies to the request's path and type; None when
        they are exempt (the ``exempt`` predicates are asked apart)."""
        if scope["type"] == "websocket" and not self.websockets:
            return None
        path = route_path(scope)
        if self._exempt_path(path):
            return None
        rule = self.path_rules.get(normalize(path), self.rule) if self.path_rules else self.rule
        return Limit(rule, self.bucket_scope)

    def _exempt_path(self, path: str) -> bool:
        if not self.mounts_checked:  # once: where exempt applications are mounted below
            self.mounts_checked = True
            mounts = exempt_mount_paths(self.app)
            if mounts:
                self.exempt_paths = self.exempt_paths.with_mounts(mounts)
        return self.exempt_paths.match(path)

    async def _exempt(self, request: HTTPConnection) -> bool:
        for predicate in self.exempt:
            verdict = await call_callback("exempt", predicate, cast(Request, request))
            if not isinstance(verdict, bool):
                raise callback_returned_unusable(
                    "exempt", f"exempt predicate returned {type(verdict).__name__}, not bool"
                )
            if verdict:
                return True
        return False


MIDDLEWARE_OPTIONS: frozenset[str] = frozenset(
    inspect.signature(RateLimitMiddleware.__init__).parameters
) - {"self", "app", "options"}
"""RateLimitMiddleware's own keywords, besides the rule options it forwards."""


async def serve(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, style: HeaderStyle
) -> None:
    """Run ``app``, adding decision headers to its response and answering moderato errors."""
    send_with_headers = _SENDERS(scope, send, style)
    scope[MIDDLEWARE] = scope.get("app")  # mark_middleware(scope)
    try:
        await app(scope, receive, send_with_headers)
    except Exception as error:
        if send_with_headers.started or not await send_error(error, scope, send, style):
            raise


async def send_error(error: Exception, scope: Scope, send: Send, style: HeaderStyle) -> bool:
    """Answer a moderato exception; False (nothing sent) for any other exception."""
    response = error_response(error)
    if response is None:
        return False
    headers = denial_headers(response, scope, style)
    # This response is complete: middlewares further out must not add to it.
    claim_headers(scope)
    await send_json(send, response.status, response.body, headers)
    return True


def _decision_headers(decisions: list[CheckResult], style: HeaderStyle) -> HeaderList:
    """The headers a response gets for the request's decisions: one admitted legacy
    decision's quick case (``legacy_for_one``), else the decisions' report, rendered.
    The send wrapper (``_SENDERS``) builds the quick case itself when it can."""
    extra = None
    if style == "legacy" and len(decisions) == 1:
        extra = legacy_for_one(decisions[0])  # one admitted decision
    if extra is None:
        decision_report = report(decisions)
        extra = [] if decision_report is None else render(decision_report, style, time.time())
    return extra


_SENDERS = _accel.HeaderSenders(
    headers_done=HEADERS_DONE, decisions=DECISIONS, fallback=_decision_headers
)
"""Makes one request's ``send`` with the decision headers added to its response start
(csrc/fast_route.c; ``_SENDERS(scope, send, style)``): not a coroutine, the application
awaits the inner send's own awaitable; the headers the application sets itself win.
Every request through either middleware makes one and calls it for every message."""


def route_path(scope: Scope) -> str:
    """The path below the ASGI root path, as routing sees it."""
    path = str(scope.get("path", ""))
    root_path = str(scope.get("root_path", ""))
    if (
        root_path
        and path.startswith(root_path)
        and path[len(root_path) : len(root_path) + 1] in ("", "/")
    ):
        return path[len(root_path) :] or "/"
    return path


async def _limits_of(
    middlewares: Iterable[RateLimitMiddleware], connection: HTTPConnection
) -> list[Limit]:
    limits = []
    for middleware in middlewares:
        limit = middleware.limit_for_path(connection.scope)
        if limit is None:
            continue
        # No predicates (the usual case): no coroutine to ask them.
        if not (middleware.exempt and await middleware._exempt(connection)):
            limits.append(limit)
    return limits


async def limits_inside(app: Any, connection: HTTPConnection) -> list[Limit]:
    """The limits the RateLimitMiddlewares of a mounted application apply to a request.

    A Starlette application builds its middleware stack at its first request;
    building it here first is what that request would do (the stack is kept).
    """
    if getattr(app, "middleware_stack", True) is None and hasattr(app, "build_middleware_stack"):
        app.middleware_stack = app.build_middleware_stack()
    first = getattr(app, "middleware_stack", None) or app
    return await _limits_of(_inner_middlewares(first), connection)


def _inner_middlewares(app: ASGIApp) -> list[RateLimitMiddleware]:
    """The RateLimitMiddlewares down the chain of ``.app`` attributes (middlewares keep
    the next application there), outermost first, up to the router."""
    found: list[RateLimitMiddleware] = []
    current: object = app
    for _ in range(64):
        if isinstance(current, RateLimitMiddleware):
            found.append(current)
        current = getattr(current, "app", None)
        if current is None or not hasattr(current, "__call__"):  # noqa: B004
            break
    return found


async def _no_receive() -> NoReturn:
    raise RuntimeError("rate-limit callbacks cannot receive from a websocket")


async def _no_send(message: Message) -> NoReturn:
    raise RuntimeError("rate-limit callbacks cannot send on a websocket")
