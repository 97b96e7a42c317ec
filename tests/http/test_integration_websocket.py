"""WebSocket limiting: handshakes (decorator, dependency, middleware) and messages.

Over real uvicorn with a real websocket client (the ``websockets`` package),
plus raw ASGI runs for a server that does not offer the denial-response
extension, where a refusal is a close before accept with code 1008.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Optional

import httpx
import pytest
import websockets
from fastapi import Depends, FastAPI, WebSocket
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from uvicorn_helpers import running
from websockets.exceptions import InvalidStatus

from moderato import RateLimitConfigError, RateLimiter, install
from moderato.integrations import RateLimitMiddleware


@asynccontextmanager
async def connected(
    port: int, path: str, *, source: str = "127.0.0.1"
) -> AsyncIterator[websockets.ClientConnection]:
    """A websocket connection from the loopback address ``source`` (one client per address)."""
    async with websockets.connect(f"ws://127.0.0.1:{port}{path}", local_addr=(source, 0)) as ws:
        yield ws


async def outcome(port: int, path: str, *, source: str = "127.0.0.1") -> Any:
    """ "accepted" (and the greeting received), or the refusal's (status, headers, body)."""
    try:
        async with connected(port, path, source=source) as ws:
            greeting = await ws.recv()
            return ("accepted", greeting)
    except InvalidStatus as refused:
        response = refused.response
        return (response.status_code, dict(response.headers), bytes(response.body or b""))


def greet(app: FastAPI, path: str, greeting: str) -> None:
    """A websocket route that accepts, sends ``greeting`` and closes."""

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(greeting)
        await websocket.close()

    app.add_api_websocket_route(path, endpoint)


def greeting_app(limiter: RateLimiter) -> FastAPI:
    app = FastAPI()
    install(app, limiter)

    @app.websocket("/chat")
    @limiter.limit("2/minute")
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    @app.websocket("/feed", dependencies=[Depends(limiter.dependency("1/minute"))])
    async def feed(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("feed")
        await websocket.close()

    return app


async def test_decorator_admits_two_handshakes_per_client_per_minute(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="ws")
    async with running(greeting_app(limiter)) as port:
        first = [await outcome(port, "/chat") for _ in range(3)]
        other_client = [await outcome(port, "/chat", source="127.0.0.2") for _ in range(3)]
        usage = await limiter.get_usage("127.0.0.1", "2/minute", scope="WS:/chat")
    for results in (first, other_client):
        assert results[:2] == [("accepted", "hello")] * 2
        status, headers, body = results[2]
        assert status == 429
        assert json.loads(body) == {"detail": "Rate limit exceeded"}
        assert headers["x-ratelimit-limit"] == "2"
        assert headers["x-ratelimit-remaining"] == "0"
        assert 1 <= int(headers["retry-after"]) <= 60
    # The handshake bucket is WS:<template>, per client address.
    assert (usage["current"], usage["remaining"]) == (2, 0)


async def test_dependency_limits_the_handshake(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="ws-dep")
    async with running(greeting_app(limiter)) as port:
        results = [await outcome(port, "/feed") for _ in range(3)]
    assert results[0] == ("accepted", "feed")
    assert [result[0] for result in results[1:]] == [429, 429]
    assert results[1][1]["x-ratelimit-limit"] == "1"


async def test_middleware_limits_handshakes_with_http_requests_by_default() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter, rate="3/minute", exempt_paths=["/health"])

    @app.get("/page")
    async def page() -> dict[str, str]:
        return {}

    greet(app, "/chat", "hello")
    greet(app, "/health", "ok")

    async with running(app) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/page")).status_code == 200
        results = [await outcome(port, "/chat") for _ in range(3)]
        health = [await outcome(port, "/health") for _ in range(4)]
    # One app-wide bucket: one HTTP request and two handshakes use up 3/minute.
    assert results[:2] == [("accepted", "hello")] * 2
    status, headers, body = results[2]
    assert status == 429
    assert json.loads(body) == {
        "error": "Rate limit exceeded",
        "retry_after": int(headers["retry-after"]),
        "limit": 3,
    }
    assert headers["x-ratelimit-remaining"] == "0"
    assert health == [("accepted", "ok")] * 4


async def test_middleware_websockets_false_lets_handshakes_through() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter, rate="1/minute", websockets=False)
    greet(app, "/chat", "hello")

    async with running(app) as port:
        results = [await outcome(port, "/chat") for _ in range(3)]
    assert results == [("accepted", "hello")] * 3


