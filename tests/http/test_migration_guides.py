"""Every moderato snippet of the migration guides runs, and the apps they build behave as told.

A snippet is a fenced block opened with ```` ```python moderato id=<name> ````
(doc_snippets.py). Each runs on its own, with ``"redis://localhost:6379"``
replaced by ``"memory://"``, and the memory backend's clock frozen so that
windows cannot roll over mid-test. An
exerciser per snippet then drives what it built (over httpx in process, or
real uvicorn and a websocket client) and asserts exact counts. A snippet
without an exerciser, or an exerciser without a snippet, fails the suite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from typing import Any, Callable

import pytest
import websockets
from doc_snippets import snippets
from http_helpers import client
from uvicorn_helpers import running
from websockets.exceptions import InvalidStatus

from moderato import RateLimiter, RateLimitExceeded
from moderato.backends.memory import MemoryBackend
from moderato.sync import RateLimiter as BlockingRateLimiter

GUIDES = (
    "migrating-from-slowapi.md",
    "migrating-from-fastapi-limiter.md",
    "migrating-from-throttled-py.md",
)
FROZEN_MS = 1_800_000_000_000  # the frozen clock: no window rolls over mid-test

Namespace = dict[str, Any]
Exerciser = Callable[[Namespace], Awaitable[None]]


def run(code: str) -> Namespace:
    namespace: Namespace = {"__name__": "guide_snippet"}
    exec(
        compile(code.replace('"redis://localhost:6379"', '"memory://"'), "<guide>", "exec"),
        namespace,
    )
    for value in namespace.values():
        limiters = (RateLimiter, BlockingRateLimiter)
        if isinstance(value, limiters) and isinstance(value.backend, MemoryBackend):
            value.backend.clock = lambda: FROZEN_MS
    return namespace


async def statuses(app: Any, path: str, count: int, headers: Any = None) -> list[int]:
    async with client(app, headers=headers) as http:
        return [(await http.get(path)).status_code for _ in range(count)]


# -- slowapi ----------------------------------------------------------------------------


async def slowapi_setup(ns: Namespace) -> None:
    async with client(ns["app"]) as http:
        responses = [await http.get("/home") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert responses[0].json() == {"page": "home"}
    assert responses[0].headers["x-ratelimit-remaining"] == "4"
    denied = responses[5]
    assert denied.json() == {
        "error": "Rate limit exceeded",
        "retry_after": int(denied.headers["retry-after"]),
        "limit": 5,
    }


async def slowapi_key_func(ns: Namespace) -> None:
    app = ns["app"]
    assert await statuses(app, "/reports", 3, {"x-api-key": "k-123"}) == [200, 200, 429]
    assert await statuses(app, "/reports", 3, {"x-api-key": "k-456"}) == [200, 200, 429]
    # An unknown key is the address, whichever key is sent.
    assert await statuses(app, "/reports", 2, {"x-api-key": "forged-1"}) == [200, 200]
    assert await statuses(app, "/reports", 1, {"x-api-key": "forged-2"}) == [429]
    assert await statuses(app, "/login", 4, {"x-api-key": "k-123"}) == [200] * 3 + [429]


async def slowapi_default_limits(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/a", 3) == [200, 200, 429]
    assert await statuses(ns["app"], "/b", 3) == [200, 200, 429]


async def slowapi_default_and_route_limits(ns: Namespace) -> None:
    app, limiter = ns["app"], ns["limiter"]
    logins = await statuses(app, "/login", 6)
    assert logins == [200] * 3 + [429] * 3
    for rate in ("10/minute", "3/minute"):
        usage = await limiter.get_usage("127.0.0.1", rate, scope=f"GET:/login#{rate}")
        assert usage["current"] == 3, rate
    assert await statuses(app, "/search", 11) == [200] * 10 + [429]


async def slowapi_application_and_route_limits(ns: Namespace) -> None:
    app, limiter = ns["app"], ns["limiter"]
    assert await statuses(app, "/export", 5) == [200, 200, 429, 429, 429]
    assert await statuses(app, "/a", 4) == [200, 200, 200, 429]
    assert (await limiter.get_usage("127.0.0.1", "5/minute", scope="app"))["current"] == 5


async def slowapi_application_limits(ns: Namespace) -> None:
    app = ns["app"]
    assert await statuses(app, "/a", 2) + await statuses(app, "/b", 2) == [200, 200, 200, 429]
    assert await statuses(app, "/health", 5) == [200] * 5


async def slowapi_exempt(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/api/items", 3) == [200, 200, 429]
    assert await statuses(ns["app"], "/status", 5) == [200] * 5


async def slowapi_exempt_when(ns: Namespace) -> None:
    app = ns["app"]
    assert await statuses(app, "/export", 5, {"x-internal-token": "s3cret"}) == [200] * 5
    assert await statuses(app, "/export", 3) == [200, 200, 429]


async def slowapi_shared_limit(ns: Namespace) -> None:
    app = ns["app"]
    books = await statuses(app, "/search/books", 2)
    assert books + await statuses(app, "/search/films", 3) == [200] * 4 + [429]


async def slowapi_headers(ns: Namespace) -> None:
    async with client(ns["app"]) as http:
        response = await http.get("/quota")
    assert response.headers["x-ratelimit-limit"] == "10"
    assert response.headers["x-ratelimit-remaining"] == "9"
    assert response.headers["ratelimit-policy"] == '"10-per-60s";q=10;w=60'
    assert re.fullmatch(r'"10-per-60s";r=9;t=\d+', response.headers["ratelimit"])


async def slowapi_exception_handler(ns: Namespace) -> None:
    async with client(ns["app"]) as http:
        responses = [await http.get("/ping") for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 429]
    assert responses[1].json() == {"message": "Only 1 per minute, please."}
    assert 1 <= int(responses[1].headers["retry-after"]) <= 60


async def slowapi_storage(ns: Namespace) -> None:
    limiters = [ns[name] for name in ("tests", "single", "tls", "sentinel", "cluster")]
    assert all(isinstance(limiter, RateLimiter) for limiter in limiters)
    assert isinstance(ns["tests"].backend, MemoryBackend)
    assert not any(isinstance(limiter.backend, MemoryBackend) for limiter in limiters[1:])


async def slowapi_rates(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/plan", 3) == [200, 200, 429]
    usage = await ns["limiter"].get_usage("127.0.0.1", "2/minute,1000/month", scope="GET:/plan")
    assert [policy["current"] for policy in usage["policies"]] == [2, 2]


# -- fastapi-limiter ----------------------------------------------------------------------


async def limiter_init(ns: Namespace) -> None:
    assert ns["limiter"].key_prefix == "myapp"
    assert await statuses(ns["app"], "/", 3) == [200, 200, 429]


async def limiter_decorator(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/items", 3) == [200, 200, 429]


async def limiter_multiple_dependencies(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/multiple", 3) == [200, 429, 429]
    for rate in ("1/5 seconds", "2/15 seconds"):
        usage = await ns["limiter"].get_usage("127.0.0.1", rate, scope="GET:/multiple")
        assert usage["current"] == 1, rate  # the refused requests charged neither


async def limiter_multiple(ns: Namespace) -> None:
    assert await statuses(ns["app"], "/multiple", 3) == [200, 429, 429]
    usage = await ns["limiter"].get_usage(
        "127.0.0.1", "1/5 seconds;2/15 seconds", scope="GET:/multiple"
    )
    # Atomic: the refused requests were charged to neither policy.
    assert [policy["current"] for policy in usage["policies"]] == [1, 1]


async def limiter_identifier(ns: Namespace) -> None:
    app = ns["app"]
    assert await statuses(app, "/me", 3, {"authorization": "token-a"}) == [200, 200, 429]
    assert await statuses(app, "/me", 3, {"authorization": "token-b"}) == [200, 200, 429]
    assert await statuses(app, "/me", 3) == [200, 200, 429]  # the address, for no session
    shared = await statuses(app, "/shared", 2, {"authorization": "token-a"})
    assert shared + await statuses(app, "/shared", 2) == [200, 200, 200, 429]


async def limiter_callback(ns: Namespace) -> None:
    async with client(ns["app"]) as http:
        responses = [await http.get("/") for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 429]
    assert responses[1].json() == {"detail": "Slow down"}
    assert 1 <= int(responses[1].headers["retry-after"]) <= 60


async def limiter_websocket(ns: Namespace) -> None:
    async with running(ns["app"]) as port:
        url = f"ws://127.0.0.1:{port}/ws"
        async with websockets.connect(url) as ws:
            replies = []
            for n in range(5):
                await ws.send(f"message {n}")
                replies.append(await ws.recv())
        async with websockets.connect(url) as ws:
            await ws.send("once more")
            second = await ws.recv()
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(url):
                pass
    assert replies[:3] == ["Hello, world"] * 3
    assert all(re.fullmatch(r"Hello again in \d+ s", reply) for reply in replies[3:])
    assert re.fullmatch(r"Hello again in \d+ s", second)
    assert refused.value.response.status_code == 429
    assert json.loads(bytes(refused.value.response.body or b"")) == {
        "detail": "Rate limit exceeded"
    }


async def limiter_burst(ns: Namespace) -> None:
    app = ns["app"]
    async with client(app) as http:
        responses = [await http.get("/search") for _ in range(12)]
    assert [r.status_code for r in responses] == [200] * 10 + [429] * 2
    assert responses[0].headers["x-ratelimit-limit"] == "10"
    assert responses[0].headers["x-ratelimit-remaining"] == "9"
    # The clock moves on 600 ms: one more, refilled at 100 per minute.
    limiter = ns["limiter"]
    limiter.backend.clock = lambda: FROZEN_MS + 600
    assert await statuses(app, "/search", 2) == [200, 429]
    usage = await limiter.get_usage(
        "127.0.0.1", "100/minute", algorithm="token_bucket", burst=10, scope="GET:/search"
    )
    assert (usage["limit"], usage["remaining"]) == (10, 0)


# -- throttled-py ------------------------------------------------------------------------


async def throttled_quota(ns: Namespace) -> None:
    handle = ns["handle"]
    replies = [handle("1") for _ in range(60)]
    assert replies == ["ok"] * 50 + ["limited, retry in 1 s"] * 10
    result = ns["limiter"].check_with_info("user:1", "10/second", burst=50)
    assert (result.limit, result.refill, result.remaining) == (50, 10, 0)
    assert handle("2") == "ok"  # another user, another bucket


async def throttled_decorator(ns: Namespace) -> None:
    report = ns["report"]
    outcomes = []
    for _ in range(6):
        try:
            outcomes.append(report())
        except RateLimitExceeded as refused:
            outcomes.append(f"refused, retry in {refused.retry_after} s")
    # 4 at once, then one every 30 s (2 per minute).
    assert outcomes == ["done"] * 4 + ["refused, retry in 30 s"] * 2


async def throttled_asyncio(ns: Namespace) -> None:
    handle = ns["handle"]
    admitted = [await handle("1") for _ in range(25)]
    assert admitted == [True] * 20 + [False] * 5


EXERCISERS: dict[str, dict[str, Exerciser]] = {
    "migrating-from-slowapi.md": {
        "setup": slowapi_setup,
        "key-func": slowapi_key_func,
        "default-limits": slowapi_default_limits,
        "default-and-route-limits": slowapi_default_and_route_limits,
        "application-limits": slowapi_application_limits,
        "application-and-route-limits": slowapi_application_and_route_limits,
        "exempt": slowapi_exempt,
        "exempt-when": slowapi_exempt_when,
        "shared-limit": slowapi_shared_limit,
        "headers": slowapi_headers,
        "exception-handler": slowapi_exception_handler,
        "storage": slowapi_storage,
        "rates": slowapi_rates,
    },
    "migrating-from-fastapi-limiter.md": {
        "init": limiter_init,
        "decorator": limiter_decorator,
        "multiple-dependencies": limiter_multiple_dependencies,
        "multiple": limiter_multiple,
        "burst": limiter_burst,
        "identifier": limiter_identifier,
        "callback": limiter_callback,
        "websocket": limiter_websocket,
    },
    "migrating-from-throttled-py.md": {
        "quota": throttled_quota,
        "decorator": throttled_decorator,
        "asyncio": throttled_asyncio,
    },
}

CASES = [(guide, name) for guide in GUIDES for name in EXERCISERS[guide]]


@pytest.mark.parametrize("guide", GUIDES)
def test_every_snippet_has_an_exerciser(guide: str) -> None:
    assert sorted(snippets(guide)) == sorted(EXERCISERS[guide])


@pytest.mark.parametrize(("guide", "name"), CASES, ids=[f"{g[15:-3]}:{n}" for g, n in CASES])
async def test_snippet(guide: str, name: str) -> None:
    code = snippets(guide)[name]
    await EXERCISERS[guide][name](run(code))
