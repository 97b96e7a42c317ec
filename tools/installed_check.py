"""Check an installed moderato the way a user meets it; run it from outside the source tree.

    python tools/installed_check.py [--redis-server PATH] [--without-redis] [--starlette-extra]

It fails (exit 1, with the reason) unless: moderato is imported from an
installation (site-packages), not from a source tree; its C extension loads;
``__version__`` matches the installed metadata, which declares the MIT license
and ships the LICENSE file; every Lua script loads; every algorithm decides on
``memory://``; and every algorithm decides, and reset works, on a redis-server
this script starts on a free loopback port and stops. ``--without-redis`` is
only for platforms with no redis-server (the Windows wheels); it says so.
``--starlette-extra`` (after ``pip install 'moderato[starlette]'``) also checks
that a Starlette app is limited with FastAPI absent.

tools/install_check.sh runs it in CI; cibuildwheel runs it on every wheel.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

RATE = "2/minute"
# 2/minute admits two single-cost requests, then denies: the same for every algorithm.
EXPECTED = [(True, 1), (True, 0), (False, 0)]


def fail(message: str) -> None:
    sys.exit(f"installed check FAILED: {message}")


def check_installation() -> None:
    import moderato
    import moderato._accel as accel

    module_path = Path(moderato.__file__).resolve()
    install_dirs = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if not any(module_path.is_relative_to(directory) for directory in install_dirs):
        fail(f"moderato was imported from {module_path}, not from {sorted(install_dirs)}")
    if not str(accel.__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
        fail(f"moderato._accel is {accel.__file__}, not a compiled extension")
    installed = importlib.metadata.version("moderato")
    if moderato.__version__ != installed:
        fail(f"moderato.__version__ is {moderato.__version__}, the metadata says {installed}")
    metadata = importlib.metadata.metadata("moderato")
    if metadata.get("License-Expression") != "MIT":
        fail(f"License-Expression is {metadata.get('License-Expression')!r}, expected 'MIT'")
    files = importlib.metadata.distribution("moderato").files or []
    if not any(file.name == "LICENSE" for file in files):
        fail("the installed distribution has no LICENSE file")
    print(f"installed: moderato {installed} at {module_path.parent}; _accel {accel.__file__}")


def check_scripts() -> None:
    from moderato.scripts import SCRIPT_NAMES, load_script

    for name in SCRIPT_NAMES:
        script = load_script(name)
        if len(script.sha) != 40 or not script.source.strip():
            fail(f"Lua script {name} loaded empty")
    print(f"scripts: {', '.join(SCRIPT_NAMES)}")


async def decide_every_algorithm(url: str) -> None:
    from moderato import RateLimiter
    from moderato.algorithms import ALGORITHMS

    limiter = RateLimiter(url, key_prefix="installed-check")
    await limiter.connect()
    try:
        for algorithm in ALGORITHMS:
            seen = []
            for _ in EXPECTED:
                result = await limiter.check_with_info("user-1", RATE, algorithm=algorithm)
                seen.append((result.allowed, result.remaining))
            if seen != EXPECTED:
                fail(f"{url} {algorithm}: (allowed, remaining) {seen}, expected {EXPECTED}")
            deleted = await limiter.reset("user-1", rate=RATE, algorithm=algorithm)
            again = await limiter.check_with_info("user-1", RATE, algorithm=algorithm)
            if deleted < 1 or (again.allowed, again.remaining) != EXPECTED[0]:
                fail(f"{url} {algorithm}: reset deleted {deleted} keys, then {again}")
    finally:
        await limiter.close()
    print(f"{url.split(':')[0]}: {', '.join(ALGORITHMS)} decide {EXPECTED}; reset works")


GET_ROOT = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/",
    "raw_path": b"/",
    "root_path": "",
    "query_string": b"",
    "headers": [],
    "client": ("127.0.0.1", 50000),
    "server": ("testserver", 80),
}


async def status_of_get_root(app: Any) -> object:
    """One ``GET /`` straight over ASGI (no HTTP client is installed with the extra)."""
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await app(dict(GET_ROOT), receive, send)
    return sent[0]["status"]


async def limit_a_starlette_app() -> None:
    import importlib.util

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from moderato import RateLimiter, RateLimitMiddleware

    if importlib.util.find_spec("fastapi") is not None:
        fail("the starlette extra installed FastAPI")

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    limiter = RateLimiter("memory://", key_prefix="installed-check")
    app = Starlette(
        routes=[Route("/", hello)],
        middleware=[Middleware(RateLimitMiddleware, limiter=limiter, rate="1/minute")],
    )
    statuses = [await status_of_get_root(app), await status_of_get_root(app)]
    await limiter.close()
    if statuses != [200, 429]:
        fail(f"a Starlette app limited to 1/minute answered {statuses}, expected [200, 429]")
    print("starlette extra: Starlette without FastAPI; 1/minute answers [200, 429]")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_redis(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline_s = time.monotonic() + 10.0
    while time.monotonic() < deadline_s:
        if process.poll() is not None:
            fail(f"redis-server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    fail(f"redis-server did not answer PING on port {port} within 10 s")


def check_redis(binary: str) -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="moderato-check-redis-") as directory:
        log = Path(directory) / "redis.log"
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", directory, "--logfile", str(log)]
        process = subprocess.Popen(args)
        try:
            wait_for_redis(port, process, log)
            asyncio.run(decide_every_algorithm(f"redis://127.0.0.1:{port}"))
        finally:
            process.terminate()
            process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-server", default=os.environ.get("MODERATO_REDIS_SERVER"))
    parser.add_argument("--without-redis", action="store_true")
    parser.add_argument("--starlette-extra", action="store_true")
    options = parser.parse_args()
    check_installation()
    check_scripts()
    asyncio.run(decide_every_algorithm("memory://"))
    if options.starlette_extra:
        asyncio.run(limit_a_starlette_app())
    if options.without_redis:
        print("redis: not checked on this platform (--without-redis)")
    else:
        binary = options.redis_server or shutil.which("redis-server")
        if not binary:
            fail("redis-server is not on PATH (install it, or pass --redis-server PATH)")
        check_redis(binary)
    print("installed check passed")


if __name__ == "__main__":
    main()
