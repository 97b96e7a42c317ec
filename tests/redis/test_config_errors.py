"""Configuration errors by type, with messages that name the option and list the choices."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from typing import Callable

import pytest
from fastapi import FastAPI, Request
from http_helpers import client
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from moderato import RateLimitConfigError, RateLimiter
from moderato.backends import schemes
from moderato.backends.memory import MemoryBackend
from moderato.integrations import RateLimitMiddleware, install

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


# -- callbacks that cannot take the request ------------------------------------------------


def _two_arguments(request: object, response: object) -> bool:
    return False


def _limiter_for_callbacks() -> RateLimiter:
    return RateLimiter("memory://", key_prefix="callbacks")


@pytest.mark.parametrize(
    "make",
    [
        lambda limiter, when: limiter.limit("5/minute", exempt_when=when),
        lambda limiter, when: limiter.dependency("5/minute", exempt_when=when),
        lambda limiter, when: RateLimitMiddleware(
            Starlette(), limiter=limiter, rate="5/minute", exempt_when=when
        ),
        lambda limiter, when: install(FastAPI(), limiter, rate="5/minute", exempt_when=when),
    ],
    ids=["limit", "dependency", "middleware", "install"],
)
def test_an_exempt_when_without_the_request_is_refused_when_the_rule_is_made(
    make: Callable[[RateLimiter, object], object],
) -> None:
    # slowapi's exempt_when takes no argument; here it used to turn every request into a 503.
    with pytest.raises(RateLimitConfigError) as refused:
        make(_limiter_for_callbacks(), lambda: True)
    assert type(refused.value) is RateLimitConfigError
    assert str(refused.value) == (
        "exempt_when must be a callable of the request, exempt_when(request) -> bool "
        "(sync or async); <lambda> takes () (slowapi's exempt_when takes no argument; "
        "write lambda request: ...)"
    )
    with pytest.raises(RateLimitConfigError) as refused:
        make(_limiter_for_callbacks(), _two_arguments)
    assert str(refused.value) == (
        "exempt_when must be a callable of the request, exempt_when(request) -> bool "
        "(sync or async); _two_arguments takes (request: 'object', response: 'object') -> 'bool'"
    )


@pytest.mark.parametrize(
    ("option", "returns"),
    [("key", "str or bytes"), ("tenant", "str or None"), ("cost", "int"), ("rate", "str")],
)
def test_every_request_callback_is_checked_for_the_request_argument(
    option: str, returns: str
) -> None:
    limiter = _limiter_for_callbacks()
    expected = (
        f"{option} must be a callable of the request, {option}(request) -> {returns} "
        "(sync or async); <lambda> takes ()"
    )
    with pytest.raises(RateLimitConfigError) as refused:
        if option == "rate":
            limiter.limit(lambda: "5/minute")  # type: ignore[arg-type]
        else:
            limiter.limit("5/minute", **{option: lambda: "x"})
    assert str(refused.value) == expected
    if option != "rate":  # the limiter's and install()'s defaults, checked the same way
        with pytest.raises(RateLimitConfigError) as refused:
            RateLimiter("memory://", **{option: lambda: "x"})
        assert str(refused.value) == expected
        with pytest.raises(RateLimitConfigError) as refused:
            install(FastAPI(), _limiter_for_callbacks(), **{option: lambda: "x"})
        assert str(refused.value) == expected


def test_a_middleware_exempt_predicate_without_the_request_is_refused() -> None:
    with pytest.raises(RateLimitConfigError) as refused:
        RateLimitMiddleware(
            Starlette(), limiter=_limiter_for_callbacks(), rate="5/minute", exempt=[lambda: True]
        )
    assert str(refused.value) == (
        "exempt must be a callable of the request, exempt(request) -> bool (sync or async); "
        "<lambda> takes ()"
    )


class _Internal:
    """A callable object: its __call__ takes the request."""

    def __call__(self, request: Request) -> bool:
        return request.headers.get("x-internal") == "1"


async def _async_internal(request: Request, *, unused: int = 0) -> bool:
    return request.headers.get("x-internal") == "1"


@pytest.mark.parametrize(
    "exempt_when",
    [
        lambda request: request.headers.get("x-internal") == "1",
        lambda *args: args[0].headers.get("x-internal") == "1",
        _Internal(),
        _async_internal,
        functools.partial(lambda flag, request: request.headers.get(flag) == "1", "x-internal"),
    ],
    ids=["lambda", "varargs", "callable-object", "async-with-keyword-default", "partial"],
)
async def test_an_exempt_when_of_the_request_is_accepted_and_charges_nothing(
    exempt_when: Callable[[Request], bool],
) -> None:
    limiter = _limiter_for_callbacks()
    limiter.backend.clock = lambda: 1_800_000_000_000  # type: ignore[attr-defined]
    app = FastAPI()
    install(app, limiter)

    @app.get("/export")
    @limiter.limit("2/minute", exempt_when=exempt_when)
    async def export() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        internal = [
            (await http.get("/export", headers={"x-internal": "1"})).status_code for _ in range(4)
        ]
        public = [(await http.get("/export")).status_code for _ in range(3)]
    assert internal == [200] * 4
    assert public == [200, 200, 429]  # the exempt requests were not charged


# -- key_prefix and identity_secret --------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"key_prefix": "my app"},
            "key_prefix (the start of every key) may only hold A-Z a-z 0-9 _ . : -, "
            "got 'my app' (byte 2 is not allowed)",
        ),
        (
            {"key_prefix": ""},
            "key_prefix (the start of every key) must be 1 to 128 bytes of "
            "A-Z a-z 0-9 _ . : -, got '' (0 bytes)",
        ),
        (
            {"key_prefix": None},
            "key_prefix (the start of every key) must be str or bytes, not NoneType",
        ),
        ({"identity_secret": "secret"}, "identity_secret must be bytes or None, not str"),
        (
            {"identity_secret": b"short"},
            "identity_secret must be at least 16 bytes long, got 5 bytes",
        ),
    ],
)
def test_key_prefix_and_identity_secret_errors_name_the_option(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(RateLimitConfigError) as refused:
        RateLimiter("memory://", **options)  # type: ignore[arg-type]
    assert str(refused.value) == message
    assert "build_keys" not in message


# -- a window no limit of the algorithm fits ----------------------------------------------

GCRA_YEAR = (
    "rate '2/year': a window of 31104000 seconds is too long for gcra, whose exact range "
    "ends at windows of 3599627 seconds (41.6 days); shorten the window or choose another "
    "algorithm"
)


async def test_a_window_too_long_for_gcra_says_so_and_gives_the_longest() -> None:
    limiter = _limiter_for_callbacks()
    with pytest.raises(RateLimitConfigError) as refused:
        limiter.limit("2/year", algorithm="gcra")
    assert str(refused.value) == GCRA_YEAR
    assert "lower the limit" not in str(refused.value)
    with pytest.raises(RateLimitConfigError) as refused:
        await limiter.check("k", "2/year", algorithm="gcra")
    assert str(refused.value) == GCRA_YEAR
    # The longest window it names is accepted, one second more is not.
    assert await limiter.check("k", "2/3599627 seconds", algorithm="gcra")
    with pytest.raises(RateLimitConfigError, match="too long for gcra"):
        await limiter.check("k", "2/3599628 seconds", algorithm="gcra")
    # A limit that could fit over a shorter window still says to lower it.
    with pytest.raises(RateLimitConfigError, match="is 289, got 290; lower the limit"):
        limiter.limit("290/year", algorithm="token_bucket")
