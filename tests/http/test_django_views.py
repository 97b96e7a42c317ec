"""moderato.django in process: limit() on sync and async function views and class-based
views, key names, scopes, methods, costs, callbacks, answers and headers, the middleware,
the settings' errors. Django's test clients (WSGI and ASGI handlers), memory:// on a fixed
clock or a real redis-server; exact counts throughout."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django_support import configure, skip_unsupported_python

skip_unsupported_python()
configure()

import django  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402

import moderato.django  # noqa: E402
from moderato import RateLimitConfigError  # noqa: E402
from moderato.django import get_limiter, get_settings, limit  # noqa: E402
from moderato.django.conf import SETTINGS  # noqa: E402

NOW_MS = 1_800_000_000_000  # a fixed memory:// clock: no window boundary inside a test
BASE = {"URL": "memory://", "KEY_PREFIX": "dj"}
TESTS = Path(__file__).resolve().parents[1]


def pin_clock() -> None:
    get_limiter().backend.clock = lambda: NOW_MS  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def fresh_limiters() -> Iterator[None]:
    moderato.django.close()
    pin_clock()
    yield
    moderato.django.close()


def statuses(client: Client, path: str, count: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(count)]


async def async_statuses(path: str, count: int, **extra: Any) -> list[int]:
    client = AsyncClient()
    return [(await client.get(path, **extra)).status_code for _ in range(count)]


# -- limit() on views ------------------------------------------------------------------


def test_a_sync_view_admits_exactly_its_rate_with_the_asgi_body_and_headers() -> None:
    client = Client()
    responses = [client.get("/sync/") for _ in range(7)]
    assert [r.status_code for r in responses] == [200] * 5 + [429] * 2
    assert [r.headers["X-RateLimit-Remaining"] for r in responses] == [
        "4",
        "3",
        "2",
        "1",
        "0",
    ] * 1 + [
        "0",
        "0",
    ]
    assert {r.headers["X-RateLimit-Limit"] for r in responses} == {"5"}
    denied = responses[-1]
    retry_after_s = int(denied.headers["Retry-After"])
    assert 1 <= retry_after_s <= 3600
    assert denied.headers["Content-Type"] == "application/json"
    assert denied.json() == {
        "error": "Rate limit exceeded",
        "retry_after": retry_after_s,
        "limit": 5,
    }
    assert "Retry-After" not in responses[0].headers


async def test_an_async_view_admits_exactly_its_rate() -> None:
    assert await async_statuses("/async/", 7) == [200] * 5 + [429] * 2


def test_class_based_views_through_method_decorator_sync_and_async() -> None:
    assert statuses(Client(), "/cbv/", 3) == [200, 200, 429]


@pytest.mark.skipif(
    django.VERSION < (5, 0),
    reason="method_decorator on an async method needs Django 5.0 (docs/django.md says so)",
)
async def test_an_async_class_based_view_through_method_decorator() -> None:
    assert await async_statuses("/acbv/", 3) == [200, 200, 429]


def test_limit_on_a_method_without_method_decorator_says_what_to_do() -> None:
    class Broken:
        @limit("1/hour")
        def get(self, request: Any) -> None:
            pass

    with pytest.raises(TypeError, match="method_decorator"):
        Broken().get(object())


def test_the_default_scope_is_the_method_and_the_matched_pattern() -> None:
    client = Client()
    # /items/1/ .. /items/4/ share GET:/items/<int:pk>/; /goods/ is another pattern.
    assert [client.get(f"/items/{n}/").status_code for n in range(1, 5)] == [200] * 3 + [429]
    assert client.get("/goods/9/").status_code == 200
    # HEAD counts as GET: the same quota.
    assert client.head("/items/5/").status_code == 429
    limiter = get_limiter()
    assert limiter.get_usage("127.0.0.1", "3/hour", scope="GET:/items/<int:pk>/")["current"] == 3
    assert limiter.get_usage("127.0.0.1", "3/hour", scope="GET:/goods/<int:pk>/")["current"] == 1


def test_stacked_limits_are_decided_as_one_each_on_its_own_counter() -> None:
    client = Client()
    assert statuses(client, "/stacked/", 4) == [200, 200, 429, 429]
    limiter = get_limiter()
    # The inner limit refused the last two: the outer one was not charged for them.
    assert limiter.get_usage("127.0.0.1", "3/hour", scope="outer")["current"] == 2
    assert limiter.get_usage("127.0.0.1", "2/hour", scope="inner")["current"] == 2


def test_methods_limits_only_the_methods_named() -> None:
    client = Client()
    assert statuses(client, "/methods/", 5) == [200] * 5
    assert [client.post("/methods/").status_code for _ in range(3)] == [200, 200, 429]
    assert "X-RateLimit-Limit" not in client.get("/methods/").headers


# -- keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "first", "second"),
    [
        ("/key/ip/", {"REMOTE_ADDR": "192.0.2.1"}, {"REMOTE_ADDR": "192.0.2.2"}),
        ("/key/header/", {"HTTP_X_API_KEY": "a"}, {"HTTP_X_API_KEY": "b"}),
        ("/key/dotted/", {"HTTP_X_KEY": "a"}, {"HTTP_X_KEY": "b"}),
        ("/key/callable/", {"HTTP_X_KEY": "a"}, {"HTTP_X_KEY": "b"}),
    ],
)
def test_key_names_dotted_paths_and_callables(
    path: str, first: dict[str, str], second: dict[str, str]
) -> None:
    client = Client()
    assert statuses(client, path, 3, **first) == [200, 200, 429]
    assert statuses(client, path, 3, **second) == [200, 200, 429]


def test_get_and_post_parameter_keys() -> None:
    client = Client()
    assert statuses(client, "/key/get/?q=a", 3) == [200, 200, 429]
    assert statuses(client, "/key/get/?q=b", 1) == [200]
    assert [client.post("/key/post/", {"account": "x"}).status_code for _ in range(3)] == [
        200,
        200,
        429,
    ]
    assert client.post("/key/post/", {"account": "y"}).status_code == 200


@override_settings(MIDDLEWARE=["django_views.HeaderUser"])
def test_user_keys_by_primary_key() -> None:
    pin_clock()
    client = Client()
    assert statuses(client, "/key/user/", 3, HTTP_X_USER="7") == [200, 200, 429]
    assert statuses(client, "/key/user/", 1, HTTP_X_USER="8") == [200]
    # Every anonymous request shares the one identity user:anonymous ...
    assert statuses(client, "/key/user/", 3, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]
    assert statuses(client, "/key/user/", 1, REMOTE_ADDR="192.0.2.2") == [429]
    # ... while user_or_ip falls back to the address.
    assert statuses(client, "/key/user_or_ip/", 3, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]
    assert statuses(client, "/key/user_or_ip/", 1, REMOTE_ADDR="192.0.2.2") == [200]
    assert statuses(client, "/key/user_or_ip/", 3, HTTP_X_USER="7") == [200, 200, 429]
    usage = get_limiter().get_usage("user:7", "2/hour", scope="GET:/key/user_or_ip/")
    assert usage["current"] == 2


@override_settings(MIDDLEWARE=["django_views.HeaderUser"])
async def test_user_keys_and_async_key_callbacks_in_async_views() -> None:
    pin_clock()
    assert await async_statuses("/key/user-async/", 3, headers={"X-User": "7"}) == [200, 200, 429]
    assert await async_statuses("/key/user-async/", 1, headers={"X-User": "8"}) == [200]
    assert await async_statuses("/key/async-callable/", 3, headers={"X-Key": "a"}) == [
        200,
        200,
        429,
    ]


def test_bad_keys_and_arguments_are_improperly_configured_at_decoration() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"key": "ipaddress"}, "not one of ip, user"),
        ({"key": "header:"}, "needs a name after 'header:'"),
        ({"key": "nowhere.at_all"}, "cannot be imported"),
        ({"key": 42}, "key must be one of"),
        ({"key": lambda: "x"}, "key must be a callable of the request"),
        ({"algorithm": "leaky"}, "leaky"),
        ({"cost": 11}, "cost 11 exceeds capacity 10"),
        ({"cost": 0}, "cost"),
        ({"scope": ""}, "scope must be a non-empty string"),
        ({"methods": ["GET", 1]}, "methods must name HTTP methods"),
        ({"tenant": 5}, "tenant must be a string"),
    ]
    for arguments, message in cases:
        with pytest.raises(ImproperlyConfigured, match=message) as raised:
            limit("10/hour", **arguments)
        assert isinstance(raised.value, RateLimitConfigError)
        assert str(raised.value).startswith("limit('10/hour'): ")
    with pytest.raises(ImproperlyConfigured, match="invalid rate"):
        limit("10/fortnight")


# -- costs, tenants, callbacks, answers --------------------------------------------------


def test_a_cost_above_capacity_is_422_and_charges_nothing() -> None:
    client = Client()
    denied = client.get("/costly/?cost=11")
    assert denied.status_code == 422
    assert denied.json() == {"error": "Rate limit exceeded", "retry_after": None, "limit": 10}
    assert "Retry-After" not in denied.headers and "X-RateLimit-Reset" not in denied.headers
    assert denied.headers["X-RateLimit-Remaining"] == "10"
    assert [client.get("/costly/?cost=4").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/costly/?cost=2").status_code == 200


async def test_a_cost_above_capacity_in_an_async_view() -> None:
    client = AsyncClient()
    assert (await client.get("/costly-async/?cost=11")).status_code == 422
    assert (await client.get("/costly-async/?cost=10")).status_code == 200


def test_tenants_have_quotas_of_their_own() -> None:
    client = Client()
    assert statuses(client, "/tenant/?tier=free", 3) == [200, 200, 429]
    assert statuses(client, "/tenant/?tier=pro", 2) == [200, 200]
    assert statuses(client, "/tenant/", 3) == [200, 200, 429]


def test_a_rate_callback() -> None:
    client = Client()
    assert statuses(client, "/rate/?rate=1/hour", 2) == [200, 429]
    bad = client.get("/rate/?rate=often")
    assert bad.status_code == 503
    assert bad.json() == {"error": "Rate limit callback failed", "callback": "rate"}


def test_a_failing_callback_is_503_and_the_view_never_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    response = Client().get("/broken/")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": "key"}
    assert "Retry-After" not in response.headers and "X-RateLimit-Limit" not in response.headers


async def test_a_failing_callback_in_an_async_view() -> None:
    response = await AsyncClient().get("/broken-async/")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": "tenant"}


def ratelimited(request: Any, exception: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse(f"slow down, {exception.retry_after} s", status=429)


async def ratelimited_async(request: Any, exception: Any) -> Any:
    return ratelimited(request, exception)


@pytest.mark.parametrize(
    "view", ["test_django_views.ratelimited", "test_django_views.ratelimited_async"]
)
def test_a_denial_view_renders_denials_and_keeps_the_headers(view: str) -> None:
    with override_settings(MODERATO={**BASE, "DENIAL_VIEW": view}):
        pin_clock()
        client = Client()
        statuses(client, "/sync/", 5)
        denied = client.get("/sync/")
        assert denied.status_code == 429
        assert denied.content.decode() == f"slow down, {denied.headers['Retry-After']} s"
        assert denied.headers["X-RateLimit-Remaining"] == "0"
        # A 503 is not a denial: it stays moderato's JSON.
        assert client.get("/broken/").json()["error"] == "Rate limit callback failed"


async def test_a_denial_view_in_an_async_view() -> None:
    with override_settings(MODERATO={**BASE, "DENIAL_VIEW": "test_django_views.ratelimited"}):
        pin_clock()
        codes = await async_statuses("/async/", 6)
        assert codes == [200] * 5 + [429]
        denied = await AsyncClient().get("/async/")
        assert denied.content.decode().startswith("slow down, ")


def test_ietf_headers_and_none() -> None:
    with override_settings(MODERATO={**BASE, "HEADERS": "ietf"}):
        pin_clock()
        response = Client().get("/sync/")
        assert response.headers["RateLimit-Policy"] == '"5-per-3600s";q=5;w=3600'
        assert response.headers["RateLimit"].startswith('"5-per-3600s";r=4;t=')
        assert "X-RateLimit-Limit" not in response.headers
    with override_settings(MODERATO={**BASE, "HEADERS": None}):
        pin_clock()
        client = Client()
        responses = [client.get("/sync/") for _ in range(6)]
        assert "X-RateLimit-Limit" not in responses[0].headers
        assert responses[-1].status_code == 429 and "Retry-After" in responses[-1].headers


# -- the middleware ------------------------------------------------------------------------

MIDDLEWARE = ["django_views.HeaderUser", "moderato.django.RateLimitMiddleware"]


def test_the_middleware_app_wide_rate_exempt_paths_and_headers() -> None:
    settings = {**BASE, "RATE": "4/hour", "EXEMPT_PATHS": ["/healthz", "/static/*"]}
    with override_settings(MIDDLEWARE=MIDDLEWARE, MODERATO=settings):
        pin_clock()
        client = Client()
        plain = [client.get("/plain/") for _ in range(2)]
        assert [r.headers["X-RateLimit-Remaining"] for r in plain] == ["3", "2"]
        # A decorated view: both decisions, the fewer remaining reported (the view's 5/hour: 4).
        both = client.get("/sync/")
        assert (both.headers["X-RateLimit-Limit"], both.headers["X-RateLimit-Remaining"]) == (
            "4",
            "1",
        )
        assert statuses(client, "/plain/", 2) == [200, 429]
        refused = client.get("/sync/")  # refused by the app-wide rate: the view is not charged
        assert refused.status_code == 429
        assert refused.json()["limit"] == 4
        assert statuses(client, "/healthz", 5) == [200] * 5
        assert "X-RateLimit-Limit" not in client.get("/healthz").headers
        assert statuses(client, "/plain/", 1, REMOTE_ADDR="192.0.2.9") == [200]
        assert get_limiter().get_usage("127.0.0.1", "5/hour", scope="GET:/sync/")["current"] == 1


async def test_the_middleware_on_an_async_stack() -> None:
    with override_settings(MIDDLEWARE=MIDDLEWARE, MODERATO={**BASE, "RATE": "3/hour"}):
        pin_clock()
        client = AsyncClient()
        responses = [await client.get("/async/") for _ in range(4)]
        assert [r.status_code for r in responses] == [200, 200, 200, 429]
        assert [r.headers.get("X-RateLimit-Remaining") for r in responses] == ["2", "1", "0", "0"]


def test_the_middleware_reports_a_views_denial_once() -> None:
    with override_settings(MIDDLEWARE=MIDDLEWARE, MODERATO={**BASE, "RATE": "100/hour"}):
        pin_clock()
        client = Client()
        statuses(client, "/cbv/", 2)
        denied = client.get("/cbv/")
        assert denied.status_code == 429
        assert (denied.headers["X-RateLimit-Limit"], denied.headers["X-RateLimit-Remaining"]) == (
            "2",
            "0",
        )
        assert denied.json()["limit"] == 2


def test_a_views_stacked_limits_with_a_common_window_count_apart() -> None:
    client = Client()
    assert statuses(client, "/twice/", 5) == [200] * 4 + [429]
    limiter = get_limiter()
    for rate, used in (("10/minute", 4), ("4/minute", 4)):
        scope = f"GET:/twice/#{rate}"
        assert limiter.get_usage("127.0.0.1", rate, scope=scope)["current"] == used


def test_stacked_limits_that_would_share_a_counter_are_refused_at_import() -> None:
    with pytest.raises(ImproperlyConfigured, match="would count in one counter"):
        limit("4/minute", scope="x")(limit("10/minute", scope="x")(lambda request: None))


def app_and_view_as_one(url: str, path: str) -> tuple[list[int], int, list[int]]:
    """RATE 5/minute and the view's 2/minute: what the view answers to 4 requests, what
    the app-wide limit counted, what another path then answers to 4."""
    from asgiref.sync import async_to_sync

    # sliding_log on Redis: no window boundary can fall inside the test.
    settings = {"URL": url, "KEY_PREFIX": "djt", "RATE": "5/minute"}
    if url != "memory://":
        settings["DEFAULT_ALGORITHM"] = "sliding_log"
    with override_settings(MIDDLEWARE=MIDDLEWARE, MODERATO=settings):
        pin_clock()
        if path.startswith("/narrow-async"):
            narrow = async_to_sync(async_statuses)(path, 4)
        else:
            narrow = statuses(Client(), path, 4)
        app_used = get_limiter().get_usage("127.0.0.1", "5/minute", scope="app")["current"]
        others = statuses(Client(), "/plain/", 4)
        moderato.django.close()
    return narrow, app_used, others


@pytest.mark.parametrize("path", ["/narrow/", "/narrow-async/", "/narrow-cbv/"])
def test_the_app_wide_limit_is_not_charged_for_what_the_view_refuses(path: str) -> None:
    assert app_and_view_as_one("memory://", path) == ([200, 200, 429, 429], 2, [200] * 3 + [429])


@pytest.mark.parametrize("path", ["/narrow/", "/narrow-async/", "/narrow-cbv/"])
def test_the_app_wide_limit_and_the_views_are_one_step_on_redis(redis_url: str, path: str) -> None:
    assert app_and_view_as_one(redis_url, path) == ([200, 200, 429, 429], 2, [200] * 3 + [429])


def test_on_a_cluster_the_app_wide_limit_and_a_views_are_refused_before_any_call() -> None:
    # Their keys lie in two hash slots; nothing listens on the seed: the refusal comes
    # before a connection is tried.
    settings = {"URL": "redis+cluster://127.0.0.1:1", "RATE": "5/minute"}
    with override_settings(MIDDLEWARE=MIDDLEWARE, MODERATO=settings):
        with pytest.raises(RateLimitConfigError, match="different Redis Cluster slots"):
            Client().get("/narrow/")
        moderato.django.close()


# -- identity: forwarded headers only from trusted proxies ---------------------------------


def test_forged_forwarded_headers_give_no_fresh_quota_unless_the_peer_is_trusted() -> None:
    client = Client()
    forged = [
        client.get("/key/ip/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
        for n in range(5)
    ]
    assert [r.status_code for r in forged] == [200, 200, 429, 429, 429]
    trusted = {**BASE, "TRUSTED_PROXIES": ["10.0.0.0/8"]}
    with override_settings(MODERATO=trusted):
        pin_clock()
        through_proxy = [
            client.get(
                "/key/ip/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=f"203.0.113.{n % 2}"
            )
            for n in range(6)
        ]
        assert [r.status_code for r in through_proxy] == [200, 200, 200, 200, 429, 429]
        # The right-most untrusted hop: a client-written address to its left is ignored.
        spoofed = "198.51.100.1, 203.0.113.0"
        assert (
            client.get("/key/ip/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=spoofed).status_code
            == 429
        )
        # An untrusted peer's header is still not believed.
        assert statuses(
            client, "/key/ip/", 3, REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="203.0.113.50"
        ) == [
            200,
            200,
            429,
        ]
        # At most 32 hops are read: a long all-trusted chain counts as its 32nd hop.
        chain = ", ".join(
            ["203.0.113.99"] + [f"10.0.{n // 256}.{n % 256}" for n in range(40, 0, -1)]
        )
        assert moderato.django.client_ip(_request("10.0.0.1", chain)) == "10.0.0.32"


def _request(peer: str, forwarded_for: str) -> Any:
    from django.test import RequestFactory

    return RequestFactory().get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded_for)


def test_other_proxy_headers() -> None:
    for header, meta, value, expected in [
        (
            "forwarded",
            "HTTP_FORWARDED",
            'for=203.0.113.5;proto=https, for="[2001:db8::1]"',
            "2001:db8::1",
        ),
        ("x-real-ip", "HTTP_X_REAL_IP", "198.51.100.1,203.0.113.6", "203.0.113.6"),
    ]:
        with override_settings(
            MODERATO={**BASE, "TRUSTED_PROXIES": ["10.0.0.0/8"], "PROXY_HEADER": header}
        ):
            from django.test import RequestFactory

            request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.1", **{meta: value})
            assert moderato.django.client_ip(request) == expected


# -- settings ------------------------------------------------------------------------------

BAD_SETTINGS: list[tuple[str, Any, str]] = [
    ("URL", "mongodb://x", "unsupported scheme mongodb://"),
    ("URL", "redis://h:99999", "bad port"),
    ("URL", 6379, "must be a non-empty string"),
    ("KEY_PREFIX", "", "must be a non-empty string"),
    ("KEY_PREFIX", "a{b", "prefix"),
    ("DEFAULT_ALGORITHM", "leaky", "leaky"),
    ("FAIL_OPEN", "yes", "must be True or False"),
    ("SHADOW", 1, "must be True or False"),
    ("ENABLE_METRICS", None, "must be True or False"),
    ("METRICS_NAMESPACE", "", "must be a non-empty string"),
    ("IDENTITY_SECRET", 12, "must be a string or bytes"),
    ("CONNECT_TIMEOUT_S", 0, "positive"),
    ("COMMAND_TIMEOUT_S", "1", "number of seconds"),
    ("CLIENT_NAME", "a b", "client"),
    ("BREAKER_FAILURES", 0, "at least 1"),
    ("BREAKER_COOLDOWN_S", -1, "positive"),
    ("FAILURE_LOG_INTERVAL_S", float("nan"), "finite"),
    ("MAX_CONNECTIONS", 1.5, "must be an int"),
    ("CONNECTIONS_PER_LOOP", 0, "at least 1"),
    ("TRUSTED_PROXIES", "10.0.0.0/8", "must be a list"),
    ("TRUSTED_PROXIES", ["10.0.0.0/33"], "not an IP address or CIDR"),
    ("PROXY_HEADER", "x-client-ip", "proxy_header must be one of"),
    ("KEY", "ipaddress", "not one of ip, user"),
    ("RATE", "10/fortnight", "invalid rate"),
    ("RATE", 10, "must be a non-empty string"),
    ("EXEMPT_PATHS", "/healthz", "must be a list"),
    ("EXEMPT_PATHS", ["healthz"], "must start with '/'"),
    ("HEADERS", "x-ratelimit", "headers must be"),
    ("DENIAL_VIEW", "nowhere.view", "cannot be imported"),
    ("DENIAL_VIEW", 5, "must be a view or its dotted path"),
]


def test_every_setting_is_listed_with_a_bad_value_here() -> None:
    assert {name for name, _, _ in BAD_SETTINGS} == set(SETTINGS)


@pytest.mark.parametrize(("name", "value", "message"), BAD_SETTINGS)
def test_a_bad_setting_is_improperly_configured_naming_its_key(
    name: str, value: Any, message: str
) -> None:
    with (
        override_settings(MODERATO={**BASE, name: value}),
        pytest.raises(ImproperlyConfigured, match=message) as raised,
    ):
        get_settings()
    assert str(raised.value).startswith(f"MODERATO[{name!r}]: ")


def test_unknown_keys_and_a_setting_that_is_not_a_dict() -> None:
    unknown = r"MODERATO\['REDIS_URL'\] is not a setting moderato knows \(did you mean 'URL'\?\)"
    with (
        override_settings(MODERATO={**BASE, "REDIS_URL": "redis://x"}),
        pytest.raises(ImproperlyConfigured, match=unknown),
    ):
        get_settings()
    with (
        override_settings(MODERATO=["URL"]),
        pytest.raises(ImproperlyConfigured, match="MODERATO must be a dict"),
    ):
        get_settings()


def test_good_settings_map_to_the_limiters_options() -> None:
    given = {
        "URL": "memory://",
        "KEY_PREFIX": "shop",
        "DEFAULT_ALGORITHM": "token_bucket",
        "IDENTITY_SECRET": "s" * 32,
        "BREAKER_FAILURES": 3,
        "MAX_CONNECTIONS": 4,
        "CONNECTIONS_PER_LOOP": 3,
    }
    with override_settings(MODERATO=given):
        blocking = get_limiter()
        asynchronous = moderato.django.get_async_limiter()
        assert get_limiter() is blocking and moderato.django.get_async_limiter() is asynchronous
        for limiter in (blocking, asynchronous):
            assert (limiter.key_prefix, limiter.default_algorithm) == ("shop", "token_bucket")
        assert blocking.max_connections == 4 and asynchronous.connections_per_loop == 3


def test_ready_refuses_to_start_with_a_bad_setting_naming_its_key() -> None:
    # What every process does at start-up: django.setup() runs AppConfig.ready().
    script = textwrap.dedent(
        """
        import django
        from django.conf import settings

        settings.configure(
            INSTALLED_APPS=["moderato.django"],
            MODERATO={"URL": "memory://", "BREAKER_FAILURES": -1},
        )
        django.setup()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert (
        "ModeratoImproperlyConfigured: MODERATO['BREAKER_FAILURES']: value must be at least 1"
        in done.stderr
    )


