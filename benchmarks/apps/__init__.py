"""One small FastAPI app per contender for the end-to-end benchmark.

Every module builds the same app: ``GET /allowed`` under a rate no run can
exhaust (every request is admitted, so the limiter's whole allowed path is
measured), ``GET /limited`` under one request per hour (after the warm-up
request, every request is denied), and ``GET /health`` with no limit (the
harness's readiness probe). Each endpoint returns the same small JSON body.

The harness serves each module with uvicorn (one process) and points it at
its Redis with ``MODERATO_BENCH_REDIS_URL``. Identity is the client address
everywhere, so all of the load generator's requests share one quota.
"""

from __future__ import annotations

import os

ALLOWED_RATE = "1000000/minute"
LIMITED_RATE = "1/hour"
BODY = {"ok": True}

APPS = {
    "no limiter": "baseline",
    "floor, moderato client": "floor_moderato_client",
    "floor, redis-py": "floor_redis_py",
    "moderato decorator": "moderato_decorator",
    "moderato dependency": "moderato_dependency",
    "moderato middleware": "moderato_middleware",
    "slowapi": "slowapi_app",
    "fastapi-limiter": "fastapi_limiter_app",
}
"""Display name -> module under benchmarks.apps, in the order results are shown."""

FLOORS = ("floor, moderato client", "floor, redis-py")
"""The bare app plus one trivial script call per request (apps/_floor.py): the
least any exact limiter asking Redis per request can cost. Allowed path only."""


def redis_url() -> str:
    return os.environ.get("MODERATO_BENCH_REDIS_URL", "redis://127.0.0.1:6379")


def moderato_url() -> str:
    """The URL moderato's apps use: redis_url(), with batched decisions turned on when
    MODERATO_BENCH_BATCH_DECISIONS=1 (performance.py --batch-decisions; off by default, as
    in the library). The peers and the redis-py floor take redis_url() as it is."""
    url = redis_url()
    if os.environ.get("MODERATO_BENCH_BATCH_DECISIONS") != "1":
        return url
    return url + ("&" if "?" in url else "?") + "batch_decisions=true"


def timeouts() -> dict[str, float]:
    """moderato's Redis timeouts: the library's defaults, unless MODERATO_BENCH_TIMEOUT_S is set
    (benchmarks/app_cpu.py sets it under callgrind, which runs the app 50 times slower)."""
    if "MODERATO_BENCH_TIMEOUT_S" not in os.environ:
        return {}
    timeout_s = float(os.environ["MODERATO_BENCH_TIMEOUT_S"])
    return {"connect_timeout_s": timeout_s, "command_timeout_s": timeout_s}


def denial_cache() -> dict[str, int]:
    """moderato's denial cache, which is opt-in: on (10,000 identities) for the end-to-end apps,
    so the limited path measures a flood answered locally; MODERATO_BENCH_DENIAL_CACHE_SIZE=0
    measures every denial going to Redis instead."""
    return {"denial_cache_size": int(os.environ.get("MODERATO_BENCH_DENIAL_CACHE_SIZE", "10000"))}


def algorithm() -> str:
    """moderato's algorithm for the end-to-end apps (the library default unless set)."""
    return os.environ.get("MODERATO_BENCH_ALGORITHM", "fixed_window")
