"""A route whose one limit is one ``@limiter.limit``: the wrapper decides it itself.

The commonest shape (one decorator, no ``exempt_when``, no other limit on the
route) skips ``stack.enforce`` and ``LimitRule.enforce``: the wrapper runs their
steps, one coroutine fewer between the endpoint and Redis's reply. Every test here
sends the same requests to that route and to a twin taking the general path (an
``exempt_when`` that never exempts sends it through ``stack.enforce``) and finds
the same answers and the same decision in the request's scope: admitted, denied,
Redis down failing closed and failing open, with and without the headers middleware.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import pytest
from fastapi import FastAPI, Request
from http_helpers import client
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer
from starlette.types import Receive, Scope, Send

from moderato import RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, stack

TIMED_HEADERS = ("x-ratelimit-reset", "retry-after")
"""Seconds that may tick between the twin routes' requests."""


def never_exempt(request: Request) -> bool:
    return False


class Scopes:
    """An ASGI wrapper keeping each request's scope, as the app left it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append(scope)
        await self.app(scope, receive, send)


@pytest.fixture
def enforced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths whose requests went through ``stack.enforce``."""
    paths: list[str] = []
    general = stack.enforce

    async def counted(rule: Any, request: Any, *, convert: bool = True) -> Any:
        paths.append(request.scope["path"])
        return await general(rule, request, convert=convert)

    monkeypatch.setattr(stack, "enforce", counted)
    yield paths


def twin_app(limiter: RateLimiter, rate: str, *, middleware: bool) -> tuple[Scopes, FastAPI]:
    app = FastAPI()
    if middleware:
        app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/one")
    @limiter.limit(rate, scope="twins")
    async def one() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/general")
    @limiter.limit(rate, scope="twins-general", exempt_when=never_exempt)
    async def general(request: Request) -> dict[str, bool]:
        return {"ok": True}

    return Scopes(app), app


def decision_of(scope: Scope) -> tuple[Any, ...]:
    """What the request's scope holds of its decision, comparable between the twins."""
    decided: Optional[stack.Decided] = scope.get("moderato.decided")
    decisions = scope.get("moderato.decisions")
    shown_decided = None
    if decided is not None:
        # A Decided as its constructor makes it: results by the deciding rules' ids.
        assert type(decided) is stack.Decided
        assert list(decided.results) == [id(rule) for rule in decided.by]
        shown_decided = (
            [rule.origin for rule in decided.by],
            [_shown(result) for result in decided.results.values()],
            decided.unseen,
        )
    shown_decisions = None if decisions is None else [_shown(d) for d in decisions]
    return shown_decided, shown_decisions


def _shown(result: Any) -> Any:
    if result is None:
        return None
    return (result.allowed, result.limit, result.remaining, result.bypassed)


def _untimed(body: Any) -> Any:
    if isinstance(body, dict) and "retry_after" in body:
        return {**body, "retry_after": "timed"}
    return body


async def answers(
    app: Scopes, path: str, count: int
) -> list[tuple[int, dict[str, str], Any, tuple[Any, ...]]]:
    found = []
    async with client(app) as http:
        for _ in range(count):
            response = await http.get(path)
            headers = {
                name: value for name, value in response.headers.items() if name not in TIMED_HEADERS
            }
            headers.pop("content-length", None)
            timed = sorted(name for name in TIMED_HEADERS if name in response.headers)
            found.append(
                (
                    response.status_code,
                    {**headers, "timed": ",".join(timed)},
                    _untimed(response.json()),
                    decision_of(app.seen[-1]),
                )
            )
    return found


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "no-middleware"])
async def test_admitted_then_denied_as_the_general_path(
    redis_url: str, middleware: bool, enforced: list[str]
) -> None:
    limiter = RateLimiter(redis_url, key_prefix="one-limit", metrics_registry=CollectorRegistry())
    app, _ = twin_app(limiter, "2/hour", middleware=middleware)
    one = await answers(app, "/one", 4)
    general = await answers(app, "/general", 4)
    await limiter.close()
    assert [status for status, *_ in one] == [200, 200, 429, 429]
    assert one == general
    # The decision the scope keeps: the rule's result, recorded once, also on a denial.
    assert one[0][3][0] == (["@limiter.limit"], [(True, 2, 1, False)], "")
    assert one[0][3][1] == [(True, 2, 1, False)]
    assert one[2][3] == (None, [(False, 2, 0, False)])
    if middleware:  # it reports the quota on every limited response
        assert one[0][1]["x-ratelimit-remaining"] == "1"
        assert one[2][1]["timed"] == "retry-after,x-ratelimit-reset"
    else:  # a denial still tells its quota (the HTTPException's headers)
        assert "x-ratelimit-remaining" not in one[0][1]
        assert one[2][1]["x-ratelimit-remaining"] == "0"
    assert enforced == ["/general"] * 4  # the plain route never went through it


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "no-middleware"])
@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
async def test_redis_down_as_the_general_path(
    own_redis_server: RedisServer, middleware: bool, fail_open: bool, enforced: list[str]
) -> None:
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="one-limit",
        fail_open=fail_open,
        metrics_registry=CollectorRegistry(),
        connect_timeout_s=0.2,
        command_timeout_s=0.2,
    )
    app, _ = twin_app(limiter, "5/minute", middleware=middleware)
    own_redis_server.stop()
    one = await answers(app, "/one", 2)
    general = await answers(app, "/general", 2)
    await limiter.close()
    assert one == general
    if fail_open:
        # A bypass: admitted, recorded, and reported without quota headers.
        assert [status for status, *_ in one] == [200, 200]
        assert "x-ratelimit-limit" not in one[0][1]
        bypass = (True, 5, None, True)
        assert one[0][3] == ((["@limiter.limit"], [bypass], ""), [bypass])
    else:
        assert [status for status, *_ in one] == [503, 503]
        assert one[0][3] == (None, None)  # nothing decided, nothing recorded
    assert enforced == ["/general"] * 2


async def test_other_shapes_keep_the_general_path(redis_url: str, enforced: list[str]) -> None:
    # Two decorators, or a decorator with an exempt_when: decided by stack.enforce.
    limiter = RateLimiter(redis_url, key_prefix="one-limit", metrics_registry=CollectorRegistry())
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/stacked")
    @limiter.limit("5/minute")
    @limiter.limit("50/hour")
    async def stacked() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/exempting")
    @limiter.limit("5/minute", exempt_when=never_exempt)
    async def exempting() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        assert (await http.get("/stacked")).status_code == 200
        assert (await http.get("/exempting")).status_code == 200
    await limiter.close()
    assert enforced == ["/stacked", "/stacked", "/exempting"]  # each decorator asks


async def test_memory_backend_as_the_general_path(enforced: list[str]) -> None:
    # memory:// decides at once: the wrapper takes check_with_info (its one C call).
    limiter = RateLimiter("memory://", key_prefix="one-limit")
    app, _ = twin_app(limiter, "2/hour", middleware=True)
    one = await answers(app, "/one", 3)
    general = await answers(app, "/general", 3)
    await limiter.close()
    assert [status for status, *_ in one] == [200, 200, 429]
    assert one == general
    assert enforced == ["/general"] * 3
