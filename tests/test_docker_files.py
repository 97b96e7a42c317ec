"""The compose files and the Dockerfile keep the promises the README makes for the Docker demos.

No Docker engine runs where this suite runs, so the files are parsed and their
invariants checked here: loopback-only ports, Redis 7 with noeviction and no
password, demo apps whose health checks require ``redis_connected=true`` (and
the exact health-check command is run against the real app), the ``test`` and
``benchmark`` profiles, and a runtime image that installs the built wheel and
runs as a non-root user without build or test tools.

``docker compose config`` would add the Compose schema check, and it needs no
engine, but it is not run: the docker CLI here has no Compose plugin, and the
plugin is only published in Docker's own apt repository, which this machine
and CI cannot reach (Debian ships only the retired Python docker-compose 1.x).
"""

from __future__ import annotations

import ast
import asyncio
import fnmatch
import inspect
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

import pytest
import redis_servers
import yaml
from example_helpers import EXAMPLES, ROOT, load_example
from redis_servers import free_port
from uvicorn_helpers import Start, serving

COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_DEV = ROOT / "docker-compose.dev.yml"
DOCKERFILE = ROOT / "Dockerfile"
DEMO_APPS = {
    "demo": ("examples.fastapi_app:app", 8000),
    "tenants": ("examples.multi_tenant:app", 8001),
}
BUILD_OR_TEST_TOOLS = (
    "build-essential", "gcc", "clang", "make", "pytest", "hypothesis", "ruff", "mypy",
    "poetry", "setup.py", "csrc", "chromium",
)  # fmt: skip


def compose(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict)
    return document


def services(path: Path) -> dict[str, dict[str, Any]]:
    return compose(path)["services"]  # type: ignore[no-any-return]


def published_ports(service: dict[str, Any]) -> list[Any]:
    return list(service.get("ports", []))


# -- compose ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_DEV], ids=lambda p: p.name)
def test_every_port_is_published_on_loopback_only(path: Path) -> None:
    seen = 0
    for name, service in services(path).items():
        for port in published_ports(service):
            seen += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", (name, port)
            else:
                assert str(port).startswith("127.0.0.1:"), (name, port)
    assert seen >= 1


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_DEV], ids=lambda p: p.name)
def test_redis_is_7_with_noeviction_and_no_password(path: Path) -> None:
    redis = services(path)["redis"]
    assert re.fullmatch(r"redis:7(\.\d+)*(-[a-z0-9.]+)?", redis["image"]), redis["image"]
    command = [str(part) for part in redis["command"]]
    assert command[0] == "redis-server"
    policy = command.index("--maxmemory-policy")
    assert command[policy + 1] == "noeviction"
    text = path.read_text().lower()
    assert "requirepass" not in text and "redis_password" not in text and "--user" not in text
    assert "profiles" not in redis  # starts with the stack
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert published_ports(redis) == ["127.0.0.1:6379:6379"]


def test_demo_and_dev_stacks_are_separate_projects() -> None:
    assert compose(COMPOSE)["name"] == "moderato"
    assert compose(COMPOSE_DEV)["name"] == "moderato-dev"
    insight = services(COMPOSE_DEV)["redisinsight"]
    assert insight["profiles"] == ["debug"]
    assert published_ports(insight) == ["127.0.0.1:5540:5540"]