async def test_message_limit_admits_exactly_n_messages_and_keeps_the_socket() -> None:
    limiter = RateLimiter("memory://")
    messages = limiter.message_limit("5/minute")
    app = FastAPI()
    install(app, limiter)

    @app.websocket("/chat")
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        async for text in websocket.iter_text():
            decision = await messages.check(websocket)
            if decision.allowed:
                await websocket.send_text(f"echo {text} ({decision.remaining} left)")
            else:
                await websocket.send_text(f"dropped {text}, retry in {decision.retry_after} s")

    async with running(app) as port:
        async with connected(port, "/chat") as ws:
            replies = []
            for n in range(8):
                await ws.send(str(n))
                replies.append(await ws.recv())
        # A second connection of the same client shares the message quota.
        async with connected(port, "/chat") as ws:
            await ws.send("again")
            again = await ws.recv()
        usage = await limiter.get_usage("127.0.0.1", "5/minute", scope="WS-MESSAGE:/chat")
    assert replies[:5] == [f"echo {n} ({4 - n} left)" for n in range(5)]
    assert all(
        reply.startswith(f"dropped {n}, retry in ") for n, reply in zip(range(5, 8), replies[5:])
    )
    assert again.startswith("dropped again")
    assert (usage["current"], usage["remaining"]) == (5, 0)


async def test_exempt_when_skips_the_handshake_limit() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter)

    def internal(connection: Any) -> bool:
        return bool(connection.client.host == "127.0.0.2")

    @app.websocket("/chat")
    @limiter.limit("1/minute", exempt_when=internal)
    async def chat(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    async with running(app) as port:
        internal_results = [await outcome(port, "/chat", source="127.0.0.2") for _ in range(3)]
        outside = [await outcome(port, "/chat") for _ in range(2)]
    assert internal_results == [("accepted", "hello")] * 3
    assert outside[0] == ("accepted", "hello") and outside[1][0] == 429


# -- a server without the denial-response extension ------------------------------------


async def handshake(
    app: Any, path: str, *, extensions: Optional[dict[str, Any]] = None
) -> list[Any]:
    """Drive one websocket handshake through ``app`` over raw ASGI; the messages it sent."""
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("192.0.2.7", 50000),
        "server": ("testserver", 80),
        "subprotocols": [],
        "extensions": extensions or {},
    }
    incoming = [{"type": "websocket.connect"}]
    sent: list[Any] = []

    async def receive() -> Any:
        return incoming.pop(0) if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Any) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def bare_app(limiter: RateLimiter, *, middleware: bool) -> Starlette:
    async def hello(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    limited = limiter.limit("1/minute")(hello)
    app = Starlette(routes=[WebSocketRoute("/limited", limited), WebSocketRoute("/open", hello)])
    if middleware:
        app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="2/minute")
    return app


@pytest.mark.parametrize("extensions", [None, {"websocket.http.response": {}}])
async def test_decorator_refusal_without_and_with_the_extension(
    extensions: Optional[dict[str, Any]],
) -> None:
    app = bare_app(RateLimiter("memory://"), middleware=False)
    admitted = await handshake(app, "/limited", extensions=extensions)
    refused = await handshake(app, "/limited", extensions=extensions)
    assert admitted[0]["type"] == "websocket.accept"
    if extensions is None:
        assert refused == [
            {"type": "websocket.close", "code": 1008, "reason": "Rate limit exceeded"}
        ]
    else:
        assert refused[0]["type"] == "websocket.http.response.start"
        assert refused[0]["status"] == 429
        headers = dict(refused[0]["headers"])
        assert headers[b"x-ratelimit-limit"] == b"1"
        assert refused[1]["body"] == b"Rate limit exceeded"


async def test_middleware_refusal_without_the_extension_is_close_1008() -> None:
    app = bare_app(RateLimiter("memory://"), middleware=True)
    results = [await handshake(app, "/open") for _ in range(3)]
    assert [sent[0]["type"] for sent in results[:2]] == ["websocket.accept"] * 2
    assert results[2] == [
        {"type": "websocket.close", "code": 1008, "reason": "Rate limit exceeded"}
    ]


async def test_backend_failure_refuses_with_1011_or_503() -> None:
    # Nothing listens on port 1: the fail-closed limiter cannot decide.
    limiter = RateLimiter("redis://127.0.0.1:1", connect_timeout_s=0.2, breaker_failures=100)
    app = bare_app(limiter, middleware=False)
    closed = await handshake(app, "/limited")
    denied = await handshake(app, "/limited", extensions={"websocket.http.response": {}})
    assert closed == [
        {"type": "websocket.close", "code": 1011, "reason": "Rate limit backend unavailable"}
    ]
    assert denied[0]["status"] == 503


async def test_a_limit_above_the_websocket_route_decorator_stops_startup() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter)

    @limiter.limit("1/minute")  # above the route decorator: the route would not be limited
    @app.websocket("/misplaced")
    async def misplaced(websocket: WebSocket) -> None:
        await websocket.accept()

    with pytest.raises(RateLimitConfigError, match="misplaced"):
        async with app.router.lifespan_context(app):
            pass
