"""What a one-limit route's first request works out for the next ones (RouteFacts).

The decorator's wrapper asks ``stack.alone_arguments``, which reads the route's
facts (its one limit, its default scope, whose dependency overrides to watch)
from the routing index of the request's router, by endpoint, method and root
path, and learns them at the route's first request. Every test here runs three
times: ``fast`` as shipped (``alone_arguments`` in C, csrc/fast_route.c),
``python`` with its Python reference (tests/route_arguments_reference.py) answering,
the C function asked the same and found to answer the same, and ``general`` with
``alone_arguments`` answering None, so that every request takes the path that works
the route out each time (``stack.decides_alone``, ``rule._arguments_now``); all must
count the same requests in the same buckets and answer the same statuses. The facts are kept in
the index, so routes that change (a rebuilt index) drop them; two apps sharing one
limiter and endpoint, mounted applications, root paths, HEAD, dependency overrides
set after the first request, and identities other than the peer's address are
each checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional, Union

import pytest
from fastapi import Depends, FastAPI, Request
from http_helpers import client
from redis_servers import PATIENT_TIMEOUT_S
from route_arguments_reference import alone_arguments
from starlette.applications import Starlette
from starlette.routing import Mount

from moderato import RateLimiter, _accel
from moderato.integrations import RateLimitHeadersMiddleware, stack
from moderato.integrations.identity import ClientIdentity
from moderato.integrations.request_limits import RouteFacts
from moderato.integrations.scope import INDEXES

PEER = "127.0.0.1"


@pytest.fixture(params=["fast", "python", "general"])
def fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """True as shipped, and with the Python reference answering (the C function asked
    too, and held to it); False with every request working its route out again."""
    if request.param == "general":

        def never(rule: Any, scope: Any) -> None:
            return None

        monkeypatch.setattr(stack, "alone_arguments", never)
    elif request.param == "python":
        in_c = stack.alone_arguments

        def both(rule: Any, scope: Any) -> Any:
            answer = alone_arguments(rule, scope)  # first: it learns a route met first
            assert in_c(rule, scope) == answer
            return answer

        monkeypatch.setattr(stack, "alone_arguments", both)
    yield request.param != "general"


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths whose requests asked ``stack.decides_alone`` (the facts did not answer)."""
    paths: list[str] = []
    general = stack.decides_alone

    def counted(rule: Any, scope: Any) -> bool:
        paths.append(scope["path"])
        return general(rule, scope)

    monkeypatch.setattr(stack, "decides_alone", counted)
    yield paths


def memory_limiter(**options: Any) -> RateLimiter:
    return RateLimiter("memory://", key_prefix="facts", **options)


async def used(limiter: RateLimiter, rate: str, scope: str, key: str = PEER) -> int:
    current: int = (await limiter.get_usage(key, rate, scope=scope))["current"]
    return current


def facts_of(router: Any) -> dict[tuple[object, object, object], Optional[RouteFacts]]:
    entry = INDEXES.get(id(router))
    assert entry is not None
    routes: dict[tuple[object, object, object], Optional[RouteFacts]] = entry[1].routes
    return routes


async def test_default_scope_learned_once_per_method(fast: bool, asked: list[str]) -> None:
    limiter = memory_limiter()
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.api_route("/items/{item_id}", methods=["GET", "HEAD"])
    @limiter.limit("3/hour")
    async def item(item_id: int) -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        first = await http.get("/items/1")
        second = await http.head("/items/2")  # HEAD counts as GET
        third = await http.get("/items/3")
        fourth = await http.get("/items/4")
    assert [r.status_code for r in (first, second, third, fourth)] == [200, 200, 200, 429]
    assert [first.headers["x-ratelimit-remaining"], third.headers["x-ratelimit-remaining"]] == [
        "2",
        "0",
    ]
    assert 0 < int(fourth.headers["retry-after"]) <= 3600  # the fixed hour's end
    assert await used(limiter, "3/hour", "GET:/items/{item_id}") == 3
    if fast:
        assert asked == []  # every request answered by the facts
        facts = facts_of(app.router)
        (rule,) = item.__moderato_rules__  # type: ignore[attr-defined]
        assert facts[item, "GET", ""] == facts[item, "HEAD", ""]
        assert facts[item, "GET", ""] == RouteFacts(rule, app, "GET:/items/{item_id}")
    else:
        assert asked == ["/items/1", "/items/2", "/items/3", "/items/4"]


