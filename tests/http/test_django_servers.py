"""The example project (examples/django_app/) under real servers on one redis-server:
gunicorn with 4 sync workers (WSGI) and uvicorn with 2 workers (ASGI, async views), hit over
TCP by 200 concurrent requests from one client. Exact counts across every worker; DRF's own
AnonRateThrottle measured under the same load and reported beside moderato's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from django_support import skip_unsupported_python

skip_unsupported_python()

import httpx  # noqa: E402
from redis_servers import RedisServer, free_port, running  # noqa: E402
from uvicorn_helpers import wait_until_serving  # noqa: E402

from moderato.algorithms import ALGORITHMS  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_app"
TESTS = ROOT / "tests"
BURST = 200
GUNICORN_WORKERS = 4
UVICORN_WORKERS = 2


class Server:
    """One server process (gunicorn or uvicorn) serving the example project."""

    def __init__(self, name: str, command: list[str], redis_url: str, settings: str) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "MODERATO_REDIS_URL": redis_url,
            "DJANGO_SETTINGS_MODULE": settings,
            "PYTHONPATH": os.pathsep.join(
                [str(PROJECT), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        self.log_path = Path(f"/tmp/moderato-django-{name}-{self.port}.log")
        self.log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [part.replace("{port}", str(self.port)) for part in command],
            cwd=PROJECT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 90) -> None:
        wait_until_serving(
            self.base_url + "/healthz",
            self.process,
            self.output,
            timeout_s=timeout_s,
            poll_s=0.2,
            name=self.name,
        )

    def wait_exit(self, timeout_s: float = 90) -> int:
        return self.process.wait(timeout=timeout_s)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the master stops its workers
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()
        self.log_path.unlink(missing_ok=True)


def gunicorn(redis_url: str, settings: str = "django_app.settings") -> Server:
    command = [
        sys.executable, "-m", "gunicorn", "django_app.wsgi",
        "--workers", str(GUNICORN_WORKERS), "--worker-class", "sync",
        "--bind", "127.0.0.1:{port}", "--timeout", "60", "--graceful-timeout", "5",
    ]  # fmt: skip
    return Server("gunicorn", command, redis_url, settings)


def uvicorn(redis_url: str) -> Server:
    command = [
        sys.executable, "-m", "uvicorn", "django_app.asgi:application",
        "--host", "127.0.0.1", "--port", "{port}", "--workers", str(UVICORN_WORKERS),
        "--lifespan", "off", "--log-level", "warning",
        # uvicorn would otherwise rewrite the client from X-Forwarded-For itself (it
        # trusts 127.0.0.1 by default): moderato's own rules are under test.
        "--no-proxy-headers",
    ]  # fmt: skip
    return Server("uvicorn", command, redis_url, "django_app.settings")


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    yield from running(RedisServer())


@pytest.fixture(scope="module")
def servers(redis: RedisServer) -> Iterator[dict[str, Server]]:
    started = {"gunicorn": gunicorn(redis.url), "uvicorn": uvicorn(redis.url)}
    try:
        for server in started.values():
            server.wait_ready()
        # Every worker imports its views, connects and loads the scripts before the
        # measured bursts: a cold worker on this 2-core machine can take longer than
        # the command timeout on its first requests (fail closed: 503).
        for server in started.values():
            asyncio.run(burst(server.base_url, "/hello/", 40))
            asyncio.run(burst(server.base_url, "/hello-async/", 40))
        redis.command("FLUSHALL")
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def flushed(redis: RedisServer) -> None:
    redis.command("FLUSHALL")


async def burst(
    base_url: str, path: str, count: int = BURST, headers: Optional[list[dict[str, str]]] = None
) -> list[httpx.Response]:
    """``count`` requests at once from one client (the loopback address), each on its own
    connection."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as http:
        return await asyncio.gather(
            *(http.get(path, headers=headers[n] if headers else None) for n in range(count))
        )


def tally(responses: list[httpx.Response]) -> Counter[int]:
    return Counter(response.status_code for response in responses)


def workers(responses: list[httpx.Response]) -> set[str]:
    return {response.headers["X-Served-By"] for response in responses}


# -- exact under load, on each algorithm --------------------------------------------------


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_gunicorn_four_sync_workers_admit_exactly_ten(
    servers: dict[str, Server], flushed: None, algorithm: str
) -> None:
    responses = await burst(servers["gunicorn"].base_url, f"/ten/{algorithm}/")
    assert tally(responses) == {200: 10, 429: 190}
    assert len(workers(responses)) == GUNICORN_WORKERS  # every worker answered
    for response in responses:
        if response.status_code == 429:
            body = response.json()
            assert body["limit"] == 10 and body == {
                "error": "Rate limit exceeded",
                "retry_after": int(response.headers["Retry-After"]),
                "limit": 10,
            }
            assert response.headers["X-RateLimit-Remaining"] == "0"


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
async def test_uvicorn_async_views_admit_exactly_ten(
    servers: dict[str, Server], flushed: None, algorithm: str
) -> None:
    responses = await burst(servers["uvicorn"].base_url, f"/ten-async/{algorithm}/")
    assert tally(responses) == {200: 10, 429: 190}
    admitted = [r for r in responses if r.status_code == 200]
    assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(10))


