"""The default scope of a decorated endpoint: method + root path + mount templates + route template.

HEAD counts as GET: Starlette answers HEAD on every GET route by running the
GET endpoint, so a separate HEAD bucket would let each GET route run twice
its limit. A websocket handshake's "method" is ``WS`` (``WS:/chat``): the
upgrade request is a GET, but a websocket route and a GET route at the same
path are two endpoints with two quotas.

A scope names the bucket a rule counts in. It is built from templates, not
concrete paths, so ``/users/1`` and ``/users/2`` share one quota per identity
(a client cannot mint fresh quotas by varying a path parameter) while two
routes, or one sub-app mounted at two templates, never do::

    GET:/tenants/{tenant}/items/{item_id}
    POST://{region}.example.com/api/v1/jobs         (under a Host route)

The routing tree is walked once per application (from the outermost router,
which Starlette records in ``scope["router"]``) and indexed by endpoint; a
request then costs a dictionary lookup, plus a regex match only when one
endpoint is reachable through several templates.

When the template cannot be recovered (an opaque ASGI app between two
routers, a path rewritten after routing, an app that is not a Starlette
routing tree at all) the scope falls back to ``METHOD:fallback:<module>.<qualname>``
of the endpoint, and a warning is logged once. Limiting is never skipped;
pass ``scope=`` explicitly to choose the bucket yourself.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from starlette.routing import BaseRoute, Host, Mount, Route, WebSocketRoute, compile_path
from starlette.types import Scope

logger = logging.getLogger("moderato")

FALLBACK_MARKER = "fallback"
WEBSOCKET_METHOD = "WS"
_MAX_DEPTH = 32
_MAX_UNWRAP = 16

_iter_route_contexts: Optional[Callable[[list[Any]], Iterator[Any]]]
try:  # Newer FastAPI keeps an included router as one route, with per-inclusion paths.
    from fastapi.routing import iter_route_contexts as _fastapi_route_contexts

    _iter_route_contexts = _fastapi_route_contexts
except ImportError:  # pragma: no cover - Starlette only, or a FastAPI that flattens includes
    _iter_route_contexts = None


@dataclass(frozen=True)
class _Template:
    """One way to reach an endpoint: its full path template and optional host template."""

    path: str
    host: Optional[str]
    path_regex: Optional[re.Pattern[str]]
    host_regex: Optional[re.Pattern[str]]
    route: Any = field(default=None, compare=False, repr=False)
    """The route object (FastAPI's per-inclusion context, when it has one)."""
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What other modules work out once per template (request_limits.py: its limits per method)."""

    def matches(self, route_path: str, host: Optional[str]) -> bool:
        if self.path_regex is not None and not self.path_regex.match(route_path):
            return False
        if self.host_regex is None:
            return True
        return host is not None and self.host_regex.match(host) is not None

    def render(self, method: str, root_path: str) -> str:
        host = f"//{self.host}" if self.host is not None else ""
        return f"{method}:{host}{root_path}{self.path}"


@dataclass
class _Index:
    """Every template under one outermost router, by endpoint identity."""

    templates: dict[int, list[_Template]] = field(default_factory=dict)
    endpoints: list[object] = field(default_factory=list)
    """Keeps the endpoints alive so their ids stay unique while indexed."""
    misses: set[int] = field(default_factory=set)
    route_count: int = 0
    """How many routes the router had when it was indexed."""
    derived: dict[str, Any] = field(default_factory=dict)
    opaque_mounts: bool = False
    """Whether a mount's routes could not be seen (an app that is not a routing tree)."""
    mounted_apps: list[Any] = field(default_factory=list)
    """The applications mounted under the router (their middlewares may limit too)."""
    routes: dict[tuple[object, object, object], Any] = field(default_factory=dict)
    """What request_limits.py works out once per (endpoint, method, root path) of a
    request: dropped with the index when it is built again (routes added or missed)."""


_indexes: dict[int, tuple[weakref.ref[Any], _Index]] = {}
INDEXES = _indexes
"""Each outermost router's index, by ``id(router)`` with a weak reference to it: read
directly by the one-limit check (stack.py), which must not pay a call to find it."""
_warned: set[str] = set()


def route_scope(scope: Scope, endpoint: Optional[Callable[..., Any]] = None) -> str:
    """The default scope for this request's route (see the module docstring).

    ``endpoint`` names the fallback when the routing tree gives no answer;
    by default the routed endpoint, ``scope["endpoint"]``.
    """
    method = scope_method(scope)
    template = route_template(scope)
    if template is not None:
        return template.render(method, _original_root_path(scope))
    return _fallback(method, endpoint if endpoint is not None else scope.get("endpoint"))


_ROUTE_TEMPLATE = "moderato.route_template"
"""The request's template in its scope, with the endpoint and router it was found for:
a decorated request asks for it twice (its route's limits, then its default scope)."""


def route_template(scope: Scope) -> Optional[_Template]:
    """The template the routed request came through; None when it cannot be discovered."""
    routed = scope.get("endpoint")
    router = scope.get("router")
    if routed is None or router is None:
        return None
    known = scope.get(_ROUTE_TEMPLATE)
    # A mount routes on with the same scope: another endpoint is another answer.
    if known is not None and known[0] is routed and known[1] is router:
        return known[2]  # type: ignore[no-any-return]
    templates = _templates_for(router, routed)
    template = _choose(templates, scope, _original_root_path(scope)) if templates else None
    scope[_ROUTE_TEMPLATE] = (routed, router, template)
    return template


def index_of(router: Any) -> _Index:
    """The index ``route_template`` reads for ``router`` (built if there is none)."""
    return _index(router)


def route_templates(router: Any) -> list[_Template]:
    """Every template under ``router`` (indexed once; again when routes were added since)."""
    index = _current_index(router)
    return [template for templates in index.templates.values() for template in templates]


def mounted_apps(router: Any) -> list[Any]:
    """The applications mounted (at any depth) under ``router`` whose routes are seen."""
    return list(_current_index(router).mounted_apps)


def has_opaque_mounts(router: Any) -> bool:
    """Whether a mount under ``router`` hides its routes (an opaque ASGI application)."""
    return _current_index(router).opaque_mounts


def router_derived(router: Any) -> dict[str, Any]:
    """What other modules work out once per routing tree (emptied when it is indexed again)."""
    return _current_index(router).derived


def _current_index(router: Any) -> _Index:
    index = _index(router)
    if index.route_count != _route_count(router):
        index = _index(router, rebuild=True)
    return index


def _route_count(router: Any) -> int:
    routes = getattr(router, "routes", None)
    return len(routes) if isinstance(routes, list) else 0


def scope_method(scope: Scope) -> str:
    """The request's method as scopes name it: HEAD shares GET's quota; a websocket is WS."""
    if scope.get("type") == "websocket":
        return WEBSOCKET_METHOD
    method = str(scope.get("method", "GET")).upper()
    return "GET" if method == "HEAD" else method


def routed_endpoints(router: Any) -> list[tuple[object, str]]:
    """Every (endpoint, full path template) reachable from ``router``, freshly walked."""
    index = _index(router, rebuild=True)
    found: dict[int, tuple[object, str]] = {}
    for endpoint in index.endpoints:
        templates = index.templates.get(id(endpoint))
        if templates and id(endpoint) not in found:
            found[id(endpoint)] = (endpoint, templates[0].path)
    return list(found.values())


def _templates_for(router: Any, endpoint: object) -> Optional[list[_Template]]:
    index = _index(router)
    templates = index.templates.get(id(endpoint))
    if templates is None and id(endpoint) not in index.misses:
        # Routes can be added after the first request; look once more, then remember.
        index = _index(router, rebuild=True)
        templates = index.templates.get(id(endpoint))
        if templates is None:
            index.misses.add(id(endpoint))
    return templates


def _index(router: Any, *, rebuild: bool = False) -> _Index:
    entry = _indexes.get(id(router))
    if entry is not None and entry[0]() is router and not rebuild:
        return entry[1]
    index = _Index(route_count=_route_count(router))
    _walk(getattr(router, "routes", []), index, prefix="", host=None, depth=0)
    if entry is not None and entry[0]() is router:
        index.misses = entry[1].misses
    key = id(router)

    def forget(_: weakref.ref[Any], key: int = key) -> None:
        _indexes.pop(key, None)

    _indexes[key] = (weakref.ref(router, forget), index)
    return index


def _walk(
    routes: Sequence[Any], index: _Index, *, prefix: str, host: Optional[str], depth: int
) -> None:
    if depth > _MAX_DEPTH:
        return
    for original, effective in expand_routes(routes):
        path = getattr(effective, "path", None)
        if isinstance(original, Mount):
            children = child_routes(getattr(effective, "app", None))
            if children is not None:
                index.mounted_apps.append(getattr(effective, "app", None))
                _walk(children, index, prefix=prefix + str(path or ""), host=host, depth=depth + 1)
            else:
                index.opaque_mounts = True
        elif isinstance(original, Host):
            children = child_routes(getattr(effective, "app", None))
            if children is not None:
                _walk(children, index, prefix=prefix, host=original.host, depth=depth + 1)
        elif isinstance(original, (Route, WebSocketRoute)) or (
            path is not None and hasattr(effective, "endpoint")
        ):
            endpoint = getattr(effective, "endpoint", None)
            if endpoint is None or path is None:
                continue
            template = _template(prefix + str(path), host, effective)
            index.templates.setdefault(id(endpoint), []).append(template)
            index.endpoints.append(endpoint)


def expand_routes(routes: Sequence[Any]) -> Iterator[tuple[Any, Any]]:
    """(original route, object carrying its effective path) for each route.

    FastAPI's included routers share route objects between inclusions and
    hold the prefixed path in a per-inclusion context; older FastAPI and
    Starlette routes carry their full path themselves.
    """
    if _iter_route_contexts is None:
        for route in routes:
            yield route, route
        return
    for context in _iter_route_contexts(list(routes)):
        yield context.original_route, context


def child_routes(app: Any) -> Optional[Sequence[BaseRoute]]:
    # A mount's app may be wrapped in middleware; the routing tree is usually
    # reachable through the conventional ``.app`` attribute.
    for _ in range(_MAX_UNWRAP):
        if app is None:
            return None
        routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            return routes
        app = getattr(app, "app", None)
    return None


def _template(path: str, host: Optional[str], route: Any) -> _Template:
    return _Template(
        path=path, host=host, path_regex=_compile(path), host_regex=_compile(host), route=route
    )


def _compile(template: Optional[str]) -> Optional[re.Pattern[str]]:
    if template is None:
        return None
    try:
        regex, _, _ = compile_path(template)
    except (AssertionError, ValueError):
        # e.g. a parameter name used by both a mount and its route: matching
        # cannot tell templates apart, so this one is taken as matching.
        return None
    return regex


def _original_root_path(scope: Scope) -> str:
    # Starlette's mounts extend root_path and keep the original in app_root_path.
    root = scope.get("app_root_path")
    if root is None:
        root = scope.get("root_path", "")
    return str(root)


def _choose(templates: list[_Template], scope: Scope, root_path: str) -> Optional[_Template]:
    if len(templates) == 1:
        return templates[0]
    route_path = _route_path(str(scope.get("path", "")), root_path)
    host = _host(scope)
    for template in templates:
        if template.matches(route_path, host):
            return template
    return None


def _route_path(path: str, root_path: str) -> str:
    if (
        root_path
        and path.startswith(root_path)
        and path[len(root_path) : len(root_path) + 1] in ("", "/")
    ):
        return path[len(root_path) :]
    return path


def _host(scope: Scope) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key == b"host":
            host = value.decode("latin-1").lower()
            if host.startswith("["):
                return str(host.split("]", 1)[0] + "]")
            return str(host.split(":", 1)[0])
    return None


def _fallback(method: str, endpoint: Optional[Callable[..., Any]]) -> str:
    if endpoint is None:
        name = "unknown"
    else:
        module = getattr(endpoint, "__module__", None) or "unknown"
        qualname = getattr(endpoint, "__qualname__", None) or type(endpoint).__qualname__
        name = f"{module}.{qualname}"
    fallback = f"{method}:{FALLBACK_MARKER}:{name}"
    if fallback not in _warned:
        _warned.add(fallback)
        logger.warning(
            "moderato could not discover the route template for %s (opaque ASGI mount, "
            "path rewriting, or not a Starlette routing tree); limiting under the fallback "
            "scope %r. Pass scope=... to the rule to choose the bucket explicitly.",
            name,
            fallback,
        )
    return fallback