async def test_root_paths_and_a_mounted_app_count_apart(fast: bool) -> None:
    limiter = memory_limiter()
    inner = FastAPI()

    @inner.get("/items")
    @limiter.limit("10/hour")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)
    app.mount("/v1", inner)
    async with client(app) as http:
        for _ in range(2):
            assert (await http.get("/v1/items")).status_code == 200
    async with client(app, root_path="/gateway") as http:
        for _ in range(3):
            response = await http.get("/gateway/v1/items")
            assert response.status_code == 200
    assert response.headers["x-ratelimit-remaining"] == "7"
    assert await used(limiter, "10/hour", "GET:/v1/items") == 2
    assert await used(limiter, "10/hour", "GET:/gateway/v1/items") == 3
    if fast:  # one entry per root path, in the outer router's index
        assert {key[2] for key in facts_of(app.router)} == {"", "/gateway"}


async def test_an_app_mounted_twice_takes_the_template_of_its_path(
    fast: bool, asked: list[str]
) -> None:
    # Two templates reach the endpoint: the path chooses, so nothing is kept but that.
    limiter = memory_limiter()
    inner = FastAPI()

    @inner.get("/items")
    @limiter.limit("10/hour")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    app = Starlette(routes=[Mount("/a", app=inner), Mount("/b", app=inner)])
    async with client(app) as http:
        for path in ("/a/items", "/b/items", "/b/items"):
            assert (await http.get(path)).status_code == 200
    assert await used(limiter, "10/hour", "GET:/a/items") == 1
    assert await used(limiter, "10/hour", "GET:/b/items") == 2
    assert asked == ["/a/items", "/b/items", "/b/items"]
    if fast:
        assert facts_of(app.router) == {(items, "GET", ""): None}


async def test_two_apps_share_one_limiter_and_endpoint(fast: bool) -> None:
    limiter = memory_limiter()

    @limiter.limit("10/hour")
    async def shared() -> dict[str, bool]:
        return {"ok": True}

    first, second = FastAPI(), FastAPI()
    first.get("/one")(shared)
    second.get("/two")(shared)
    for app, path, count in ((first, "/one", 3), (second, "/two", 2), (first, "/one", 1)):
        async with client(app) as http:
            for _ in range(count):
                assert (await http.get(path)).status_code == 200
    assert await used(limiter, "10/hour", "GET:/one") == 4
    assert await used(limiter, "10/hour", "GET:/two") == 2
    if fast:
        assert [facts.scope_name for facts in facts_of(first.router).values() if facts] == [
            "GET:/one"
        ]
        assert [facts.scope_name for facts in facts_of(second.router).values() if facts] == [
            "GET:/two"
        ]


async def test_routes_added_after_the_first_request(fast: bool, asked: list[str]) -> None:
    limiter = memory_limiter()
    app = FastAPI()

    @app.get("/a")
    @limiter.limit("10/hour")
    async def a() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        assert (await http.get("/a")).status_code == 200
        before = INDEXES[id(app.router)][1]
        # The same endpoint at a second path, and a new endpoint: its first request
        # finds it missing from the index, which is built again, without the old facts.
        app.get("/again")(a)

        @app.get("/b")
        @limiter.limit("10/hour")
        async def b() -> dict[str, bool]:
            return {"ok": True}

        assert (await http.get("/b")).status_code == 200
        assert INDEXES[id(app.router)][1] is not before
        for path in ("/a", "/again", "/again"):
            assert (await http.get(path)).status_code == 200
    assert await used(limiter, "10/hour", "GET:/a") == 2
    assert await used(limiter, "10/hour", "GET:/again") == 2
    assert await used(limiter, "10/hour", "GET:/b") == 1
    if fast:
        # Two templates reach a() now: the path chooses each time.
        assert asked == ["/a", "/again", "/again"]
        assert facts_of(app.router)[a, "GET", ""] is None
        assert facts_of(app.router)[b, "GET", ""] is not None


