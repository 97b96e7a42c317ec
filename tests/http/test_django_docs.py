"""Every moderato snippet of docs/django.md and docs/migrating-from-django-ratelimit.md runs,
and what it builds behaves as the page says (exact counts, memory:// on a fixed clock).

A snippet is a fenced block opened with ```` ```python moderato id=<name> ````
(doc_snippets.py). Each runs on its own, with ``"redis://localhost:6379"``
replaced by ``"memory://"``; an exerciser per snippet drives what it built. A
snippet without an exerciser, or an exerciser without a snippet, fails.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from django_support import BASE_SETTINGS, configure, skip_unsupported_python

skip_unsupported_python()
configure()

from asgiref.sync import async_to_sync  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import Client, RequestFactory, override_settings  # noqa: E402
from doc_snippets import snippets  # noqa: E402
from rest_framework.test import APIRequestFactory  # noqa: E402

import moderato.django  # noqa: E402
from moderato.django import UNSAFE, get_limiter, get_settings  # noqa: E402

NOW_MS = 1_800_000_000_000
ROOT = Path(__file__).resolve().parents[2]
Namespace = dict[str, Any]


def pin_clock() -> None:
    get_limiter().backend.clock = lambda: NOW_MS  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def fresh_limiters() -> Iterator[None]:
    moderato.django.close()
    pin_clock()
    yield
    moderato.django.close()


@pytest.fixture(autouse=True)
def myapp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``myapp.views.ratelimited`` the migration guide's settings name."""
    package, views = types.ModuleType("myapp"), types.ModuleType("myapp.views")
    views.ratelimited = lambda request, exception: HttpResponse("slow down", status=429)  # type: ignore[attr-defined]
    package.views = views  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myapp", package)
    monkeypatch.setitem(sys.modules, "myapp.views", views)


def run(code: str) -> Namespace:
    namespace: Namespace = {"__name__": "doc_snippet"}
    exec(
        compile(code.replace('"redis://localhost:6379"', '"memory://"'), "<doc>", "exec"), namespace
    )
    return namespace


class User:
    is_authenticated = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


def calls(view: Callable[..., Any], count: int, method: str = "get", **extra: Any) -> list[Any]:
    factory = RequestFactory()
    responses = []
    for _ in range(count):
        request = getattr(factory, method)("/", **extra)
        response = view(request)
        if inspect.isawaitable(response):  # an async view
            response = async_to_sync(settled)(response)
        responses.append(response)
    return responses


async def settled(pending: Any) -> Any:
    return await pending


def codes(view: Callable[..., Any], count: int, method: str = "get", **extra: Any) -> list[int]:
    return [response.status_code for response in calls(view, count, method, **extra)]


# -- docs/django.md ----------------------------------------------------------------------


def django_settings(ns: Namespace) -> None:
    assert "moderato.django" in ns["INSTALLED_APPS"]
    with override_settings(MODERATO=ns["MODERATO"]):
        settings = get_settings()
        assert settings.rate == "1000/hour"
        assert settings.values["DEFAULT_ALGORITHM"] == "sliding_window"
        assert settings.exempt_paths.match("/static/css/site.css")
        assert len(settings.proxy_rules.trusted_proxies) == 1


def django_views(ns: Namespace) -> None:
    assert codes(ns["search"], 11) == [200] * 10 + [429]
    assert ns["upload"].moderato_limits[0].methods == frozenset(UNSAFE)
    assert codes(ns["upload"], 3, "get") == [200] * 3  # GET is not counted
    uploaded = calls(ns["upload"], 1, "post")[0]
    assert uploaded.headers["X-RateLimit-Remaining"] == "99"
    exports = calls(ns["export"], 3, HTTP_X_API_KEY="k1")
    assert [r.status_code for r in exports] == [200, 200, 429]  # cost 2 of 5
    assert codes(ns["export"], 1, HTTP_X_API_KEY="k2") == [200]


def django_class_based(ns: Namespace) -> None:
    comment = ns["CommentView"].as_view()
    assert codes(comment, 6, "post") == [200] * 5 + [429]
    assert codes(comment, 3, "get") == [200] * 3
    assert codes(ns["FeedView"].as_view(), 21) == [200] * 20 + [429]


def django_denial_view(ns: Namespace) -> None:
    with override_settings(MODERATO=ns["MODERATO"]):
        pin_clock()
        client = Client()
        [client.get("/sync/") for _ in range(5)]
        denied = client.get("/sync/")
        assert denied.status_code == 429
        assert denied.content.decode() == f"Too many requests, retry in {denied['Retry-After']} s"


def django_middleware(ns: Namespace) -> None:
    with override_settings(
        MIDDLEWARE=ns["MIDDLEWARE"],
        MODERATO=ns["MODERATO"],
        SESSION_ENGINE="django.contrib.sessions.backends.signed_cookies",
    ):
        pin_clock()
        client = Client()
        first = client.get("/plain/")
        assert (first["X-RateLimit-Limit"], first["X-RateLimit-Remaining"]) == ("1000", "999")
        assert "X-RateLimit-Limit" not in client.get("/healthz")
        assert get_limiter().get_usage("127.0.0.1", "1000/hour", scope="app")["current"] == 1


def django_drf(ns: Namespace) -> None:
    drf = {**BASE_SETTINGS["REST_FRAMEWORK"], **ns["REST_FRAMEWORK"]}  # type: ignore[dict-item]
    with override_settings(REST_FRAMEWORK=drf):
        pin_clock()
        assert Client().get("/api/default/").status_code == 200
        assert get_limiter().get_usage("127.0.0.1", "100/day", scope="drf:anon")["current"] == 1


