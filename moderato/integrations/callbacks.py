"""Request callbacks (key, tenant, cost, rate, exempt): sync or async, failing closed."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Callable, TypeVar, Union

from starlette.requests import Request

from ..errors import RateLimitCallbackError

T = TypeVar("T")

RequestCallback = Callable[[Request], Union[T, Awaitable[T]]]
"""A function of the request returning a value, or an awaitable of one."""


async def call_callback(name: str, callback: RequestCallback[T], request: Request) -> T:
    """Run a user callback; any exception becomes RateLimitCallbackError naming it.

    Only ``Exception`` is wrapped: cancellation and exits must keep their meaning.
    """
    try:
        result = callback(request)
        if inspect.isawaitable(result):
            return await result
        return result
    except Exception as error:
        raise RateLimitCallbackError(name, error) from error


def callback_failed(name: str, message: str) -> RateLimitCallbackError:
    """A callback returned something unusable: its bug, reported as its failure."""
    return RateLimitCallbackError(name, TypeError(message))
