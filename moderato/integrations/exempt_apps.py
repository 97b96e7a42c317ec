"""Mounted applications no app-wide limit applies to (the operator's dashboard).

An application marks itself with a true ``moderato_exempt`` attribute;
RateLimitMiddleware finds where it is mounted (at any depth of mounts) the
first time it needs to know, and adds those paths to its exempt paths: a
request to them is neither limited nor charged. Only mounts at fixed paths
can be found so; one under a path parameter is logged and left limited.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.routing import Mount

from .scope import child_routes, expand_routes

logger = logging.getLogger("moderato")

EXEMPT_ATTRIBUTE = "moderato_exempt"
_MAX_DEPTH = 16


def exempt_mount_paths(app: Any) -> list[str]:
    """The paths (below the root path) where exempt applications are mounted in ``app``."""
    found: list[str] = []
    _walk(child_routes(app) or (), "", found, 0)
    return found


def _walk(routes: Any, prefix: str, found: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    for original, effective in expand_routes(list(routes)):
        if not isinstance(original, Mount):
            continue
        mounted = getattr(effective, "app", None)
        path = prefix + str(getattr(effective, "path", ""))
        if _is_exempt(mounted):
            if "{" in path:
                logger.warning(
                    "moderato: %s is mounted under a path parameter (%s); app-wide limits "
                    "still apply to it: mount it at a fixed path to exempt it",
                    type(mounted).__name__,
                    path,
                )
            else:
                found.append(path)
            continue
        children = child_routes(mounted)
        if children is not None:
            _walk(children, path, found, depth + 1)


def _is_exempt(app: Any) -> bool:
    for _ in range(_MAX_DEPTH):  # through middlewares wrapping it, each keeping it in .app
        if app is None:
            return False
        if getattr(app, EXEMPT_ATTRIBUTE, False) is True:
            return True
        app = getattr(app, "app", None)
    return False
