"""HTTP and WebSocket integration: install(), decorator, dependency, middlewares, message limits."""

from __future__ import annotations

from ..specs import RateLimitDependency
from ..web.headers import HeaderStyle

# First: without Starlette, an ImportError naming the extra to install.
from . import _starlette  # noqa: F401
from .decorator import REQUEST_PARAMETER, limit
from .dependency import dependency
from .http_errors import HTTPBackendError, HTTPRateLimitCallbackError, HTTPRateLimitExceeded
from .identity import ClientIdentity
from .middleware import RateLimitHeadersMiddleware, RateLimitMiddleware
from .scope import route_scope
from .websocket import MessageLimit
from .wiring import install

__all__ = [
    "REQUEST_PARAMETER",
    "ClientIdentity",
    "HTTPBackendError",
    "HTTPRateLimitCallbackError",
    "HTTPRateLimitExceeded",
    "HeaderStyle",
    "MessageLimit",
    "RateLimitDependency",
    "RateLimitHeadersMiddleware",
    "RateLimitMiddleware",
    "dependency",
    "install",
    "limit",
    "route_scope",
]
