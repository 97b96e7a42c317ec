"""moderato's exceptions as Starlette ``HTTPException`` subclasses, for apps without its middleware.

A decorator or dependency in an app with neither RateLimitHeadersMiddleware
nor a handler would otherwise end in a 500. Raised as these subclasses, the
framework's own HTTPException handler answers instead: FastAPI with
``{"detail": "Rate limit exceeded"}`` (Starlette: the same text), status 429
(422 for a cost above capacity), ``Retry-After`` and the quota headers; 503
for a backend or callback failure.

The moderato class comes first among the bases: Starlette looks handlers up
along the exception's MRO, so an application's handler for RateLimitExceeded
(or BackendError, RateLimitCallbackError, ModeratoError) is found before the
HTTPException one and keeps answering as before. When a moderato middleware
wraps the request, the plain exceptions are raised instead, so that the
middleware's JSON bodies stay exactly as they are.
"""

from __future__ import annotations

import time
from typing import Optional, TypeVar

from starlette.exceptions import HTTPException
from starlette.types import Scope

from ..errors import BackendError, ModeratoError, RateLimitCallbackError, RateLimitExceeded
from ..web.headers import render, report
from .decisions import recorded

E = TypeVar("E", bound="_HTTPModeratoError")


class _HTTPModeratoError(ModeratoError, HTTPException):
    # moderato's message, not HTTPException's "429: detail", in logs and tracebacks.
    __str__ = BaseException.__str__
    __repr__ = BaseException.__repr__


class HTTPRateLimitExceeded(RateLimitExceeded, _HTTPModeratoError):
    """A denial (429, or 422 for a cost above capacity) that any Starlette app can answer."""


class HTTPBackendError(BackendError, _HTTPModeratoError):
    """The backend could not decide (503); the original error is ``__cause__``."""


class HTTPRateLimitCallbackError(RateLimitCallbackError, _HTTPModeratoError):
    """A key, tenant, cost or rate callback failed (503); ``error`` is what it raised."""


def _adopt(
    cls: type[E], error: ModeratoError, status: int, detail: str, headers: dict[str, str]
) -> E:
    """A copy of ``error`` (same args and attributes) as ``cls``, answerable as ``status``.

    The moderato constructors are not called again: their ``super().__init__``
    would reach HTTPException's through this class's MRO.
    """
    converted = cls.__new__(cls, *error.args)
    converted.__dict__.update(vars(error))
    converted.status_code = status
    converted.detail = detail
    converted.headers = headers
    return converted


def http_error(error: ModeratoError, scope: Scope) -> Optional[ModeratoError]:
    """The HTTPException form of a moderato error raised for this request, or None if none fits."""
    if isinstance(error, RateLimitExceeded):
        denial_report = report(recorded(scope), error)
        rendered = [] if denial_report is None else render(denial_report, "legacy", time.time())
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in rendered}
        return _adopt(
            HTTPRateLimitExceeded, error, error.status_code, "Rate limit exceeded", headers
        )
    if isinstance(error, RateLimitCallbackError):
        return _adopt(HTTPRateLimitCallbackError, error, 503, "Rate limit callback failed", {})
    if isinstance(error, BackendError):
        return _adopt(HTTPBackendError, error, 503, "Rate limit backend unavailable", {})
    return None
