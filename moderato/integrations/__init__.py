"""HTTP integration: decorator, dependency, scope discovery, identity, headers, middlewares."""

from __future__ import annotations

from .decorator import REQUEST_PARAMETER, limit
from .dependency import RateLimitDependency, dependency
from .headers import HeaderStyle
from .identity import ClientIdentity
from .middleware import RateLimitHeadersMiddleware, RateLimitMiddleware
from .scope import route_scope

__all__ = [
    "REQUEST_PARAMETER",
    "ClientIdentity",
    "HeaderStyle",
    "RateLimitDependency",
    "RateLimitHeadersMiddleware",
    "RateLimitMiddleware",
    "dependency",
    "limit",
    "route_scope",
]
