"""Callbacks of the request (key, tenant, cost, rate) that fail closed.

A callback that raises, or returns what cannot be used, fails the request
with RateLimitCallbackError (a 503 naming it): it is never let through
unchecked. In a view running in a thread (sync views; WSGI) a callback is a
plain function; on the event loop (async views under ASGI) it may also be a
coroutine function, which is awaited.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from django.http import HttpRequest
from django.utils.module_loading import import_string

from ..errors import RateLimitCallbackError, RateLimitConfigError

RequestFunction = Callable[[HttpRequest], Any]


def imported(name: str, path: str) -> Callable[..., Any]:
    """The callable at dotted ``path`` given as option ``name``, or RateLimitConfigError."""
    try:
        function = import_string(path)
    except ImportError as error:
        raise RateLimitConfigError(f"{name} {path!r} cannot be imported: {error}") from None
    if not callable(function):
        raise RateLimitConfigError(
            f"{name} {path!r} names a {type(function).__name__}, not a callable"
        )
    return function  # type: ignore[no-any-return]


def call_sync(name: str, function: RequestFunction, request: HttpRequest) -> Any:
    """``function(request)`` in a thread; an awaitable result is this callback's failure."""
    try:
        value = function(request)
    except Exception as error:
        raise RateLimitCallbackError(name, error) from error
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()  # a coroutine never awaited would warn
        raise unusable(name, "returned an awaitable in a sync view; make it a plain function")
    return value


async def call_async(name: str, function: RequestFunction, request: HttpRequest) -> Any:
    """``function(request)`` on the event loop, awaited if it returns an awaitable."""
    try:
        value = function(request)
        if inspect.isawaitable(value):
            value = await value
    except Exception as error:
        raise RateLimitCallbackError(name, error) from error
    return value


def unusable(name: str, problem: str) -> RateLimitCallbackError:
    """The failure of a callback that returned something that cannot be used."""
    return RateLimitCallbackError(name, TypeError(f"the {name} callback {problem}"))