def healthcheck_code(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    return str(test[3])


@pytest.mark.parametrize("name", list(DEMO_APPS))
def test_demo_apps_run_the_examples_on_the_stack_redis(name: str) -> None:
    app_path, port = DEMO_APPS[name]
    service = services(COMPOSE)[name]
    assert "profiles" not in service
    assert service["build"] == {"context": ".", "target": "runtime"}
    assert service["environment"]["MODERATO_REDIS_URL"] == "redis://redis:6379/0"
    assert service["depends_on"] == {"redis": {"condition": "service_healthy"}}
    command = service["command"]
    assert command[:2] == ["uvicorn", app_path]
    assert command[command.index("--port") + 1] == str(port)
    assert (EXAMPLES / f"{app_path.split(':')[0].split('.')[1]}.py").is_file()
    assert published_ports(service) == [f"127.0.0.1:{port}:{port}"]
    # The health check asks the service's own port and requires redis_connected.
    code = healthcheck_code(service)
    assert f"http://127.0.0.1:{port}/api/status" in code
    assert "redis_connected" in code and "is True" in code


def test_test_profile_uses_its_own_disposable_redis() -> None:
    tests = services(COMPOSE)["tests"]
    assert tests["profiles"] == ["test"]
    assert tests["build"] == {"context": ".", "target": "test"}
    # Never the demo Redis or its volume: the suite starts redis-server itself,
    # inside the container, from the binaries the test image installs.
    assert "depends_on" not in tests and "environment" not in tests and "volumes" not in tests
    assert "redis-server" in stage("test").text
    # tests/conftest.py's redis_server fixture starts one (redis_servers.running()).
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert "yield from running(RedisServer())" in conftest
    assert "process.start()" in inspect.getsource(redis_servers.running)


def test_benchmark_profile_keeps_its_reports_in_a_volume() -> None:
    document = compose(COMPOSE)
    benchmark = document["services"]["benchmark"]
    assert benchmark["profiles"] == ["benchmark"]
    assert benchmark["build"] == {"context": ".", "target": "benchmark"}
    assert benchmark["volumes"] == ["benchmark_results:/app/benchmarks/results"]
    assert set(document["volumes"]) == {"redis_data", "benchmark_results"}
    assert services(COMPOSE)["redis"]["volumes"] == ["redis_data:/data"]


# -- the health check, run for real ----------------------------------------------


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    """Apps under uvicorn in this event loop, with uvicorn's own defaults as the image runs
    them (lifespan "auto", the access log, proxy headers trusted); each answers its port."""
    async with serving(lifespan="auto", access_log=True, proxy_headers=True) as start:
        yield start


async def run_healthcheck(code: str, compose_port: int, port: int) -> int:
    code = code.replace(f"127.0.0.1:{compose_port}/", f"127.0.0.1:{port}/")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return await asyncio.wait_for(process.wait(), timeout=15)


@pytest.mark.parametrize("name", list(DEMO_APPS))
async def test_healthcheck_passes_only_while_redis_decides(
    name: str, redis_url: str, serve: Start
) -> None:
    app_path, compose_port = DEMO_APPS[name]
    example = app_path.split(":")[0].split(".")[1]
    code = healthcheck_code(services(COMPOSE)[name])
    healthy_port = await serve(load_example(example, redis_url).app)
    dead_redis = f"redis://127.0.0.1:{free_port()}"
    unhealthy_port = await serve(load_example(example, dead_redis).app)
    assert await run_healthcheck(code, compose_port, healthy_port) == 0
    assert await run_healthcheck(code, compose_port, unhealthy_port) != 0
    # Nothing listening at all is unhealthy too.
    assert await run_healthcheck(code, compose_port, free_port()) != 0


# -- Dockerfile ------------------------------------------------------------------


class Stage:
    def __init__(self, name: str, base: str, instructions: list[tuple[str, str]]) -> None:
        self.name = name
        self.base = base
        self.instructions = instructions

    @property
    def text(self) -> str:
        return "\n".join(f"{op} {args}" for op, args in self.instructions)

    def all(self, op: str) -> list[str]:
        return [args for each, args in self.instructions if each == op]


def dockerfile_stages() -> dict[str, Stage]:
    """The stages of the Dockerfile: continuation lines joined, comments dropped, ARGs resolved."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    arguments: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Optional[Stage] = None
    for line in logical:
        op, _, args = line.partition(" ")
        op = op.upper()
        if op == "ARG" and current is None:
            key, _, default = args.partition("=")
            arguments[key] = default
        elif op == "FROM":
            image, name = re.split(r"\s+as\s+", args, flags=re.I)
            image = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], image)
            current = stages[name] = Stage(name, image, [])
        else:
            assert current is not None, line
            current.instructions.append((op, args))
    return stages


def stage(name: str) -> Stage:
    return dockerfile_stages()[name]


def test_dockerfile_has_the_four_targets() -> None:
    stages = dockerfile_stages()
    assert list(stages) == ["builder", "runtime", "test", "benchmark"]
    for each in stages.values():
        assert re.fullmatch(r"python:3\.12-slim(-\w+)?", each.base), (each.name, each.base)


def test_builder_builds_the_wheel() -> None:
    builder = stage("builder")
    assert any("pip wheel" in run and "--wheel-dir /dist" in run for run in builder.all("RUN"))
    assert "build-essential" in builder.text
    copied = " ".join(builder.all("COPY"))
    for path in ("pyproject.toml", "setup.py", "csrc", "moderato", "lua"):
        assert path in copied


def test_runtime_installs_only_the_wheel_and_runs_as_a_non_root_user() -> None:
    runtime = stage("runtime")
    installs = [run for run in runtime.all("RUN") if "pip install" in run]
    assert len(installs) == 1
    install = installs[0]
    assert "--mount=type=bind,from=builder,source=/dist" in install
    assert '"$(ls /tmp/dist/moderato-*.whl)[all]"' in install
    assert '"uvicorn>=0.23"' in install
    # Nothing but the examples comes from the build context: no source tree, no tests.
    assert runtime.all("COPY") == ["examples ./examples"]
    assert not any("--from" in copy for copy in runtime.all("COPY"))
    for tool in BUILD_OR_TEST_TOOLS:
        assert tool not in runtime.text, tool
    assert "apt-get" not in runtime.text
    users = runtime.all("USER")
    assert users and users[-1] not in ("root", "0")
    assert runtime.all("CMD") == [
        '["uvicorn", "examples.fastapi_app:app", "--host", "0.0.0.0", "--port", "8000"]'
    ]
    # [all] is the fastapi and metrics extras: what the demo apps import.
    assert 'all = ["moderato[fastapi,metrics]"]' in (ROOT / "pyproject.toml").read_text()


def test_test_and_benchmark_stages() -> None:
    test = stage("test")
    assert "redis-server" in test.text and "chromium" in test.text
    assert test.all("CMD") == ['["make", "test"]']
    assert test.all("USER")[-1] not in ("root", "0")
    benchmark = stage("benchmark")
    assert '"$(ls /tmp/dist/moderato-*.whl)[bench]"' in benchmark.text
    assert "redis-server" in benchmark.text
    assert " wrk " in benchmark.text  # the end-to-end section's load generator
    # The installed wheel is what gets measured: no source tree on the path.
    assert benchmark.all("COPY") == [
        "benchmarks/*.py benchmarks/wrk_report.lua ./benchmarks/",
        "benchmarks/apps ./benchmarks/apps",
        "tests/redis_servers.py tests/cluster.py ./tests/",
    ]
    assert benchmark.all("USER")[-1] not in ("root", "0")
    assert benchmark.all("CMD") == ['["python", "benchmarks/performance.py", "--quick"]']


def test_dockerignore_keeps_local_builds_out_of_the_context() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "build", "dist", "moderato/*.so", "test-artifacts"):
        assert entry in ignored, entry


# -- the benchmark stage, run for real (without Docker) ---------------------------------------

# What the image's steps would do, done here: the builder's COPY and `pip wheel`,
# then the benchmark stage's `pip install` into a clean venv and its COPY lines.


def context_ignored(relative: str) -> bool:
    """Whether .dockerignore keeps a path (relative to the repository) out of the build context."""
    patterns = (ROOT / ".dockerignore").read_text().split()
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            return True
    return False


def run_copy(copy: str, workdir: Path) -> None:
    """A COPY line from the build context (the repository, less .dockerignore) into workdir.

    As Docker copies: a file into a folder (a destination ending in /) by its name, else
    to the destination; a folder's contents into the destination folder.
    """
    *sources, destination = [word for word in copy.split() if not word.startswith("--")]
    target = workdir / destination
    for source in sources:
        for path in sorted(ROOT.glob(source)):
            if path.is_file():
                files = {path: target / path.name if destination.endswith("/") else target}
            else:
                files = {file: target / file.relative_to(path) for file in path.rglob("*")}
            for file, placed in files.items():
                if file.is_dir() or context_ignored(file.relative_to(ROOT).as_posix()):
                    continue
                placed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, placed)


def run_step(command: str, cwd: Path, timeout_s: float) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def imported_modules(files: list[Path]) -> set[str]:
    """Every module the files import, at any depth (deferred imports too), but relative ones."""
    modules: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module)
    return modules


@pytest.mark.slow
@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="the image runs Python 3.12; on 3.9 pip finds no releases of limits[async-redis,redis] "
    "and pyrate-limiter[redis] whose dependencies agree (ResolutionImpossible)",
)
def test_the_benchmark_stage_installs_everything_the_quick_run_imports(tmp_path: Path) -> None:
    builder, benchmark = stage("builder"), stage("benchmark")
    dist, source, app = tmp_path / "dist", tmp_path / "src", tmp_path / "app"
    # builder: the context's files, then its `pip wheel` (here into tmp_path/dist).
    for copy in builder.all("COPY"):
        run_copy(copy, source)
    (wheel_step,) = [run for run in builder.all("RUN") if "pip wheel" in run]
    run_step(wheel_step.replace("python ", f"{sys.executable} ", 1).replace("/dist", str(dist)),
             source, timeout_s=600)  # fmt: skip
    # benchmark: a clean venv (the image's own Python has nothing else), the stage's install
    # (the wheel's [bench] extra; pip's cache allowed here, which changes nothing installed),
    # then its COPY lines.
    venv = tmp_path / "venv"
    run_step(f"{sys.executable} -m venv {venv}", tmp_path, timeout_s=120)
    (install_step,) = [run for run in benchmark.all("RUN") if "pip install" in run]
    install = re.sub(r"--mount=\S+\s+", "", install_step).replace("--no-cache-dir ", "")
    install = install.replace("python ", f"{venv}/bin/python ", 1).replace("/tmp/dist", str(dist))
    run_step(install, tmp_path, timeout_s=900)
    for copy in benchmark.all("COPY"):
        run_copy(copy, app)
    harness = sorted(app.rglob("*.py"))
    local = {path.stem for path in harness} | {"benchmarks", "tests"}
    needed = sorted(
        module for module in imported_modules(harness) if module.split(".")[0] not in local
    )
    assert "limits" in needed and "slowapi" in needed and "uvloop" in needed  # the scan works
    apps = sorted(
        f"benchmarks.apps.{path.stem}" for path in (app / "benchmarks/apps").glob("[!_]*.py")
    )
    check = (
        "import importlib, importlib.util, sys\n"
        "assert importlib.util.find_spec('pytest') is None, 'not a clean venv'\n"
        f"for name in {needed + apps!r}:\n"
        "    importlib.import_module(name)\n"
        "import moderato\n"
        "assert 'site-packages' in moderato.__file__, moderato.__file__\n"
        "print('imported', len(sys.modules))\n"
    )
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path))}
    for command in (
        [f"{venv}/bin/python", "-c", check],
        [f"{venv}/bin/python", "benchmarks/performance.py", "--help"],
    ):
        done = subprocess.run(
            command, cwd=app, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{command[1:]}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