def plain_dependency() -> None:
    return None


async def test_dependency_overrides_set_after_the_first_request(fast: bool) -> None:
    limiter = memory_limiter()
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/r", dependencies=[Depends(plain_dependency)])
    @limiter.limit("10/hour")
    async def route() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        assert [(await http.get("/r")).status_code for _ in range(2)] == [200, 200]
        # Now the route has a second limit: decided with the decorator's, as one.
        app.dependency_overrides[plain_dependency] = limiter.dependency("1/hour", scope="o")
        assert [(await http.get("/r")).status_code for _ in range(2)] == [200, 429]
        app.dependency_overrides.clear()
        assert (await http.get("/r")).status_code == 200
    assert await used(limiter, "10/hour", "GET:/r") == 4  # the refused request charged neither
    assert await used(limiter, "1/hour", "o") == 1


def who_app(limiter: RateLimiter) -> FastAPI:
    """An app whose one route, GET /who, has one limit: 10/hour."""
    app = FastAPI()

    @app.get("/who")
    @limiter.limit("10/hour")
    async def who() -> dict[str, bool]:
        return {"ok": True}

    return app


async def api_key(request: Request) -> str:
    return request.headers.get("x-user", "anonymous")


@pytest.mark.parametrize(
    ("options", "identity"),
    [
        ({}, PEER),
        ({"key": "everyone"}, "everyone"),
        ({"key": b"bytes-key"}, b"bytes-key"),
        ({"key": api_key}, "ann"),
        ({"key": ClientIdentity(api_key_header="x-user")}, "apikey:ann"),
        ({"key": ClientIdentity(trusted_proxies=["127.0.0.0/8"])}, "203.0.113.9"),
        ({"tenant": "gold"}, PEER),
        ({"cost": 2}, PEER),
    ],
    ids=["peer", "text", "bytes", "callback", "api-key", "proxy", "tenant", "cost"],
)
async def test_identities_tenants_and_costs(
    fast: bool, options: dict[str, Any], identity: Union[str, bytes]
) -> None:
    limiter = memory_limiter(**options)  # the limiter's defaults, as the rules read them
    app = who_app(limiter)

    headers = {"x-user": "ann", "x-forwarded-for": "203.0.113.9"}
    async with client(app, headers=headers) as http:
        assert [(await http.get("/who")).status_code for _ in range(3)] == [200, 200, 200]
    usage = await limiter.get_usage(
        identity, "10/hour", scope="GET:/who", tenant_type=options.get("tenant")
    )
    assert usage["current"] == 3 * options.get("cost", 1)


async def test_unknown_peer(fast: bool) -> None:
    limiter = memory_limiter()
    app = who_app(limiter)

    async def no_client(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "client": None}, receive, send)

    async with client(no_client) as http:
        assert (await http.get("/who")).status_code == 200
    assert await used(limiter, "10/hour", "GET:/who", key="unknown") == 1


