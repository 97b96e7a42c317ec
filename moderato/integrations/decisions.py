"""The decisions taken for one request, kept in its ASGI scope for the middleware to report.

The scope dict travels unchanged from the outermost middleware through
routers, mounts and into the endpoint's Request, so a decision recorded by a
decorator deep inside a mounted app is visible to a middleware installed on
the parent when the response starts.
"""

from __future__ import annotations

from starlette.types import Scope

from ..results import CheckResult

_DECISIONS = "moderato.decisions"
_HEADERS_DONE = "moderato.headers_done"
DECISIONS = _DECISIONS
"""The scope's key for its decisions: the paths of every request (decorator.py's
one-limit route, the headers middleware) read and write it without a call."""
HEADERS_DONE = _HEADERS_DONE


def record(scope: Scope, result: CheckResult) -> None:
    scope.setdefault(_DECISIONS, []).append(result)


def recorded(scope: Scope) -> list[CheckResult]:
    decisions: list[CheckResult] = scope.get(_DECISIONS, [])
    return decisions


def claim_headers(scope: Scope) -> bool:
    """True for the first middleware that reports on this response; nested ones then stay out.

    Without this, a middleware on a mounted child and another on its parent
    would both add the same headers.
    """
    if scope.get(_HEADERS_DONE):
        return False
    scope[_HEADERS_DONE] = True
    return True


_MIDDLEWARE = "moderato.middleware"
MIDDLEWARE = _MIDDLEWARE


def mark_middleware(scope: Scope) -> None:
    """A moderato middleware wraps this request and answers moderato's exceptions itself.

    It records the Starlette application it is installed on (``scope["app"]``).
    """
    scope[_MIDDLEWARE] = scope.get("app")


def has_middleware(scope: Scope) -> bool:
    """True if a moderato middleware will see an exception raised here.

    Not when the request has since entered another Starlette application (a
    mounted child overwrites ``scope["app"]``): that child's own error
    middleware would answer a 500 before the exception got out.
    """
    return _MIDDLEWARE in scope and scope[_MIDDLEWARE] is scope.get("app")
