"""Configuration errors by type, with messages that name the option and list the choices."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry

from moderato import RateLimitConfigError, RateLimiter
from moderato.backends import schemes
from moderato.backends.memory import MemoryBackend

EVERY_SCHEME = (
    "memory://, redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
    "redis+sentinel://, rediss+sentinel://"
)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1", "memory://"])
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "connect_timeout_s",
            "1",
            "connect_timeout_s must be a number of seconds (int or float), got str '1'",
        ),
        (
            "command_timeout_s",
            None,
            "command_timeout_s must be a number of seconds (int or float), got NoneType None",
        ),
        (
            "breaker_cooldown_s",
            True,
            "breaker_cooldown_s must be a number of seconds (int or float), got bool True",
        ),
        (
            "failure_log_interval_s",
            "10",
            "failure_log_interval_s must be a number of seconds (int or float), got str '10'",
        ),
        ("connections_per_loop", 1.5, "connections_per_loop must be an int, got float 1.5"),
        ("breaker_failures", "5", "breaker_failures must be an int, got str '5'"),
        ("breaker_failures", 0, "breaker_failures must be at least 1, got 0"),
        (
            "connect_timeout_s",
            float("inf"),
            "connect_timeout_s must be a positive, finite number of seconds, got inf",
        ),
    ],
)
def test_an_option_of_the_wrong_type_is_a_config_error_naming_it(
    url: str, option: str, value: object, message: str
) -> None:
    with pytest.raises(RateLimitConfigError) as raised:
        RateLimiter(url, **{option: value})  # type: ignore[arg-type]
    assert str(raised.value) == message
    assert not isinstance(raised.value, TypeError)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@host:6379", "http:// in redis_url 'http://user:***@host:6379'"),
        ("localhost:6379", "(none) in redis_url 'localhost:6379'"),
        ("redis+shards://host:26379/x", "redis+shards:// in redis_url"),
    ],
)
def test_an_unknown_scheme_lists_every_accepted_one(url: str, shown: str) -> None:
    with pytest.raises(RateLimitConfigError) as raised:
        RateLimiter(url)
    message = str(raised.value)
    assert message.startswith(f"unsupported scheme {shown}")
    assert message.endswith(f"; expected one of {EVERY_SCHEME}")


def test_anything_but_a_url_or_a_client_lists_the_schemes_too() -> None:
    with pytest.raises(RateLimitConfigError) as raised:
        RateLimiter(5)  # type: ignore[arg-type]
    assert str(raised.value) == (
        "redis_url must be a URL string or a redis.asyncio.Redis / RedisCluster client, "
        f"got int; URL schemes: {EVERY_SCHEME}"
    )


def test_a_registered_scheme_is_accepted_and_listed_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a new backend does (as Sentinel's did): one entry in the registry.
    monkeypatch.setitem(
        schemes.SCHEMES, "test+mem", lambda url, **options: MemoryBackend(max_entries=10)
    )
    assert isinstance(RateLimiter("test+mem://anything").backend, MemoryBackend)
    with pytest.raises(RateLimitConfigError, match=r", test\+mem://$"):
        RateLimiter("nope://h")


def test_enable_metrics_without_prometheus_blames_enable_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(RateLimitConfigError) as raised:
        RateLimiter("memory://", enable_metrics=True, metrics_registry=CollectorRegistry())
    assert str(raised.value) == (
        "enable_metrics=True needs the prometheus_client package, which is not installed: "
        "pip install 'moderato[metrics]'"
    )
    with pytest.raises(RateLimitConfigError) as raised:
        RateLimiter("memory://", fail_open=True, metrics_registry=CollectorRegistry())
    assert str(raised.value) == (
        "fail_open=True (a bypass must always be counted, so it turns metrics on) needs the "
        "prometheus_client package, which is not installed: pip install 'moderato[metrics]'"
    )


MISSING = (
    "moderato's HTTP integration (RateLimitMiddleware, RateLimitHeadersMiddleware, "
    "ClientIdentity, limiter.limit() and limiter.dependency()) needs Starlette, which is "
    "not installed: pip install 'moderato[starlette]' (or 'moderato[fastapi]' for FastAPI)"
)


@pytest.mark.parametrize("how", ["finder", "stub"])
def test_the_http_names_without_starlette_name_the_extra(how: str) -> None:
    # A fresh interpreter where Starlette (and so FastAPI) cannot be imported.
    script = textwrap.dedent(
        """
        import asyncio
        import importlib.abc
        import sys

        class NoStarlette(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("starlette", "fastapi"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        if sys.argv[1] == "finder":
            sys.meta_path.insert(0, NoStarlette())
        else:
            sys.modules["starlette"] = None

        import moderato
        from moderato import RateLimiter

        limiter = RateLimiter("memory://")
        print(asyncio.run(limiter.check("k", "1/minute")))  # the core works
        attempts = {
            "attribute": lambda: moderato.RateLimitMiddleware,
            "from-import": lambda: __import__("moderato.integrations"),
            "decorator": lambda: limiter.limit("1/minute"),
        }
        for label, attempt in attempts.items():
            try:
                attempt()
            except ImportError as error:
                print(label, type(error).__name__, error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True",
        f"attribute ImportError {MISSING}",
        f"from-import ImportError {MISSING}",
        f"decorator ImportError {MISSING}",
    ]
