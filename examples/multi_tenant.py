"""Tiered quotas for a multi-tenant API: free, premium and enterprise keys, isolated per tier.

    make demo-env && . .venv-demo/bin/activate     # once: moderato built in place, FastAPI, uvicorn
    uvicorn examples.multi_tenant:app --port 8001
    MODERATO_REDIS_URL=memory:// uvicorn examples.multi_tenant:app --port 8001

    curl -H 'X-API-Key: free-key-alice' localhost:8001/api/data      # 10 a minute
    curl -H 'X-API-Key: premium-key-carol' localhost:8001/api/data   # 100 a minute
    curl -H 'X-API-Key: free-key-alice' localhost:8001/api/usage
    curl -X POST -H 'X-Admin-Key: admin-demo-key' localhost:8001/api/admin/keys/free-key-alice/reset

How it is put together:

- every API key belongs to a tier; the tier picks the rate (``TIERS``) and is
  the tenant, so each tier's counters live in their own key space: a key
  moved to another tier starts with that tier's full quota, and its old
  tier's counters are kept for when it comes back;
- the key itself is the identity, stored in Redis only as an HMAC
  (``identity_secret``), never in clear;
- unknown or missing keys are refused (401) before any quota is touched;
- admin endpoints need the ``X-Admin-Key`` header.

The keys below are public demo keys and the admin key defaults to a public
value too: this is a demo, not a deployment (set MODERATO_ADMIN_KEY).
"""

from __future__ import annotations

import hmac
import logging
import os
from typing import Any, Optional

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from moderato import BackendError, RateLimiter, install

try:  # `uvicorn examples.multi_tenant:app`, from the repository's root
    from examples.backend_choice import backend_url
except ModuleNotFoundError:  # `python examples/<name>.py`: its own folder is on the path
    from backend_choice import backend_url

logger = logging.getLogger("moderato.demo")

ADMIN_KEY = os.environ.get("MODERATO_ADMIN_KEY", "admin-demo-key")
# Keyed hashing of identities; set your own secret (16 bytes or more) in a deployment.
IDENTITY_SECRET = os.environ.get("MODERATO_IDENTITY_SECRET", "demo-identity-secret").encode()

TIERS = {
    "free": "10/minute",
    "premium": "100/minute",
    "enterprise": "1000/minute",
}
ALGORITHM = "token_bucket"  # a steady refill per tier rather than a hard reset each minute
SCOPE = "tenant-api"
"""One explicit scope for every tiered route: usage and reset find the bucket by it."""

DEMO_KEYS = {
    "free-key-alice": "free",
    "free-key-bob": "free",
    "premium-key-carol": "premium",
    "enterprise-key-dave": "enterprise",
}


class TierChange(BaseModel):
    tier: str


def create_app(redis_url: Optional[str] = None) -> FastAPI:
    """The tenant API on ``redis_url`` (default: as examples/backend_choice.py chooses:
    MODERATO_REDIS_URL, else the Redis on localhost:6379 if one answers, else memory://)."""
    url = redis_url or backend_url("multi_tenant")
    limiter = RateLimiter(url, key_prefix="moderato-tenants", identity_secret=IDENTITY_SECRET)
    accounts = dict(DEMO_KEYS)  # api key -> tier; a real service keeps this in its database

    app = FastAPI(title="moderato multi-tenant demo")
    app.state.limiter = limiter
    app.state.accounts = accounts
    # Headers and 429 answers, connect/close with the app (starting even while
    # the backend is down), the decorator-order check.
    install(app, limiter, require_backend=False)

    def tier_of(request: Request) -> str:
        return accounts[request.headers["x-api-key"]]

    async def authenticate(x_api_key: Optional[str] = Header(default=None)) -> str:
        """Runs before the limit: only known keys get (and spend) a quota."""
        if x_api_key is None or x_api_key not in accounts:
            raise HTTPException(401, "send a valid X-API-Key header")
        return x_api_key

    async def require_admin(x_admin_key: str = Header(default="")) -> None:
        if not hmac.compare_digest(x_admin_key.encode(), ADMIN_KEY.encode()):
            raise HTTPException(403, "admin key required")

    def known_key(api_key: str) -> str:
        if api_key not in accounts:
            raise HTTPException(404, f"unknown API key {api_key!r}")
        return accounts[api_key]

    @app.get("/api/data", dependencies=[Depends(authenticate)])
    @limiter.limit(
        lambda request: TIERS[tier_of(request)],
        key=lambda request: request.headers["x-api-key"],
        tenant=tier_of,
        algorithm=ALGORITHM,
        scope=SCOPE,
    )
    async def data(request: Request) -> dict[str, Any]:
        return {"tier": tier_of(request), "data": ["north", "south", "east", "west"]}

    @app.get("/api/usage")
    async def usage(api_key: str = Depends(authenticate)) -> dict[str, Any]:
        """The caller's quota (a snapshot: nothing is charged)."""
        tier = accounts[api_key]
        snapshot = await limiter.get_usage(
            api_key, TIERS[tier], tenant_type=tier, scope=SCOPE, algorithm=ALGORITHM
        )
        return {"tier": tier, **snapshot}

    @app.get("/api/tiers")
    async def tiers() -> dict[str, str]:
        return TIERS

    @app.post("/api/admin/keys/{api_key}/reset", dependencies=[Depends(require_admin)])
    async def reset_key(api_key: str) -> dict[str, Any]:
        tier = known_key(api_key)
        deleted = await limiter.reset(
            api_key, rate=TIERS[tier], tenant_type=tier, scope=SCOPE, algorithm=ALGORITHM
        )
        return {"api_key": api_key, "tier": tier, "deleted": deleted}

    @app.put("/api/admin/keys/{api_key}/tier", dependencies=[Depends(require_admin)])
    async def change_tier(api_key: str, change: TierChange) -> dict[str, str]:
        known_key(api_key)
        if change.tier not in TIERS:
            raise HTTPException(422, f"tier must be one of {', '.join(TIERS)}")
        accounts[api_key] = change.tier
        return {"api_key": api_key, "tier": change.tier}

    @app.get("/api/status")
    async def status() -> JSONResponse:
        backend = "memory" if url.startswith("memory://") else "redis"
        try:
            await limiter.get_usage("status-probe", "1/second", scope="status")
            backend_ok = True
        except BackendError:
            backend_ok = False
        body = {
            "status": "ok" if backend_ok else "unavailable",
            "backend": backend,
            "redis_connected": backend == "redis" and backend_ok,
        }
        return JSONResponse(body, status_code=200 if backend_ok else 503)

    return app


app = create_app()