async def test_drf_throttles_own_and_moderatos_under_the_same_load(
    servers: dict[str, Server], redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """DRF's own AnonRateThrottle (Django's cache, here the same Redis) beside moderato's,
    "10/minute", 200 concurrent requests from one client."""
    report = []
    for name in ("gunicorn", "uvicorn"):
        base_url = servers[name].base_url
        redis.command("FLUSHALL")
        ours = tally(await burst(base_url, "/api/status/"))
        redis.command("FLUSHALL")
        drf_own = tally(await burst(base_url, "/api/drf-anon/"))
        assert ours == {200: 10, 429: 190}, name
        assert set(drf_own) <= {200, 429} and drf_own[200] >= 10, name
        report.append(
            f"{name}: moderato AnonRateThrottle admitted {ours[200]} of {BURST}; "
            f"DRF's own AnonRateThrottle admitted {drf_own[200]} of {BURST} (limit 10)"
        )
    with capsys.disabled():
        print("\n" + "\n".join(report))


# -- one quota for sync and async views ---------------------------------------------------


async def test_a_sync_view_and_an_async_view_share_one_quota_across_both_servers(
    servers: dict[str, Server], flushed: None
) -> None:
    sync_half, async_half = await asyncio.gather(
        burst(servers["gunicorn"].base_url, "/shared/", 100),
        burst(servers["uvicorn"].base_url, "/shared-async/", 100),
    )
    both = tally(sync_half) + tally(async_half)
    assert both == {200: 10, 429: 190}


# -- identity --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gunicorn", "uvicorn"])
async def test_forged_forwarded_for_gives_no_fresh_quota(
    servers: dict[str, Server], flushed: None, name: str
) -> None:
    forged = [{"X-Forwarded-For": f"203.0.113.{n}"} for n in range(30)]
    responses = await burst(
        servers[name].base_url, "/hello-async/" if name == "uvicorn" else "/hello/", 30, forged
    )
    assert tally(responses) == {200: 10, 429: 20}


# -- Redis killed, then back ---------------------------------------------------------------


async def test_redis_killed_is_503_everywhere_then_service_resumes(
    servers: dict[str, Server], redis: RedisServer
) -> None:
    redis.stop()
    try:
        down_wsgi = await burst(servers["gunicorn"].base_url, "/hello/")
        down_asgi = await burst(servers["uvicorn"].base_url, "/hello-async/")
        down_drf = await burst(servers["gunicorn"].base_url, "/api/status/", 40)
    finally:
        redis.start()
    assert tally(down_wsgi) == {503: BURST}  # no 500, nothing admitted
    assert tally(down_asgi) == {503: BURST}
    assert tally(down_drf) == {503: 40}
    assert len(workers(down_wsgi)) == GUNICORN_WORKERS  # from every worker
    assert len(workers(down_asgi)) == UVICORN_WORKERS
    assert {r.json()["error"] for r in down_wsgi + down_asgi} == {"Rate limit backend unavailable"}
    # The app-wide RATE (RateLimitMiddleware) answers first, as it does for every view.
    assert {r.json()["error"] for r in down_drf} == {"Rate limit backend unavailable"}
    # Back without restarting the app: every request from here on counts. Poll until
    # one is admitted, let every worker's circuit breaker probe again, then a burst.
    for name, path in (("gunicorn", "/hello/"), ("uvicorn", "/hello-async/")):
        after: list[httpx.Response] = []
        deadline_s = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=servers[name].base_url, timeout=30) as http:
            while not any(r.status_code == 200 for r in after):
                assert time.monotonic() < deadline_s, tally(after)
                after.append(await http.get(path))
                await asyncio.sleep(0.1)
        await asyncio.sleep(2.5)  # past the breakers' 1 s cooldown and reconnect backoff
        after += await burst(servers[name].base_url, path)
        assert set(tally(after)) <= {200, 429, 503}
        assert tally(after)[200] == 10, (name, tally(after))


# -- start-up ---------------------------------------------------------------------------------


def test_a_bad_setting_stops_gunicorn_at_start_up_naming_its_key(redis: RedisServer) -> None:
    server = gunicorn(redis.url, settings="django_bad_settings")
    try:
        assert server.wait_exit() != 0
        assert (
            "ImproperlyConfigured: MODERATO['FAIL_OPEN']: must be True or False" in server.output()
        )
    finally:
        server.stop()
