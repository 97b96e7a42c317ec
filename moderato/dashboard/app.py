"""``Dashboard``: the operator's dashboard, an ASGI application to mount in the app it watches.

    app.mount("/ratelimits", Dashboard(limiter, auth=is_operator))

Every request to it is first shown to ``auth`` (sync or async, given the
Request): True, or a non-empty string naming the operator, lets it in;
anything else is answered 403, and an HTTPException it raises (a 401 with
a login challenge) is answered as it says. This holds for every path, the
page, the JSON and the reset alike. Without ``auth`` the dashboard refuses
to be built unless ``allow_anonymous=True`` says that anyone who can reach
it may use it.

Its routes:

- ``GET /``: the page (one self-contained HTML file: its script and styles
  inline under a nonce, the chart drawn on a canvas; nothing else is loaded);
- ``GET /api/summary``: everything the page shows, as JSON (polled);
- ``GET /api/usage?identity=...&tenant=...``: one identity's usage on every limit;
- ``POST /api/reset``: forget one identity's usage (JSON body ``identity``,
  ``tenant``). CSRF: the page's cookie and the ``X-CSRF-Token`` header it
  sends must match (a page of another site can set neither), and an
  ``Origin`` header, when sent, must be this host's. Logged with the operator.

Building a Dashboard attaches a DecisionRecorder to the limiter (one per
limiter, shared by every Dashboard of it) and, on a Redis backend, a
Publisher (fleet.py). RateLimitMiddleware leaves the paths a Dashboard is
mounted at alone (``moderato_exempt``): looking at the dashboard is never
charged to anyone.
"""

from __future__ import annotations

import hmac
import html
import inspect
import logging
import secrets
import time
import weakref
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from ..errors import ModeratoError, RateLimitConfigError
from ..options import seconds_option
from ..redis import RedisClientError
from . import identity_usage
from .fleet import FleetKeys, Publisher, ThreadPublisher, read_fleet, remote_client
from .health import describe_backend, redis_info
from .identities import shown_identity
from .limits import DeclaredLimit, declared_limits, limit_rows
from .recorder import DecisionRecorder
from .snapshot import ProcessView, backend_secrets, merge, redact
from .view import WINDOW_S, local_series, local_views, summary

if TYPE_CHECKING:
    from ..limiter import RateLimiter
    from .snapshot import AnyLimiter

logger = logging.getLogger("moderato.dashboard")

Auth = Callable[[Request], Union[bool, str, Awaitable[Union[bool, str]]]]
"""Given the request: True (or the operator's name) lets it in."""

CSRF_COOKIE = "moderato_dashboard_csrf"
CSRF_HEADER = "x-csrf-token"
MAX_IDENTITY_CHARS = 1024
LIMITS_CACHE_S = 5.0
INFO_CACHE_S = 1.0
PAGE = Path(__file__).with_name("page.html")
_SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

AnyPublisher = Union[Publisher, ThreadPublisher]
Attached = tuple[DecisionRecorder, Optional[AnyPublisher]]
"""A limiter's recorder and its publisher (None on memory://)."""
_attached: weakref.WeakKeyDictionary[AnyLimiter, Attached] = weakref.WeakKeyDictionary()


def attach(limiter: AnyLimiter) -> Attached:
    """The limiter's recorder (and publisher, on Redis), made and attached on first use:
    a task's for the asyncio limiter, a daemon thread's for the blocking one. The
    limiter's ``close()`` ends the publisher; its next check starts it again."""
    existing = _attached.get(limiter)
    if existing is not None:
        return existing
    from ..limiter import RateLimiter

    recorder = DecisionRecorder()
    client = remote_client(limiter)
    publisher: Optional[AnyPublisher] = None
    if client is not None:
        kind = Publisher if isinstance(limiter, RateLimiter) else ThreadPublisher
        publisher = kind(recorder, limiter, client)
        recorder.on_second = publisher.ensure_running
        # Closing the limiter ends the publisher (after its last publication) before
        # the connections close: no thread or task of a closed limiter reconnects.
        limiter.on_close(publisher.close)
    limiter.recorder = recorder
    _attached[limiter] = (recorder, publisher)
    return recorder, publisher


def record(limiter: AnyLimiter) -> DecisionRecorder:
    """Record ``limiter``'s checks for the dashboard and, on Redis, publish them.

    For a process that serves no Dashboard itself, most often one with the
    blocking ``moderato.sync.RateLimiter`` (a WSGI app, a worker): from its
    first check on, a daemon thread publishes its figures once a second, and
    every Dashboard on the same Redis and ``key_prefix`` lists it with the
    rest of the fleet. Idempotent (one recorder per limiter, the one a
    Dashboard of it would use); returns the recorder.
    """
    recorder, _ = attach(limiter)
    return recorder