def test_moderato_web_and_django_load_without_starlette() -> None:
    script = textwrap.dedent(
        """
        import sys

        sys.modules["starlette"] = None  # as if not installed
        import django_support

        django_support.configure()
        import moderato.django, moderato.django.throttling, moderato.web.headers
        print("loaded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=TESTS
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "loaded\n"


# -- on a real redis-server -----------------------------------------------------------------


def test_a_sync_view_and_an_async_view_share_one_quota_on_redis(redis_url: str) -> None:
    with override_settings(MODERATO={"URL": redis_url, "KEY_PREFIX": "djr"}):
        client, async_client = Client(), AsyncClient()
        from asgiref.sync import async_to_sync

        codes = []
        for n in range(6):
            if n % 2:
                codes.append(async_to_sync(async_client.get)("/shared-async/").status_code)
            else:
                codes.append(client.get("/shared-sync/").status_code)
        assert codes == [200, 200, 200, 200, 429, 429]
        assert get_limiter().get_usage("127.0.0.1", "4/hour", scope="shared")["current"] == 4
        moderato.django.close()


def test_redis_down_is_503_for_sync_and_async_views(own_redis_server: Any) -> None:
    settings = {"URL": own_redis_server.url, "KEY_PREFIX": "djd", "BREAKER_COOLDOWN_S": 0.2}
    with override_settings(MODERATO=settings):
        client = Client()
        from asgiref.sync import async_to_sync

        assert client.get("/sync/").status_code == 200
        own_redis_server.stop()
        down = [client.get("/sync/") for _ in range(3)]
        down += [async_to_sync(AsyncClient().get)("/async/") for _ in range(3)]
        assert [r.status_code for r in down] == [503] * 6
        assert {r.content for r in down} == {b'{"error":"Rate limit backend unavailable"}'}
        assert all("Retry-After" not in r.headers for r in down)
        own_redis_server.start()
        import time

        deadline_s = time.monotonic() + 10
        while client.get("/sync/").status_code != 200:
            assert time.monotonic() < deadline_s
            time.sleep(0.1)
        moderato.django.close()
