"""examples/backend_choice.py: which backend each example runs on, and the line that says so.

The README starts Redis on localhost:6379 before running the examples, so an
example uses it when it answers there. The suite never touches that server:
the probe is pointed at the suite's own servers, or at a port nobody listens on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from example_helpers import EXAMPLES, ROOT
from process_helpers import stop_session
from redis_servers import RedisServer, free_port

from examples import backend_choice  # example_helpers put the repository's root on the path


def test_the_default_is_the_redis_the_readme_starts() -> None:
    assert backend_choice.DEFAULT_REDIS_URL == "redis://localhost:6379"


@pytest.mark.parametrize("configured", ["memory://", "redis://127.0.0.1:1/2"])
def test_moderato_redis_url_wins_without_a_probe(configured: str) -> None:
    environ = {"MODERATO_REDIS_URL": configured}
    # The default would not answer: the environment is taken as it is.
    default = f"redis://127.0.0.1:{free_port()}"
    assert backend_choice.choose_backend(environ, default) == (configured, "MODERATO_REDIS_URL")


def test_a_redis_answering_at_the_default_address_is_used(redis_url: str) -> None:
    url, reason = backend_choice.choose_backend({}, redis_url)
    assert url == redis_url
    assert reason == "a Redis answers there; MODERATO_REDIS_URL chooses another backend"


def test_nothing_listening_means_memory() -> None:
    port = free_port()
    url, reason = backend_choice.choose_backend({}, f"redis://127.0.0.1:{port}")
    assert url == "memory://"
    assert reason.startswith(f"in process: nothing answered at 127.0.0.1:{port} (")
    assert reason.endswith("; start Redis or set MODERATO_REDIS_URL")


def test_a_redis_asking_for_a_password_means_memory_and_says_so(
    own_redis_server: RedisServer,
) -> None:
    own_redis_server.command("CONFIG", "SET", "requirepass", "s3cret")
    url, reason = backend_choice.choose_backend({}, f"redis://127.0.0.1:{own_redis_server.port}")
    assert url == "memory://"
    assert f"the Redis at 127.0.0.1:{own_redis_server.port} wants a password" in reason


def test_passwords_never_reach_the_log() -> None:
    assert backend_choice.shown("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert backend_choice.shown("rediss://app:s3cret@h") == "rediss://app:***@h"
    assert backend_choice.shown("memory://") == "memory://"


def example_env(backend_url: str) -> dict[str, str]:
    """The environment as a user's shell has it: no PYTHONPATH, the backend chosen."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["MODERATO_REDIS_URL"] = backend_url
    return env


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    processes: list[tuple[subprocess.Popen[bytes], Path]] = []
    yield processes
    for process, _ in processes:
        stop_session(process, term_wait_s=10)


@pytest.mark.parametrize("example", ["fastapi_app", "multi_tenant"])
def test_the_apps_run_as_the_readme_runs_them_and_log_their_backend(
    example: str,
    redis_url: str,
    tmp_path: Path,
    served: list[tuple[subprocess.Popen[bytes], Path]],
) -> None:
    """``uvicorn examples.<name>:app`` from the repository's root, nothing else on the path."""
    port = free_port()
    log_path = tmp_path / "uvicorn.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", f"examples.{example}:app",
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT, env=example_env(redis_url), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    served.append((process, log_path))
    deadline = time.monotonic() + 30
    while True:
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=1)
            break
        except httpx.TransportError:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
    assert status.json() == {"status": "ok", "backend": "redis", "redis_connected": True}
    lines = log_path.read_text().splitlines()
    announced = f"INFO:     {example}: backend {redis_url} (MODERATO_REDIS_URL)"
    assert announced in lines
    # Said at start-up, before the server reports it is up.
    started = next(n for n, line in enumerate(lines) if "Application startup complete" in line)
    assert lines.index(announced) < started


@pytest.mark.parametrize(
    ("example", "arguments", "backend"),
    [("quickstart", [], "redis"), ("algorithms_demo", ["--no-chart"], "memory")],
)
def test_the_scripts_log_their_backend_first(
    example: str, arguments: list[str], backend: str, redis_url: str
) -> None:
    url = redis_url if backend == "redis" else "memory://"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{example}.py"), *arguments],
        cwd=ROOT, env=example_env(url), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == f"INFO:     {example}: backend {url} (MODERATO_REDIS_URL)"
