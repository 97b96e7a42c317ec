"""The route a request will reach, found before the router runs it.

RateLimitMiddleware decides before routing, yet its decision must include the
limits of the route the request is going to (stack.py). This module runs the
routing tree's own matching (each route's ``matches``, as Starlette's router
calls it, mounts and hosts followed into their routers) on a copy of the
request's scope, without running anything, and returns the scope the
endpoint would see: ``endpoint``, ``path_params``, root paths, ``router``.

A request that reaches no endpoint (404, 405, a slash redirect) has no route
limits. A mount whose routing tree cannot be seen (an opaque ASGI app) is
reported as such: the limits inside it, if any, could not be decided with the
middleware's, and stack.py refuses them when they run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

from starlette.routing import Host, Match, Mount
from starlette.types import Scope

from .scope import child_routes, expand_routes

_MAX_DEPTH = 32


class Opaque:
    """The request enters a mounted application whose routes cannot be seen."""

    def __init__(self, mount_path: str) -> None:
        self.mount_path = mount_path


Resolved = Union[Scope, Opaque, None]
"""The endpoint's scope; Opaque; or None when no endpoint would run."""


def resolve(
    scope: Scope, routes: Sequence[Any], router: Any, mounts: list[tuple[Any, Scope]]
) -> Resolved:
    """Where ``scope`` goes in ``routes`` (the router ``router``'s), as routing would take it.

    Each mounted application the request enters is added to ``mounts`` with the
    scope it would receive (its own middlewares may limit the request too).
    """
    start = dict(scope)
    start.setdefault("router", router)
    return _resolve(routes, start, 0, mounts)


def _resolve(
    routes: Sequence[Any], scope: Scope, depth: int, mounts: list[tuple[Any, Scope]]
) -> Resolved:
    if depth > _MAX_DEPTH:
        return None
    for original, effective in _expanded(routes):
        try:
            match, child_scope = effective.matches(scope)
        except Exception:  # a route that cannot match this scope: routing would fail too
            return None
        if match is Match.FULL:
            matched = {**scope, **child_scope}
            if isinstance(original, (Mount, Host)):
                mounted = getattr(effective, "app", None)
                children = child_routes(mounted)
                if children is None:
                    return Opaque(str(getattr(effective, "path", "") or "/"))
                mounts.append((mounted, matched))
                return _resolve(children, matched, depth + 1, mounts)
            return matched
        # A partial match (the path, not the method) answers 405: no endpoint runs, and
        # neither does one further down the list. A full match further down wins over it.
    return None


_EXPANDED_MAX = 256
_expansions: dict[int, tuple[Sequence[Any], int, list[tuple[Any, Any]]]] = {}
"""Route lists already expanded (FastAPI builds a context per included route), by id."""


def _expanded(routes: Sequence[Any]) -> list[tuple[Any, Any]]:
    """``expand_routes(routes)``, worked out again only when the list's length changed."""
    known = _expansions.get(id(routes))
    if known is not None and known[0] is routes and known[1] == len(routes):
        return known[2]
    expanded = list(expand_routes(routes))
    if len(_expansions) >= _EXPANDED_MAX:
        _expansions.clear()
    _expansions[id(routes)] = (routes, len(routes), expanded)
    return expanded


def router_of(app: Any) -> Optional[Any]:
    """The router of a Starlette application (or the router itself); None for anything else."""
    router = getattr(app, "router", app)
    return router if isinstance(getattr(router, "routes", None), list) else None
