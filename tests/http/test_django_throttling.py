"""moderato.django.throttling: drop-in REST framework throttles, in process (memory:// on a
fixed clock, and a redis-server for the outage), with DRF's own settings. Exact counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import django_support
import pytest
from django_support import configure, skip_unsupported_python

skip_unsupported_python()
configure()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from rest_framework.test import APIRequestFactory  # noqa: E402

import moderato.django  # noqa: E402
from moderato.django import get_limiter  # noqa: E402
from moderato.django.throttling import (  # noqa: E402
    AnonRateThrottle,
    RateThrottle,
    ScopedRateThrottle,
    UserRateThrottle,
    drf_rate,
)

NOW_MS = 1_800_000_000_000
RATES = {"anon": "3/minute", "user": "4/minute", "uploads": "2/minute"}


def pin_clock() -> None:
    get_limiter().backend.clock = lambda: NOW_MS  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def fresh_limiters() -> Iterator[None]:
    moderato.django.close()
    pin_clock()
    yield
    moderato.django.close()


def codes(path: str, count: int, **extra: Any) -> list[int]:
    client = Client()
    return [client.get(path, **extra).status_code for _ in range(count)]


def test_two_throttles_of_a_view_are_decided_as_one() -> None:
    # The narrow throttle refuses the last two: the wide one is not charged for them.
    assert codes("/api/two/", 4) == [200, 200, 429, 429]
    limiter = get_limiter()
    assert limiter.get_usage("127.0.0.1", "5/minute", scope="drf:wide")["current"] == 2
    assert limiter.get_usage("127.0.0.1", "2/minute", scope="drf:narrow")["current"] == 2


def test_anon_throttle_limits_anonymous_clients_by_address_and_lets_users_through() -> None:
    assert codes("/api/anon/", 5) == [200, 200, 200, 429, 429]
    assert codes("/api/anon/", 1, REMOTE_ADDR="192.0.2.4") == [200]
    assert codes("/api/anon/", 5, HTTP_X_USER="7") == [200] * 5
    denied = Client().get("/api/anon/")
    # DRF's own 429: its body and Retry-After, from wait() (Redis's clock, rounded up).
    assert denied.json()["detail"].startswith("Request was throttled. Expected available in ")
    assert 1 <= int(denied.headers["Retry-After"]) <= 60


def test_user_throttle_by_primary_key_else_address() -> None:
    assert codes("/api/user/", 5, HTTP_X_USER="7") == [200] * 4 + [429]
    assert codes("/api/user/", 1, HTTP_X_USER="8") == [200]
    assert codes("/api/user/", 5) == [200] * 4 + [429]
    assert get_limiter().get_usage("user:7", "4/minute", scope="drf:user")["current"] == 4


def test_scoped_throttle_reads_the_views_throttle_scope() -> None:
    assert codes("/api/scoped/", 3, HTTP_X_USER="7") == [200, 200, 429]
    assert codes("/api/scoped/", 3) == [200, 200, 429]
    assert codes("/api/unscoped/", 5) == [200] * 5  # no throttle_scope: not throttled


def test_default_throttle_classes_from_drf_settings() -> None:
    # DEFAULT_THROTTLE_CLASSES is django_support's (DRF reads it when a view class is
    # defined); the rates are read when a request is throttled, so they may change.
    drf = {**django_support.BASE_SETTINGS["REST_FRAMEWORK"]}  # type: ignore[dict-item]
    drf["DEFAULT_THROTTLE_RATES"] = {"anon": "2/minute", "user": "10/minute"}
    with override_settings(REST_FRAMEWORK=drf):
        pin_clock()
        assert codes("/api/default/", 4) == [200, 200, 429, 429]
        # Both throttles are decided as one: the user one is not charged for the
        # requests the anon one refused.
        assert get_limiter().get_usage("127.0.0.1", "10/minute", scope="drf:user")["current"] == 2


def test_wait_drf_rates_and_missing_rates() -> None:
    throttle = UserRateThrottle()
    request = APIRequestFactory().get("/")
    request.user = None
    results = [throttle.allow_request(request, None) for _ in range(5)]
    assert results == [True] * 4 + [False]
    wait_s = throttle.wait()
    assert wait_s is not None and 1 <= wait_s <= 60
    assert [drf_rate(r) for r in ("10/min", "100/days", "3/sec", "5/hours", "5/m")] == [
        "10/min",
        "100/days",
        "3/sec",
        "5/hours",
        "5/m",
    ]
    assert drf_rate("5/mo") == "5/minute"  # DRF reads the first letter: so does this
    with pytest.raises(ImproperlyConfigured, match="neither moderato's nor REST framework's"):
        drf_rate("often")

    class Nameless(RateThrottle):
        pass

    with pytest.raises(ImproperlyConfigured, match=r"set either `\.scope` or `\.rate`"):
        Nameless()

    class Unrated(RateThrottle):
        scope = "nowhere"

    with pytest.raises(ImproperlyConfigured, match="No default throttle rate set for 'nowhere'"):
        Unrated()

    class Unlimited(AnonRateThrottle):
        THROTTLE_RATES = {"anon": None}  # noqa: RUF012

    assert all(Unlimited().allow_request(request, None) for _ in range(10))


def test_a_custom_throttle_with_a_cost_above_capacity_is_422() -> None:
    class Export(RateThrottle):
        rate = "5/hour"
        scope = "exports"
        cost = 6

        def get_identity(self, request: Any, view: Any) -> str:
            return "export"

    from rest_framework.exceptions import APIException

    with pytest.raises(APIException) as raised:
        Export().allow_request(APIRequestFactory().get("/"), None)
    assert raised.value.status_code == 422


def test_scoped_throttle_is_constructed_without_a_scope() -> None:
    throttle = ScopedRateThrottle()
    assert throttle.rate is None and throttle.wait() is None


def test_redis_down_is_503_not_a_throttle(own_redis_server: Any) -> None:
    with override_settings(MODERATO={"URL": own_redis_server.url, "KEY_PREFIX": "drf"}):
        assert codes("/api/anon/", 1) == [200]
        own_redis_server.stop()
        response = Client().get("/api/anon/")
        assert response.status_code == 503
        assert response.json() == {"detail": "Rate limit backend unavailable"}
        own_redis_server.start()
        moderato.django.close()
