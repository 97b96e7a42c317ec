"""Failures that explain themselves, without flooding the log.

A failing callback: its traceback once per (callback, exception type), then
summaries. A backend outage: its first failure at once, then at most one
summary per interval, and one line when the backend answers again; metrics
count every event.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from http_helpers import client
from prometheus_client import CollectorRegistry
from redis_servers import RedisServer

from moderato import BackendError, RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, callbacks

CALLBACK_FAILED = {"error": "Rate limit callback failed", "callback": "key"}


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def callback_clock() -> Iterator[FakeClock]:
    clock = FakeClock()
    log = callbacks.failure_log
    log.clear()
    saved = log.clock
    log.clock = clock
    try:
        yield clock
    finally:
        log.clock = saved
        log.clear()


def records(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == name]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- item 7: a failing callback ------------------------------------------------------


def header_key(request: Request) -> str:
    value = request.headers["X-Key"]  # KeyError when the client sent none
    if value == "bad":
        raise ValueError("malformed key")
    return value


def refusing_key(request: Request) -> str:
    raise HTTPException(status_code=401, detail="no key")


def limited_app(**options: object) -> FastAPI:
    """An app whose /data is limited (2/minute, memory://) with ``options`` for the decorator."""
    limiter = RateLimiter("memory://", key_prefix="cb")
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/data")
    @limiter.limit("2/minute", **options)  # type: ignore[arg-type]
    async def data(request: Request) -> dict[str, bool]:
        return {"ok": True}

    return app


async def test_a_failing_key_callback_logs_its_traceback_once_then_summaries(
    caplog: pytest.LogCaptureFixture, callback_clock: FakeClock
) -> None:
    app = limited_app(key=header_key)

    name = f"{__name__}.header_key"
    with caplog.at_level(logging.DEBUG, logger="moderato"):
        async with client(app) as http:
            for _ in range(5):
                response = await http.get("/data")
                assert (response.status_code, response.json()) == (503, CALLBACK_FAILED)
            logged = records(caplog, "moderato.callbacks")
            assert len(logged) == 1
            first = logged[0]
            assert first.levelno == logging.ERROR
            assert first.getMessage() == (
                f"moderato: the key callback {name} raised KeyError; the request was "
                "refused (RateLimitCallbackError, 503). Repeats are summarised at most every 10 s"
            )
            assert first.exc_info is not None and first.exc_info[0] is KeyError
            traceback_text = logging.Formatter().formatException(first.exc_info)
            assert 'request.headers["X-Key"]' in traceback_text
            assert "KeyError: 'X-Key'" in traceback_text

            # Another cause of the same callback: its own traceback.
            response = await http.get("/data", headers={"X-Key": "bad"})
            assert (response.status_code, response.json()) == (503, CALLBACK_FAILED)
            logged = records(caplog, "moderato.callbacks")
            assert len(logged) == 2 and logged[1].exc_info is not None
            assert logged[1].exc_info[0] is ValueError

            # Within the interval repeats are only counted; past it, one summary.
            callback_clock.now_s += 9.9
            assert (await http.get("/data")).status_code == 503
            assert len(records(caplog, "moderato.callbacks")) == 2
            callback_clock.now_s += 0.1
            assert (await http.get("/data")).status_code == 503
            logged = records(caplog, "moderato.callbacks")
            assert len(logged) == 3
            assert logged[2].getMessage() == (
                "moderato: callback failures since the last report: "
                f"6 x key callback {name} raised KeyError"
            )
            assert logged[2].exc_info is None
            for _ in range(20):
                assert (await http.get("/data")).status_code == 503
            assert len(records(caplog, "moderato.callbacks")) == 3
            callback_clock.now_s += 10
            await http.get("/data", headers={"X-Key": "bad"})
            logged = records(caplog, "moderato.callbacks")
            assert len(logged) == 4
            assert logged[3].getMessage() == (
                "moderato: callback failures since the last report: "
                f"20 x key callback {name} raised KeyError; "
                f"1 x key callback {name} raised ValueError"
            )
            # A good key is decided as usual.
            response = await http.get("/data", headers={"X-Key": "alice"})
            assert (response.status_code, response.json()) == (200, {"ok": True})


async def test_a_callback_returning_the_wrong_type_is_logged_too(
    caplog: pytest.LogCaptureFixture, callback_clock: FakeClock
) -> None:
    app = limited_app(cost=lambda request: "3")

    with caplog.at_level(logging.DEBUG, logger="moderato"):
        async with client(app) as http:
            response = await http.get("/data")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": "cost"}
    logged = records(caplog, "moderato.callbacks")
    assert len(logged) == 1
    assert (
        logged[0]
        .getMessage()
        .startswith("moderato: the cost callback (its return value) raised TypeError;")
    )
    assert logged[0].exc_info is not None
    assert "cost must be a positive integer" in str(logged[0].exc_info[1])


async def test_an_http_exception_in_a_key_callback_fails_closed_as_the_spec_says(
    caplog: pytest.LogCaptureFixture, callback_clock: FakeClock
) -> None:
    # The seed spec: a callback's exception raises RateLimitCallbackError (503).
    app = limited_app(key=refusing_key)

    with caplog.at_level(logging.DEBUG, logger="moderato"):
        async with client(app) as http:
            response = await http.get("/data")
    assert (response.status_code, response.json()) == (503, CALLBACK_FAILED)
    assert len(records(caplog, "moderato.callbacks")) == 1


async def test_a_validating_dependency_answers_4xx_before_the_limiter_runs(
    caplog: pytest.LogCaptureFixture, callback_clock: FakeClock
) -> None:
    # docs/http.md's pattern: validate the client's input in a dependency.
    limiter = RateLimiter("memory://", key_prefix="cb")
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    def require_key(request: Request) -> None:
        if request.headers.get("X-Key", "") in ("", "bad"):
            raise HTTPException(status_code=401, detail="a valid X-Key header is required")

    @app.get("/data", dependencies=[Depends(require_key)])
    @limiter.limit("2/minute", key=header_key)
    async def data(request: Request) -> dict[str, bool]:
        return {"ok": True}

    with caplog.at_level(logging.DEBUG, logger="moderato"):
        async with client(app) as http:
            for headers in ({}, {"X-Key": "bad"}, {}):
                response = await http.get("/data", headers=headers)
                assert response.status_code == 401
                assert response.json() == {"detail": "a valid X-Key header is required"}
            statuses = [(await http.get("/data", headers={"X-Key": "k"})).status_code]
            statuses += [(await http.get("/data", headers={"X-Key": "k"})).status_code]
            statuses += [(await http.get("/data", headers={"X-Key": "k"})).status_code]
    assert statuses == [200, 200, 429]
    assert records(caplog, "moderato.callbacks") == []


# -- item 8: a backend outage ----------------------------------------------------------


async def test_an_outage_is_logged_at_once_then_summarised(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="out",
        enable_metrics=True,
        metrics_registry=registry,
        breaker_failures=5,
        breaker_cooldown_s=3600,  # after 5 errors, every check is refused by the breaker
    )
    clock = FakeClock()
    limiter.failure_log.clock = clock
    assert await limiter.check("k", "100/minute")
    own_redis_server.stop()
    with caplog.at_level(logging.DEBUG, logger="moderato"):
        for _ in range(30):
            with pytest.raises(BackendError):
                await limiter.check("k", "100/minute")
            clock.now_s += 1
    logged = records(caplog, "moderato.backend")
    messages = [record.getMessage() for record in logged]
    assert len(messages) == 3, messages
    assert all(record.levelno == logging.WARNING for record in logged)
    assert re.fullmatch(
        r"moderato: the backend could not decide \(BackendUnavailableError: .+\), "
        r"failing closed: checks raise BackendError \(503 over HTTP\); further failures "
        r"are summarised at most every 10 s",
        messages[0],
    ), messages[0]
    # Checks 0..10 (the first five reached Redis), then 11..20.
    assert re.fullmatch(
        r"moderato: the backend is still failing after 10\.0 s; since the last report: "
        r"0 bypassed, 11 denied, 5 errors; last error: BackendUnavailableError: .+",
        messages[1],
    ), messages[1]
    assert messages[2].startswith(
        "moderato: the backend is still failing after 20.0 s; since the last report: "
        "0 bypassed, 10 denied, 0 errors; last error: BackendUnavailableError: backend "
        "circuit breaker is open"
    ), messages[2]
    # Metrics count every one of the 30.
    assert sample(registry, "moderato_checks_total", algorithm="fixed_window", result="error") == 30
    operations = "moderato_backend_operations_total"
    assert sample(registry, operations, operation="decide", status="error") == 5
    assert sample(registry, operations, operation="decide", status="short_circuited") == 25
    await limiter.close()


@pytest.mark.parametrize("fail_open", [True, False])
async def test_an_outage_and_its_recovery_are_two_lines(
    own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture, fail_open: bool
) -> None:
    registry = CollectorRegistry()
    limiter = RateLimiter(
        own_redis_server.url,
        key_prefix="out",
        fail_open=fail_open,
        enable_metrics=True,
        metrics_registry=registry,
        failure_log_interval_s=60,
    )
    assert await limiter.check("k", "1000/minute")
    own_redis_server.stop()
    checks = 40
    with caplog.at_level(logging.DEBUG, logger="moderato"):
        for _ in range(checks):
            try:
                result = await limiter.check_with_info("k", "1000/minute")
                assert fail_open and result.bypassed
            except BackendError:
                assert not fail_open
        own_redis_server.start()
        attempts = 0
        deadline = time.monotonic() + 5
        while True:  # the breaker's probe finds the server back
            attempts += 1
            try:
                result = await limiter.check_with_info("k", "1000/minute")
                if not result.bypassed:
                    break
            except BackendError:
                pass
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    failed = checks + attempts - 1
    outcome = "bypassed" if fail_open else "error"
    assert sample(registry, "moderato_checks_total", algorithm="fixed_window", result=outcome) == (
        failed
    )
    operations = "moderato_backend_operations_total"
    errors = sample(registry, operations, operation="decide", status="error")
    assert 5 <= errors < failed  # the open breaker kept most checks from Redis

    messages = [record.getMessage() for record in records(caplog, "moderato.backend")]
    assert len(messages) == 2, messages
    consequence = "failing open" if fail_open else "failing closed"
    assert messages[0].startswith("moderato: the backend could not decide (")
    assert consequence in messages[0]
    bypassed, denied = (failed, 0) if fail_open else (0, failed)
    assert re.fullmatch(
        r"moderato: the backend is answering again after \d+\.\d s of failures; since the "
        rf"last report: {bypassed} bypassed, {denied} denied, {int(errors)} errors",
        messages[1],
    ), messages[1]
    if fail_open:
        assert sample(registry, "moderato_fail_open_total", algorithm="fixed_window") == failed
    await limiter.close()
