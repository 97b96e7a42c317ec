"""Request callbacks (key, tenant, cost, rate, exempt): sync or async, failing closed."""

from __future__ import annotations

import inspect
from typing import TypeVar

from starlette.requests import Request

from ..errors import RateLimitCallbackError
from ..failure_log import CallbackFailureLog
from ..specs import RequestCallback

T = TypeVar("T")

RETURN_VALUE = "(its return value)"
"""What the log names when a callback's return value, not the callback, failed."""

failure_log = CallbackFailureLog()
"""Every callback failure of the process: each cause's traceback once, then summaries."""


async def call_callback(name: str, callback: RequestCallback[T], request: Request) -> T:
    """Run a user callback; any exception becomes RateLimitCallbackError naming it.

    Only ``Exception`` is wrapped: cancellation and exits must keep their meaning.
    The failure is logged (``failure_log``): the client sees only which
    callback failed, the operator gets the traceback.
    """
    try:
        result = callback(request)
        if inspect.isawaitable(result):
            return await result
        return result
    except Exception as error:
        raise callback_raised(name, callback, error) from error


def callback_raised(name: str, callback: object, error: Exception) -> RateLimitCallbackError:
    """A callback raised: logged (``failure_log``), and the error to raise in its place."""
    failure_log.failed(name, callback, error)
    return RateLimitCallbackError(name, error)


def callback_returned_unusable(name: str, message: str) -> RateLimitCallbackError:
    """A callback returned something unusable: its bug, reported (and logged) as its failure."""
    error = TypeError(message)
    failure_log.failed(name, RETURN_VALUE, error)
    return RateLimitCallbackError(name, error)
