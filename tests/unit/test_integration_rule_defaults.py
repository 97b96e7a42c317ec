"""Identity, tenant and cost set once (on the limiter or through install()), and exempt_when."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from http_helpers import client

from moderato import RateLimitConfigError, RateLimiter, install


def by_user(request: Request) -> str:
    return "user:" + request.headers.get("x-user", "anonymous")


async def statuses(app: Any, path: str, count: int, **headers: str) -> list[int]:
    """The statuses of ``count`` GETs; ``x_user="ann"`` sends the header ``x-user: ann``."""
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    async with client(app, headers=sent) as http:
        return [(await http.get(path)).status_code for _ in range(count)]


def counted_app(limiter: RateLimiter, **install_options: Any) -> FastAPI:
    app = FastAPI()
    install(app, limiter, **install_options)

    @app.get("/default")
    @limiter.limit("2/minute")
    async def default() -> dict[str, str]:
        return {}

    @app.get("/own-key")
    @limiter.limit("2/minute", key="everyone")
    async def own_key() -> dict[str, str]:
        return {}

    @app.get("/dependency", dependencies=[Depends(limiter.dependency("3/minute"))])
    async def dependency() -> dict[str, str]:
        return {}

    return app


async def test_limiter_key_is_every_rules_default_and_a_rule_key_overrides_it() -> None:
    limiter = RateLimiter("memory://", key=by_user)
    app = counted_app(limiter)
    # One peer address, two users: each user has a quota of its own.
    assert await statuses(app, "/default", 3, x_user="ann") == [200, 200, 429]
    assert await statuses(app, "/default", 3, x_user="bob") == [200, 200, 429]
    assert await statuses(app, "/dependency", 4, x_user="ann") == [200, 200, 200, 429]
    usage = await limiter.get_usage("user:ann", "2/minute", scope="GET:/default")
    assert usage["current"] == 2
    # key="everyone" on the rule wins over the limiter's default.
    assert await statuses(app, "/own-key", 1, x_user="ann") == [200]
    assert await statuses(app, "/own-key", 2, x_user="bob") == [200, 429]


async def test_install_sets_the_default_key_after_decoration() -> None:
    limiter = RateLimiter("memory://")
    app = counted_app(limiter, key=by_user)
    assert limiter.key is by_user
    assert await statuses(app, "/default", 3, x_user="ann") == [200, 200, 429]
    assert await statuses(app, "/default", 3, x_user="bob") == [200, 200, 429]


async def test_install_key_applies_to_the_app_wide_limit() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter, rate="2/minute", key=by_user)

    @app.get("/page")
    async def page() -> dict[str, str]:
        return {}

    assert await statuses(app, "/page", 3, x_user="ann") == [200, 200, 429]
    assert await statuses(app, "/page", 3, x_user="bob") == [200, 200, 429]


async def test_default_tenant_and_cost() -> None:
    async def tenant(request: Request) -> str:  # async callbacks work as defaults too
        return request.headers.get("x-plan", "free")

    limiter = RateLimiter("memory://", tenant=tenant, cost=2)
    app = FastAPI()
    install(app, limiter)

    @app.get("/search")
    @limiter.limit("5/minute")
    async def search() -> dict[str, str]:
        return {}

    @app.get("/cheap")
    @limiter.limit("5/minute", cost=1)
    async def cheap() -> dict[str, str]:
        return {}

    # Cost 2 against 5/minute: two admitted per tenant bucket, then 429.
    assert await statuses(app, "/search", 3) == [200, 200, 429]
    assert await statuses(app, "/search", 3, x_plan="pro") == [200, 200, 429]
    assert await statuses(app, "/cheap", 6) == [200] * 5 + [429]
    usage = await limiter.get_usage("127.0.0.1", "5/minute", tenant_type="pro", scope="GET:/search")
    assert (usage["current"], usage["remaining"]) == (4, 1)


def test_bad_defaults_and_conflicts_are_config_errors() -> None:
    with pytest.raises(RateLimitConfigError, match="key must be a string or a callable"):
        RateLimiter("memory://", key=42)  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError, match="tenant must be a string or a callable"):
        RateLimiter("memory://", tenant=b"pro")  # type: ignore[arg-type]
    with pytest.raises(RateLimitConfigError):
        RateLimiter("memory://", cost=0)
    limiter = RateLimiter("memory://", key=by_user)
    with pytest.raises(RateLimitConfigError, match="install\\(\\) key= conflicts"):
        install(FastAPI(), limiter, key=lambda request: "other")
    with pytest.raises(RateLimitConfigError, match="exempt_when must be a callable"):
        limiter.limit("1/minute", exempt_when=True)  # type: ignore[arg-type]


async def test_exempt_when_on_decorator_dependency_and_middleware() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()

    def is_admin(request: Request) -> bool:
        return request.headers.get("x-role") == "admin"

    async def is_admin_async(request: Request) -> bool:
        return request.headers.get("x-role") == "admin"

    install(app, limiter, rate="4/minute", scope="app", exempt_when=is_admin)

    @app.get("/decorated")
    @limiter.limit("1/minute", exempt_when=is_admin_async)
    async def decorated() -> dict[str, str]:
        return {}

    guard = Depends(limiter.dependency("1/minute", exempt_when=is_admin))

    @app.get("/dependency", dependencies=[guard])
    async def dependency() -> dict[str, str]:
        return {}

    # Admins skip all three rules: nothing is charged for them.
    assert await statuses(app, "/decorated", 5, x_role="admin") == [200] * 5
    assert await statuses(app, "/dependency", 5, x_role="admin") == [200] * 5
    usage = await limiter.get_usage("127.0.0.1", "4/minute", scope="app")
    assert usage["current"] == 0
    # Everyone else: the route rule admits one, the app-wide rule four in all.
    assert await statuses(app, "/decorated", 2) == [200, 429]
    assert await statuses(app, "/dependency", 2) == [200, 429]
    assert await statuses(app, "/decorated", 1) == [429]  # the app-wide 4/minute is spent


async def test_exempt_when_that_fails_is_a_503_naming_it() -> None:
    limiter = RateLimiter("memory://")
    app = FastAPI()
    install(app, limiter)

    @app.get("/broken")
    @limiter.limit("5/minute", exempt_when=lambda request: "yes")
    async def broken() -> dict[str, str]:
        return {}

    async with client(app) as http:
        response = await http.get("/broken")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit callback failed", "callback": "exempt_when"}


async def test_a_default_cost_above_a_rules_capacity_is_a_422() -> None:
    limiter = RateLimiter("memory://", cost=10)
    app = FastAPI()
    install(app, limiter)

    @app.get("/small")
    @limiter.limit("5/minute")  # accepted at decoration: the default may change until startup
    async def small() -> dict[str, str]:
        return {}

    async with client(app) as http:
        response = await http.get("/small")
    assert response.status_code == 422
    assert response.json() == {"error": "Rate limit exceeded", "retry_after": None, "limit": 5}
