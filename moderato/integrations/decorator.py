"""``@limiter.limit(...)``: a rate limit on one FastAPI or Starlette endpoint.

The endpoint needs no ``request`` parameter. The wrapper finds the Request
itself: Starlette passes it positionally; for FastAPI, the wrapper's
signature reuses the endpoint's own Request (or WebSocket) parameter if it
has one, or else adds a keyword-only Request one.

FastAPI leaves Request parameters out of OpenAPI, so the schema is the same
as without the decorator. On a websocket route the rule limits the
handshake: the check runs before the endpoint, so before it can ``accept``,
and a denied connection is refused (websocket_errors.py) without the
endpoint running.

The wrapper is always ``async``: the check must be awaited. A plain ``def``
endpoint then runs in the thread pool, as the framework would have run it.
Decorators stack, and stack with dependencies and RateLimitMiddleware: every
limit of a request is decided together, each on its own counter, and a
request one of them refuses is charged by none (stack.py).

A generator endpoint (FastAPI's JSON Lines and server-sent-event streams)
starts its response before its body runs, too late to answer 429. Its check
therefore becomes a FastAPI dependency, added to the signature, which FastAPI
resolves before the response starts.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection, Request

from ..errors import (
    BackendError,
    RateLimitCallbackError,
    RateLimitConfigError,
    RateLimitExceeded,
    exceeded,
)
from ..specs import F, RateSpec, RuleOptions
from . import stack
from .combinations import check_combination
from .decisions import DECISIONS
from .declared import declare
from .order import remember
from .request_limits import RULE_ATTRIBUTE, RULES_ATTRIBUTE, stacked
from .rule import LimitRule, check_options

_new_decided: Callable[[type[stack.Decided]], stack.Decided] = object.__new__
"""``object.__new__``: a Decided without its ``__init__`` (the wrapper sets its slots)."""

REQUEST_PARAMETER = "moderato_request"
"""The keyword-only Request parameter added to endpoints that declare none."""

LIMIT_PARAMETER = "moderato_limit"
"""Prefix of the dependency parameters added to generator endpoints."""

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..limiter import RateLimiter


def limit(limiter: RateLimiter, rate: RateSpec, **options: Unpack[RuleOptions]) -> Callable[[F], F]:
    """A decorator that limits an endpoint; see ``RateLimiter.limit``.

    Configuration errors (bad rate, algorithm, scope, or a static cost above
    the capacity of the rate's smallest policy) raise RateLimitConfigError
    here, at decoration time.
    """
    check_options("limit()", options)
    rule = LimitRule(limiter, rate, **options)
    rule.origin = "@limiter.limit"

    def decorate(func: F) -> F:
        if not callable(func):
            raise RateLimitConfigError(f"limit() decorates a callable, got {type(func).__name__}")
        inner: list[LimitRule] = list(getattr(func, RULES_ATTRIBUTE, ()))
        # Stacked decorators that no atomic step could decide fail here, at decoration.
        check_combination(stacked([*inner, rule]))
        endpoint_rule = copy.copy(rule)
        endpoint_rule.endpoint = func
        declare(endpoint_rule)
        wrapper = _wrap(func, endpoint_rule)
        remember(func, wrapper, rule.rate)  # routing ``func`` itself is then a mistake
        setattr(wrapper, RULES_ATTRIBUTE, (*inner, endpoint_rule))
        return cast(F, wrapper)

    return decorate


def _wrap(func: Callable[..., Any], rule: LimitRule) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        return _wrap_generator(func, rule)
    signature = inspect.signature(func)
    request_parameter = _request_parameter(func, signature)
    injected = request_parameter is None
    is_async = _is_async(func)
    deciders = (rule,)  # the request's Decided when the rule decides alone
    rule_id = id(rule)

    @functools.wraps(func)
    async def limited(*args: Any, **kwargs: Any) -> Any:
        if injected:
            request = kwargs.pop(REQUEST_PARAMETER, None)
        else:
            request = kwargs.get(cast(str, request_parameter))
        # The exact type first: isinstance() of an ABC subclass (HTTPConnection is a
        # Mapping) goes through ABCMeta.__instancecheck__ on every request.
        if type(request) is not Request and not isinstance(request, HTTPConnection):
            request = next((arg for arg in args if isinstance(arg, HTTPConnection)), None)
        if request is None:
            raise RateLimitConfigError(
                f"{func.__qualname__} was called without a Request or WebSocket; a "
                "rate-limited endpoint must be called by FastAPI or Starlette routing"
            )
        scope = request.scope
        # What the route's first request worked out (stack.alone_arguments); else, for a
        # shape it cannot tell, the general question.
        arguments = stack.alone_arguments(rule, scope)
        if arguments is not None or stack.decides_alone(rule, scope):
            # stack.enforce's one-limit path and rule.enforce's body written out: every
            # coroutine between the endpoint and the client's future is resumed again when
            # Redis answers, and every call costs about as much. The same steps, records
            # and conversions as theirs.
            try:
                if arguments is None:
                    arguments = rule._arguments_now(request, None)
                    if arguments is None:
                        arguments = await rule._arguments(request, None)
                key, rate, cost, tenant, bucket_scope = arguments  # rule._checked's call
                result = await rule.limiter.check_with_info(
                    key, rate, cost=cost, tenant_type=tenant, scope=bucket_scope,
                    algorithm=rule.algorithm, shadow=rule.shadow, burst=rule.burst,
                )  # fmt: skip
                scope.setdefault(DECISIONS, []).append(result)  # record(scope, result)
                if not result.allowed:
                    raise exceeded(result)
            except (RateLimitExceeded, BackendError, RateLimitCallbackError) as error:
                converted = LimitRule._converted(error, scope)
                if converted is None:
                    raise
                raise converted from error.__cause__
            # Decided(deciders, {rule_id: result}, ""), its three slots set here: a
            # class's __init__ is entered from C, a frame of its own on every request.
            decided = _new_decided(stack.Decided)
            decided.by = deciders
            decided.results = {rule_id: result}
            decided.unseen = ""
            scope[stack.DECIDED] = decided
        else:
            await stack.enforce(rule, request)
        if is_async:
            return await func(*args, **kwargs)
        return await run_in_threadpool(func, *args, **kwargs)

    if injected:
        signature = _with_request_parameter(signature)
    limited.__signature__ = signature  # type: ignore[attr-defined]
    return limited


def _wrap_generator(func: Callable[..., Any], rule: LimitRule) -> Callable[..., Any]:
    signature = inspect.signature(func)
    parameters = list(signature.parameters.values())
    taken = {p.name for p in parameters}
    name = next(
        f"{LIMIT_PARAMETER}_{n}"
        for n in range(len(taken) + 1)
        if f"{LIMIT_PARAMETER}_{n}" not in taken
    )

    async def check(request: Request) -> None:
        await stack.enforce(rule, request)

    setattr(check, RULE_ATTRIBUTE, rule)

    from fastapi import Depends  # generator endpoints exist only in FastAPI

    added = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=Depends(check))
    # Before the limits of inner decorators, so that the outer one is checked first.
    position = next(
        (i for i, p in enumerate(parameters) if p.name.startswith(LIMIT_PARAMETER)),
        len(parameters)
        - (1 if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD else 0),
    )
    parameters.insert(position, added)

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def limited_stream(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop(name, None)
            async for item in func(*args, **kwargs):
                yield item

        wrapper: Callable[..., Any] = limited_stream
    else:

        @functools.wraps(func)
        def limited_sync_stream(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop(name, None)
            yield from func(*args, **kwargs)

        wrapper = limited_sync_stream
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    return wrapper


def _request_parameter(func: Callable[..., Any], signature: inspect.Signature) -> Optional[str]:
    """The name of the endpoint's own Request or WebSocket parameter, if it declares one.

    FastAPI fills exactly one Request parameter per endpoint, so a second one
    would be left without a value: reuse the endpoint's (or an inner
    decorator's) instead of adding another. A websocket endpoint always
    declares its WebSocket (it has to accept it).
    """
    namespace = getattr(inspect.unwrap(func), "__globals__", {})
    for parameter in signature.parameters.values():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # resolves "Request" as FastAPI would
            except Exception:
                continue
        if isinstance(annotation, type) and issubclass(annotation, HTTPConnection):
            return parameter.name
    return None


def _with_request_parameter(signature: inspect.Signature) -> inspect.Signature:
    parameters = list(signature.parameters.values())
    added = inspect.Parameter(REQUEST_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
    # Keyword-only parameters go before **kwargs, if any.
    position = len(parameters)
    if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD:
        position -= 1
    parameters.insert(position, added)
    return signature.replace(parameters=parameters)


def _is_async(func: Callable[..., Any]) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - async callable objects
    )