def django_custom_throttle(ns: Namespace) -> None:
    throttle = ns["ApiKeyThrottle"]()
    factory = APIRequestFactory()
    assert all(throttle.allow_request(factory.get("/"), None) for _ in range(3))  # no key
    assert throttle.allow_request(factory.get("/", HTTP_X_API_KEY="k"), None)
    usage = get_limiter().get_usage("k", "500/hour", scope="drf:api-key", algorithm="token_bucket")
    assert usage["current"] == 1


def django_manual(ns: Namespace) -> None:
    factory = RequestFactory()

    def report() -> Any:
        request = factory.get("/")
        request.user = User(5)
        return ns["report"](request)

    responses = [report() for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert responses[0].content == b'{"remaining": 2}'
    preview = async_to_sync(ns["preview"])(factory.get("/"))
    assert preview.status_code == 200


# -- docs/migrating-from-django-ratelimit.md ------------------------------------------------


def migrating_settings(ns: Namespace) -> None:
    assert ns["INSTALLED_APPS"] == ["moderato.django"]
    with override_settings(MODERATO=ns["MODERATO"]):
        settings = get_settings()
        assert settings.denial_view is sys.modules["myapp.views"].ratelimited  # type: ignore[attr-defined]
        assert settings.values["FAIL_OPEN"] is False


def migrating_decorator(ns: Namespace) -> None:
    assert codes(ns["login"], 6) == [200] * 5 + [429]
    signups = codes(ns["signup"], 11, "post", data={"username": "ann"})
    assert signups == [200] * 10 + [429]
    assert codes(ns["signup"], 1, "post", data={"username": "bob"}) == [200]
    assert codes(ns["signup"], 2, "get") == [200, 200]
    # search and search_json share the "search" scope, sync and async: 20 between them.
    both = codes(ns["search"], 12) + codes(ns["search_json"], 9)
    assert both == [200] * 20 + [429]


def migrating_manual(ns: Namespace) -> None:
    factory = RequestFactory()
    comments = [ns["comment"](factory.get("/")).content.decode() for _ in range(6)]
    assert comments[:5] == ["comment posted"] * 5
    assert comments[5].startswith("solve the captcha, or wait ")
    request = factory.get("/")
    request.user = User(3)
    assert ns["vote"](request).content == b"1 vote(s) left this minute"


def migrating_drf_settings(ns: Namespace) -> None:
    drf = {**BASE_SETTINGS["REST_FRAMEWORK"], **ns["REST_FRAMEWORK"]}  # type: ignore[dict-item]
    with override_settings(REST_FRAMEWORK=drf, MODERATO=ns["MODERATO"]):
        pin_clock()
        client = Client()
        for client_address in ("203.0.113.1", "203.0.113.1", "203.0.113.2"):
            assert (
                client.get(
                    "/api/default/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=client_address
                ).status_code
                == 200
            )
        limiter = get_limiter()
        assert limiter.get_usage("203.0.113.1", "100/day", scope="drf:anon")["current"] == 2
        assert limiter.get_usage("203.0.113.2", "100/day", scope="drf:anon")["current"] == 1


def migrating_drf_custom(ns: Namespace) -> None:
    throttle = ns["TenantThrottle"]()
    request = APIRequestFactory().get("/", HTTP_X_TENANT="acme")
    assert throttle.allow_request(request, None)
    usage = get_limiter().get_usage(
        "acme", "1000/hour", scope="drf:tenant", algorithm="token_bucket"
    )
    assert usage["current"] == 1
    assert throttle.allow_request(APIRequestFactory().get("/"), None)  # no tenant: not throttled


EXERCISERS: dict[str, dict[str, Callable[[Namespace], None]]] = {
    "django.md": {
        "settings": django_settings,
        "views": django_views,
        "class-based": django_class_based,
        "denial-view": django_denial_view,
        "middleware": django_middleware,
        "drf": django_drf,
        "custom-throttle": django_custom_throttle,
        "manual": django_manual,
    },
    "migrating-from-django-ratelimit.md": {
        "settings": migrating_settings,
        "decorator": migrating_decorator,
        "manual": migrating_manual,
        "drf-settings": migrating_drf_settings,
        "drf-custom": migrating_drf_custom,
    },
}

CASES = [(page, name) for page, exercisers in EXERCISERS.items() for name in exercisers]


@pytest.mark.parametrize("page", list(EXERCISERS))
def test_every_snippet_has_an_exerciser(page: str) -> None:
    assert list(snippets(page)) == list(EXERCISERS[page])


@pytest.mark.parametrize(("page", "name"), CASES)
def test_snippet(page: str, name: str) -> None:
    EXERCISERS[page][name](run(snippets(page)[name]))


def test_the_settings_table_lists_every_key_with_its_default() -> None:
    from moderato.django.conf import SETTINGS

    text = (ROOT / "docs" / "django.md").read_text(encoding="utf-8")
    documented: dict[str, Any] = {}
    for names, defaults in re.findall(r"^\| ((?:`[A-Z_]+`(?:, )?)+) \| (.+?) \|", text, re.M):
        keys = re.findall(r"`([A-Z_]+)`", names)
        values = [ast.literal_eval(value) for value in re.findall(r"`([^`]+)`", defaults)]
        assert len(keys) == len(values), names
        documented.update(zip(keys, values))
    assert set(documented) == set(SETTINGS)
    for name, entry in SETTINGS.items():
        default = list(entry.default) if isinstance(entry.default, tuple) else entry.default
        assert documented[name] == default, name
