"""Other libraries' keywords get an error naming the moderato equivalent (moderato/habits.py)."""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import pytest
from fastapi import FastAPI
from http_helpers import client
from starlette.applications import Starlette

from moderato import RateLimitConfigError, RateLimiter
from moderato.errors import UnknownOptionError
from moderato.habits import HABITS
from moderato.integrations import RateLimitMiddleware, install
from moderato.integrations.wiring import INSTALL_OPTIONS
from moderato.specs import MESSAGE_OPTIONS, RULE_OPTIONS


def memory_limiter() -> RateLimiter:
    return RateLimiter("memory://", key_prefix="habits")


def limit(limiter: RateLimiter, **options: Any) -> object:
    return limiter.limit("5/minute", **options)


def dependency(limiter: RateLimiter, **options: Any) -> object:
    return limiter.dependency("5/minute", **options)


def middleware(limiter: RateLimiter, **options: Any) -> object:
    return RateLimitMiddleware(Starlette(), limiter=limiter, rate="5/minute", **options)


def installed(limiter: RateLimiter, **options: Any) -> object:
    install(FastAPI(), limiter, rate="5/minute", **options)
    return None


ENTRY_POINTS: dict[str, Callable[..., object]] = {
    "limit()": limit,
    "dependency()": dependency,
    "RateLimitMiddleware()": middleware,
    "install()": installed,
}

# slowapi's per-rule keywords, each with the words of the advice that must be given.
SLOWAPI_RULE_HABITS = {
    "key_func": ("key_func= is slowapi's name", "moderato's is key="),
    "per_method": ("per_method= is slowapi's option", "each method on its own", "scope="),
    "methods": ("methods= is slowapi's option", "exempt_when=", "request.method"),
    "error_message": ("error_message= is slowapi's option", "exception handler"),
    "override_defaults": ("override_defaults= is slowapi's option", "every limit"),
    "limit_value": ("limit_value= is slowapi's name", "moderato's is rate="),
    "strategy": ("strategy= is slowapi's name", "algorithm=", "sliding_log (moving-window)"),
}


@pytest.mark.parametrize("where", ENTRY_POINTS)
@pytest.mark.parametrize("keyword", SLOWAPI_RULE_HABITS)
def test_a_slowapi_keyword_names_the_moderato_equivalent(where: str, keyword: str) -> None:
    with pytest.raises(UnknownOptionError) as refused:
        ENTRY_POINTS[where](memory_limiter(), **{keyword: "x"})
    message = str(refused.value)
    assert message.startswith(f"{where}: ")
    for words in SLOWAPI_RULE_HABITS[keyword]:
        assert words in message
    assert "LimitRule" not in message and "__init__" not in message


@pytest.mark.parametrize(
    ("keyword", "words"),
    [
        ("identifier", ("identifier= is fastapi-limiter's name", "moderato's is key=")),
        ("callback", ("callback= is fastapi-limiter's option", "RateLimitExceeded")),
        ("skip", ("skip= is fastapi-limiter's name", "moderato's is exempt_when=")),
        ("seconds", ("seconds= is fastapi-limiter's", 'times=2, seconds=5 is "2/5 seconds"')),
        ("deduct_when", ("deduct_when= is Flask-Limiter's option", "never charges a denied")),
        ("on_breach", ("on_breach= is Flask-Limiter's option", "RateLimitExceeded")),
    ],
)
def test_fastapi_limiter_and_flask_limiter_keywords_name_theirs(
    keyword: str, words: tuple[str, ...]
) -> None:
    for where, entry_point in ENTRY_POINTS.items():
        with pytest.raises(UnknownOptionError) as refused:
            entry_point(memory_limiter(), **{keyword: 1})
        assert str(refused.value).startswith(f"{where}: ")
        for each in words:
            assert each in str(refused.value)


def test_the_error_is_a_config_error_and_a_type_error() -> None:
    with pytest.raises(UnknownOptionError) as refused:
        memory_limiter().limit("5/minute", key_func=lambda request: "k")  # type: ignore[call-arg]
    assert isinstance(refused.value, RateLimitConfigError)
    assert isinstance(refused.value, TypeError)  # as Python's own answer would be


def test_a_message_limit_names_its_own_options() -> None:
    limiter = memory_limiter()
    with pytest.raises(UnknownOptionError) as refused:
        limiter.message_limit("5/minute", key_func=lambda websocket: "k")  # type: ignore[call-arg]
    assert str(refused.value).startswith("message_limit(): key_func= is slowapi's name")
    with pytest.raises(UnknownOptionError) as refused:
        limiter.message_limit("5/minute", exempt_when=lambda r: False)  # type: ignore[call-arg]
    assert str(refused.value) == (
        "message_limit() got an unexpected keyword argument exempt_when=; its options are "
        "algorithm, burst, cost, key, scope, shadow, tenant"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda limiter: limiter.limit("5/minute", tennant="gold"),
            "limit() got an unexpected keyword argument tennant= (did you mean tenant=?); "
            "its options are algorithm, burst, cost, exempt_when, key, scope, shadow, tenant",
        ),
        (
            lambda limiter: limiter.dependency("5/minute", algoritm="gcra"),
            "dependency() got an unexpected keyword argument algoritm= (did you mean "
            "algorithm=?); its options are algorithm, burst, cost, exempt_when, key, scope, "
            "shadow, tenant",
        ),
        (
            lambda limiter: install(FastAPI(), limiter, rate="5/minute", exempt_path=["/"]),
            "install() got an unexpected keyword argument exempt_path= (did you mean "
            "exempt_paths=?); its options are algorithm, api_key_header, burst, cost, costs, "
            "exempt, exempt_paths, exempt_when, headers, key, proxy_header, rate, "
            "require_backend, scope, shadow, tenant, trusted_proxies, websockets",
        ),
    ],
)
def test_a_misspelt_option_is_named_with_the_closest_one(
    call: Callable[[RateLimiter], object], message: str
) -> None:
    with pytest.raises(UnknownOptionError) as refused:
        call(memory_limiter())
    assert str(refused.value) == message