class Dashboard:
    """The operator's dashboard for one limiter; see the module docstring."""

    moderato_exempt = True
    """RateLimitMiddleware does not limit the paths this application is mounted at."""

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        auth: Optional[Auth] = None,
        allow_anonymous: bool = False,
        refresh_s: float = 1.0,
        title: str = "moderato",
    ) -> None:
        from ..limiter import RateLimiter

        if not isinstance(limiter, RateLimiter):
            raise RateLimitConfigError(
                f"Dashboard() takes the RateLimiter to watch, got {type(limiter).__name__}"
            )
        if auth is None and allow_anonymous is not True:
            raise RateLimitConfigError(
                "Dashboard() needs auth=, a callable of the request (sync or async) returning "
                "True for an operator; or allow_anonymous=True to let anyone who can reach it "
                "see every limit and reset any identity"
            )
        if auth is not None and allow_anonymous:
            raise RateLimitConfigError(
                "Dashboard() got both auth= and allow_anonymous=True; pass one of them"
            )
        if auth is not None and not callable(auth):
            raise RateLimitConfigError(
                f"auth must be a callable of the request, got {type(auth).__name__}"
            )
        self.limiter = limiter
        self.auth = auth
        self.refresh_s = seconds_option("refresh_s", refresh_s)
        self.title = str(title)
        self.recorder, self.publisher = attach(limiter)
        self._client = remote_client(limiter)
        self._keys = FleetKeys(limiter.key_prefix)
        self._secrets = backend_secrets(limiter)
        self._limits: tuple[float, int, list[DeclaredLimit]] = (0.0, 0, [])
        self._info: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self._router = Router(
            routes=[
                Route("/", self._page, methods=["GET"]),
                Route("/api/summary", self._summary, methods=["GET"]),
                Route("/api/usage", self._usage, methods=["GET"]),
                Route("/api/reset", self._reset, methods=["POST"]),
            ]
        )
        self.routes = self._router.routes
        """Its routes, for the application's route walks (scope.py): it hides nothing."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._router(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket here: refuse it before accept
            await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive)
        refusal, operator = await self._admit(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        scope["moderato.dashboard.operator"] = operator
        await self._router(scope, receive, send)

    async def _admit(self, request: Request) -> tuple[Optional[Response], str]:
        """(None, the operator's name) for a request ``auth`` lets in, else (the refusal, "")."""
        client = request.client.host if request.client else "unknown client"
        if self.auth is None:
            return None, f"anonymous at {client}"
        try:
            verdict = self.auth(request)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except HTTPException as error:
            return _json({"error": error.detail}, error.status_code, error.headers), ""
        except Exception:
            logger.exception("moderato dashboard: auth raised; the request is refused")
            return _json({"error": "forbidden"}, 403), ""
        if verdict is True:
            return None, client
        if isinstance(verdict, str) and verdict:
            return None, verdict
        return _json({"error": "forbidden"}, 403), ""

    # -- routes -------------------------------------------------------------------

    async def _page(self, request: Request) -> Response:
        token = request.cookies.get(CSRF_COOKIE, "")
        if not _plausible_token(token):
            token = secrets.token_urlsafe(32)
        nonce = secrets.token_urlsafe(16)
        text = PAGE.read_text(encoding="utf-8")
        for name, value in (
            ("TITLE", self.title),
            ("CSRF", token),
            ("NONCE", nonce),
            ("REFRESH_MS", str(int(self.refresh_s * 1000))),
        ):
            text = text.replace("{{" + name + "}}", html.escape(value, quote=True))
        response = Response(text, media_type="text/html", headers=_SECURITY_HEADERS)
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'"
        )
        response.set_cookie(
            CSRF_COOKIE,
            token,
            path=(request.scope.get("root_path") or "") + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def _summary(self, request: Request) -> Response:
        now_s = time.time()
        processes, series, notice = await self._figures(now_s, WINDOW_S)
        body = summary(
            now_s=now_s,
            fleet=self._client is not None,
            processes=processes,
            series=series,
            limits=self._declared(request),
            secret=self.limiter._keyspace.identity_secret,
            backend=describe_backend(self._client),
            redis=await self._redis_info(),
            notice=notice,
        )
        return _json(body)

    async def _usage(self, request: Request) -> Response:
        identity, tenant, problem = _identity_of(dict(request.query_params))
        if problem:
            return _json({"error": problem}, 400)
        wanted = await self._targets(request, identity, tenant)
        rows = await identity_usage.usage(self.limiter, wanted, identity)
        return _json({"identity": self._shown(identity), "tenant": tenant, "limits": rows})

    async def _reset(self, request: Request) -> Response:
        problem = _csrf_problem(request)
        if problem:
            return _json({"error": problem}, 403)
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json({"error": 'send a JSON object: {"identity": ..., "tenant": ...}'}, 400)
        identity, tenant, problem = _identity_of(body)
        if problem:
            return _json({"error": problem}, 400)
        wanted = await self._targets(request, identity, tenant)
        tenants = [tenant, *(target.tenant for target in wanted)]
        operator = request.scope.get("moderato.dashboard.operator", "?")
        shown = self._shown(identity)
        try:
            deleted = await identity_usage.reset(self.limiter, identity, tenants)
        except ModeratoError as error:
            logger.warning("moderato dashboard: %s could not reset %s: %s", operator, shown, error)
            return _json({"error": f"{type(error).__name__}: {error}"}, 503)
        logger.warning(
            "moderato dashboard: %s reset the usage of %s (tenants %s): %d keys deleted",
            operator,
            shown,
            ", ".join(repr(each) for each in dict.fromkeys(tenants)),
            deleted,
        )
        return _json({"identity": shown, "tenant": tenant, "deleted": deleted})

    # -- helpers ------------------------------------------------------------------

    def _with_this_process(self, published: list[ProcessView]) -> list[ProcessView]:
        """The fleet's views, this process's own as it is now rather than as last published."""
        mine = self.recorder.process_id
        others = [view for view in published if view.meta.get("id") != mine]
        return [*local_views(self.recorder, self.limiter, self._secrets), *others]

    def _shown(self, identity: str) -> str:
        return shown_identity(identity, self.limiter._keyspace.identity_secret)

    def _declared(self, request: Request) -> list[DeclaredLimit]:
        """The app's declared limits, looked up again at most every LIMITS_CACHE_S."""
        app, router = request.scope.get("app"), request.scope.get("router")
        found_s, found_for, limits = self._limits
        if time.monotonic() - found_s < LIMITS_CACHE_S and found_for == id(app):
            return limits
        limits = declared_limits(self.limiter, app, router)
        self._limits = (time.monotonic(), id(app), limits)
        return limits

    async def _targets(
        self, request: Request, identity: str, tenant: Optional[str]
    ) -> list[identity_usage.Target]:
        processes, _, _ = await self._figures(time.time(), 0)
        rows = limit_rows(
            self._declared(request),
            merge(processes).limits,
            self.limiter._keyspace.identity_secret,
        )
        return identity_usage.targets(rows, identity, tenant, self.limiter.tenant)

    async def _figures(
        self, now_s: float, window_s: int
    ) -> tuple[list[ProcessView], dict[int, list[int]], str]:
        """Every process's figures and the series of ``window_s``; with Redis unreadable (or
        on memory://) this process's alone, and a notice saying why."""
        recorder = self.recorder
        if self._client is not None:
            if self.publisher is not None:
                self.publisher.ensure_running()
            try:
                reading = await read_fleet(self._client, self._keys, now_s, window_s)
            except RedisClientError as error:
                notice = redact(f"the fleet's figures cannot be read: {error}", self._secrets)
            else:
                return self._with_this_process(reading.processes), reading.series, ""
        else:
            notice = ""
        series = local_series(recorder, recorder.now_second()) if window_s else {}
        return local_views(recorder, self.limiter, self._secrets), series, notice

    async def _redis_info(self) -> list[dict[str, Any]]:
        if self._client is None:
            return []
        read_s, info = self._info
        if time.monotonic() - read_s >= INFO_CACHE_S:
            info = await redis_info(self._client)
            self._info = (time.monotonic(), info)
        return info


def _json(body: Any, status: int = 200, headers: Optional[Mapping[str, str]] = None) -> Response:
    return JSONResponse(body, status_code=status, headers={**_SECURITY_HEADERS, **(headers or {})})


def _plausible_token(token: str) -> bool:
    return 32 <= len(token) <= 64 and all(c.isalnum() or c in "-_" for c in token)


def _csrf_problem(request: Request) -> str:
    """Why a state-changing request may come from another site's page ("" when it cannot)."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    header = request.headers.get(CSRF_HEADER, "")
    if not (_plausible_token(cookie) and hmac.compare_digest(cookie, header)):
        return "CSRF check failed: reload the dashboard page and try again"
    origin = request.headers.get("origin")
    if origin is not None:
        expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin != expected:
            return f"CSRF check failed: a request from {origin} is not this dashboard's"
    return ""


def _identity_of(values: dict[str, Any]) -> tuple[str, Optional[str], str]:
    """(identity, tenant or None, "" or what is wrong with them)."""
    identity = values.get("identity")
    tenant = values.get("tenant") or None
    if not isinstance(identity, str) or not identity.strip():
        return "", None, "identity is required: an IP address, an API key (apikey:...) or a user id"
    if len(identity) > MAX_IDENTITY_CHARS:
        return "", None, f"identity is longer than {MAX_IDENTITY_CHARS} characters"
    if tenant is not None and not isinstance(tenant, str):
        return "", None, "tenant must be a string"
    return identity.strip(), tenant, ""
