"""Shadow mode at the HTTP layer: a decorator, a dependency or a middleware that observes only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from fastapi import Depends, FastAPI
from http_helpers import client
from prometheus_client import CollectorRegistry
from redis_servers import PATIENT_TIMEOUT_S

from moderato import RateLimiter
from moderato.integrations import RateLimitHeadersMiddleware, RateLimitMiddleware


def shadow_denials(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value(
        "moderato_checks_total", {"algorithm": "fixed_window", "result": "shadow_denied"}
    )
    return value or 0.0


@pytest.fixture
async def observed(redis_url: str) -> AsyncIterator[tuple[RateLimiter, CollectorRegistry]]:
    registry = CollectorRegistry()
    limiter = RateLimiter(
        redis_url,
        key_prefix="shadow",
        enable_metrics=True,
        metrics_registry=registry,
        command_timeout_s=PATIENT_TIMEOUT_S,
    )
    yield limiter, registry
    await limiter.close()


async def test_shadow_decorator_and_dependency_never_deny(
    observed: tuple[RateLimiter, CollectorRegistry],
) -> None:
    limiter, registry = observed
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/decorated")
    @limiter.limit("2/minute", shadow=True)
    async def decorated() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/dependent", dependencies=[Depends(limiter.dependency("2/minute", shadow=True))])
    async def dependent() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/enforced")
    @limiter.limit("2/minute")
    async def enforced() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        decorated_codes = [(await http.get("/decorated")).status_code for _ in range(4)]
        dependent = [await http.get("/dependent") for _ in range(4)]
        enforced_codes = [(await http.get("/enforced")).status_code for _ in range(4)]
    assert decorated_codes == [200, 200, 200, 200]
    assert [r.status_code for r in dependent] == [200, 200, 200, 200]
    # The headers still tell the truth about the quota; there is no Retry-After on a 200.
    assert [r.headers["x-ratelimit-remaining"] for r in dependent] == ["1", "0", "0", "0"]
    assert all("retry-after" not in r.headers for r in dependent)
    assert enforced_codes == [200, 200, 429, 429]
    assert shadow_denials(registry) == 4


async def test_shadow_middleware_lets_everything_through(
    observed: tuple[RateLimiter, CollectorRegistry],
) -> None:
    limiter, registry = observed
    app = FastAPI()

    @app.get("/api")
    async def api() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(RateLimitMiddleware, limiter=limiter, rate="3/minute", shadow=True)
    async with client(app) as http:
        codes = [(await http.get("/api")).status_code for _ in range(5)]
    assert codes == [200] * 5
    assert shadow_denials(registry) == 2
    usage = await limiter.get_usage("127.0.0.1", "3/minute", scope="app")
    assert (usage["current"], usage["remaining"]) == (3, 0)


async def test_enforcing_one_route_of_a_shadow_limiter(redis_url: str) -> None:
    limiter = RateLimiter(redis_url, key_prefix="shadow2", shadow=True)
    app = FastAPI()
    app.add_middleware(RateLimitHeadersMiddleware)

    @app.get("/strict")
    @limiter.limit("1/minute", shadow=False)
    async def strict() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/observed")
    @limiter.limit("1/minute")
    async def observed_route() -> dict[str, bool]:
        return {"ok": True}

    async with client(app) as http:
        strict_codes = [(await http.get("/strict")).status_code for _ in range(2)]
        observed_codes = [(await http.get("/observed")).status_code for _ in range(2)]
    assert strict_codes == [200, 429]
    assert observed_codes == [200, 200]
    await limiter.close()