async def test_a_decided_request_and_explicit_scope_over_redis(
    redis_url: str, fast: bool, asked: list[str]
) -> None:
    # Over Redis with the denial cache on (as the benchmark apps run): the admitted
    # replies skip its bookkeeping, the denials are remembered as before.
    limiter = RateLimiter(
        redis_url,
        key_prefix="facts",
        denial_cache_size=100,
        command_timeout_s=PATIENT_TIMEOUT_S,
    )
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/named")
    @limiter.limit("2/hour", scope="named-" + ("fast" if fast else "general"))
    async def named() -> dict[str, bool]:
        return {"ok": True}

    try:
        async with client(app) as http:
            responses = [await http.get("/named") for _ in range(5)]
        assert [r.status_code for r in responses] == [200, 200, 429, 429, 429]
        assert [r.headers["x-ratelimit-remaining"] for r in responses] == ["1", "0", "0", "0", "0"]
        scope_name = "named-" + ("fast" if fast else "general")
        assert await used(limiter, "2/hour", scope_name) == 2
        assert asked == ([] if fast else ["/named"] * 5)
    finally:
        await limiter.reset(PEER, scope="named-" + ("fast" if fast else "general"))
        await limiter.close()


class Raising:
    def __getitem__(self, index: int) -> str:
        raise LookupError("no host")


class RaisingInterrupt:
    def __str__(self) -> str:
        raise KeyboardInterrupt  # not an Exception: raised by both


async def test_the_c_function_answers_as_its_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """csrc/fast_route.c's RouteArguments against tests/route_arguments_reference.py on a
    learnt route's own (rule, scope), its rule's and its scope's values varied one by one:
    the same answer, or the same error."""
    limiter = memory_limiter()
    app = who_app(limiter)

    seen: list[tuple[Any, Any]] = []
    in_c = stack.alone_arguments

    def spy(rule: Any, scope: Any) -> Any:
        seen.append((rule, dict(scope)))
        return in_c(rule, scope)

    monkeypatch.setattr(stack, "alone_arguments", spy)
    async with client(app) as http:
        assert (await http.get("/who")).status_code == 200
    ((rule, scope),) = seen

    def answer(function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except BaseException as error:  # compared, not swallowed
            return (type(error), str(error))

    def same(rule_changes: dict[str, Any], scope_changes: dict[str, Any]) -> Any:
        saved = {name: getattr(rule, name) for name in rule_changes}
        changed_scope = {**scope, **scope_changes}
        for name, value in rule_changes.items():
            setattr(rule, name, value)
        try:
            expected = answer(alone_arguments, rule, changed_scope)
            assert answer(in_c, rule, changed_scope) == expected, (rule_changes, scope_changes)
            return expected
        finally:
            for name, value in saved.items():
                setattr(rule, name, value)

    assert same({}, {}) == (PEER, "10/hour", 1, None, "GET:/who")
    rule_cases: list[dict[str, Any]] = [
        {"exempt_when": lambda request: False},
        {"rate": b"10/hour"},
        {"cost": 3},
        {"cost": 2.0},
        {"cost": True},
        {"tenant": "gold"},
        {"tenant": b"gold"},
        {"key": "text"},
        {"key": b"bytes"},
        {"key": api_key},
        {"key": ClientIdentity(api_key_header="x-user")},
        {"key": ClientIdentity(trusted_proxies=["10.0.0.0/8"])},
        {"key": ClientIdentity()},
        {"scope": "named"},
        {"scope": ""},
    ]
    for changes in rule_cases:
        same(changes, {})
    for client_value in [
        None,
        (),
        ("::ffff:192.0.2.1", 1),
        ("not an address", 1),
        ("", 1),
        [PEER],
        (5, 1),
        Raising(),
        (RaisingInterrupt(), 1),
    ]:
        same({}, {"client": client_value})
    same({}, {stack.DECIDED: None})
    same({}, {"method": "POST"})  # another route's facts: learnt
    same({}, {"app_root_path": "/other"})
    same({}, {"app_root_path": 5})
    same({}, {"router": None})
    same({}, {"endpoint": None})
    monkeypatch.setattr(app, "dependency_overrides", {api_key: api_key})
    same({}, {})
    assert stack.alone_arguments is spy and isinstance(in_c, _accel.RouteArguments)