def test_install_names_a_habit_before_asking_for_a_rate() -> None:
    # Without rate=, install() used to answer that key_func configures an app-wide limit.
    with pytest.raises(UnknownOptionError) as refused:
        install(FastAPI(), memory_limiter(), key_func=lambda request: "k")
    assert str(refused.value).startswith("install(): key_func= is slowapi's name")
    with pytest.raises(UnknownOptionError) as refused:
        install(FastAPI(), memory_limiter(), application_limits=["3/minute"])
    assert 'install(app, limiter, rate="1000/minute")' in str(refused.value)


@pytest.mark.parametrize(
    ("keyword", "words"),
    [
        ("storage_uri", ("storage_uri= is slowapi's name", "redis_url, the first argument")),
        ("key_func", ("key_func= is slowapi's name", "moderato's is key=")),
        ("strategy", ("strategy= is slowapi's name", "default_algorithm=")),
        ("default_limits", ("default_limits= is slowapi's option", "limiter.dependency(")),
        ("application_limits", ("application_limits= is slowapi's option", "rate=")),
        ("headers_enabled", ("headers_enabled= is slowapi's option", "headers=")),
        ("swallow_errors", ("swallow_errors= is slowapi's name", "fail_open=True")),
        ("in_memory_fallback", ("in_memory_fallback= is slowapi's option", "fail_open=True")),
        ("enabled", ("enabled= is slowapi's option", "shadow=True", "docs/testing.md")),
        ("prefix", ("prefix= is fastapi-limiter's name", "key_prefix=")),
    ],
)
def test_a_limiter_keyword_from_slowapi_names_the_moderato_option(
    keyword: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(UnknownOptionError) as refused:
        RateLimiter("memory://", **{keyword: "x"})
    assert str(refused.value).startswith("RateLimiter(): ")
    for each in words:
        assert each in str(refused.value)


def test_other_unknown_limiter_keywords_keep_pythons_error_naming_rate_limiter() -> None:
    with pytest.raises(TypeError) as refused:
        RateLimiter("memory://", key_prefx="app")  # type: ignore[call-arg]
    assert type(refused.value) is TypeError
    # Python 3.9 names the function without its class ("__init__() got ...").
    assert "__init__() got an unexpected keyword argument 'key_prefx'" in str(refused.value)


def test_a_subclass_may_take_a_keyword_that_is_another_librarys() -> None:
    class PrefixedLimiter(RateLimiter):
        def __init__(self, url: str, *, prefix: str) -> None:
            super().__init__(url, key_prefix=prefix)

    assert PrefixedLimiter("memory://", prefix="app").key_prefix == "app"
    with pytest.raises(UnknownOptionError, match=r"^PrefixedLimiter\(\): storage_uri= is"):
        PrefixedLimiter("memory://", prefix="app", storage_uri="memory://")  # type: ignore[call-arg]


def test_every_habit_is_another_librarys_keyword_and_names_moderatos_real_one() -> None:
    limiter_options = set(inspect.signature(RateLimiter.__init__).parameters)
    every_option = limiter_options | INSTALL_OPTIONS | MESSAGE_OPTIONS | RULE_OPTIONS
    for keyword, advice in HABITS.items():
        assert keyword not in every_option, f"{keyword}= is moderato's own"
        assert advice.startswith(f"{keyword}= is "), keyword
        assert re.match(rf"{keyword}= is (slowapi|fastapi-limiter|Flask-Limiter)'s", advice), (
            keyword
        )
        # Every moderato keyword it recommends exists.
        for named in re.findall(r"moderato's is (\w+)=", advice):
            assert named in every_option, (keyword, named)


async def test_a_refused_keyword_leaves_a_working_limit_behind() -> None:
    limiter = memory_limiter()
    limiter.backend.clock = lambda: 1_800_000_000_000  # type: ignore[attr-defined]
    app = FastAPI()
    install(app, limiter)
    with pytest.raises(UnknownOptionError):
        limiter.limit("2/minute", per_method=True)  # type: ignore[call-arg]

    @app.get("/items")
    @limiter.limit("2/minute", scope="items")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        statuses = [(await http.get("/items")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


EVERY_ALGORITHM = (
    "'fixed_window', 'token_bucket', 'sliding_window', 'gcra', 'sliding_log', 'leaky_bucket'"
)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("moving-window", "limits' moving-window is moderato's 'sliding_log'"),
        ("fixed-window", "limits' fixed-window is moderato's 'fixed_window'"),
        ("sliding-window-counter", "limits' sliding-window-counter is moderato's 'sliding_window'"),
        ("token-bucket", "did you mean 'token_bucket'?"),
    ],
)
async def test_a_limits_strategy_name_names_the_moderato_algorithm(name: str, hint: str) -> None:
    expected = f"unknown algorithm '{name}' ({hint}); expected one of {EVERY_ALGORITHM}"
    limiter = memory_limiter()
    with pytest.raises(RateLimitConfigError) as refused:
        limiter.limit("5/minute", algorithm=name)
    assert str(refused.value) == expected
    with pytest.raises(RateLimitConfigError) as refused:
        await limiter.check("k", "5/minute", algorithm=name)
    assert str(refused.value) == expected
    with pytest.raises(RateLimitConfigError) as refused:
        RateLimiter("memory://", default_algorithm=name)
    assert str(refused.value) == expected
