"""What users install: the sdist, the wheel built from it, their metadata, the build's
messages, the release configuration, and the error an incomplete install gives.

The sdist and the wheel are built once per run (no build isolation: the dev
venv has setuptools and `build`); tools/install_check.sh does the same the
way users do (isolated builds, fresh venvs, Python 3.9 and 3.13) in CI.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from http_helpers import client
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import moderato
from moderato import BackendError, RateLimiter
from moderato import scripts as scripts_module
from moderato.integrations import RateLimitMiddleware
from moderato.scripts import SCRIPT_NAMES, load_script

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SUPPORTED_MINORS = sorted(
    int(classifier.rsplit(".", 1)[1])
    for classifier in PYPROJECT["project"]["classifiers"]
    if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", classifier)
)
MISSING_CC = "/nonexistent/moderato-test-cc"


@dataclass(frozen=True)
class Built:
    sdist_names: frozenset[str]
    wheel_names: frozenset[str]
    wheel_metadata: Message
    output: str
    """Everything both builds printed (stdout and stderr)."""


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``python -m build --sdist``, then a wheel built from the unpacked sdist."""
    work = tmp_path_factory.mktemp("packaging")
    # Run from outside the tree: its build/ folder would shadow the `build` package.
    sdist_build = run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", "dist", str(ROOT)],
        work,
    )
    assert sdist_build.returncode == 0, sdist_build.stdout
    (sdist,) = (work / "dist").glob("moderato-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top = f"moderato-{moderato.__version__}/"
        sdist_names = frozenset(
            member.name[len(top) :] for member in archive.getmembers() if member.isfile()
        )
        archive.extractall(work / "unpacked", filter="data")
    wheel_build = run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(work / "dist"),
            str(work / "unpacked" / top),
        ],
        work,
    )
    assert wheel_build.returncode == 0, wheel_build.stdout
    (wheel,) = (work / "dist").glob("moderato-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = frozenset(archive.namelist())
        dist_info = f"moderato-{moderato.__version__}.dist-info"
        metadata = HeaderParser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    return Built(sdist_names, wheel_names, metadata, sdist_build.stdout + wheel_build.stdout)


def tree_files(*patterns: str) -> set[str]:
    found = {str(path.relative_to(ROOT)) for pattern in patterns for path in ROOT.glob(pattern)}
    return {name for name in found if "__pycache__" not in name}


# -- the sdist and the wheel --------------------------------------------------------


def test_sdist_carries_everything_the_build_needs_and_nothing_else(built: Built) -> None:
    needed = tree_files(
        "csrc/*.c",
        "csrc/*.h",
        "moderato/**/*.py",
        "lua/*.lua",
        "moderato/py.typed",
        "moderato/_accel.pyi",
        "moderato/dashboard/page.html",
    ) | {
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "pyproject.toml",
        "setup.py",
        "MANIFEST.in",
        "tools/installed_check.py",
    }
    assert needed - built.sdist_names == set()
    extra = {
        name for name in built.sdist_names - needed if not name.startswith("moderato.egg-info")
    }
    assert extra == {"PKG-INFO", "setup.cfg"}
    # Every header a C file includes, and every file a script splices in, is there.
    for source in tree_files("csrc/*.c", "csrc/*.h"):
        for header in re.findall(r'#include "([^"]+)"', (ROOT / source).read_text()):
            assert f"csrc/{header}" in built.sdist_names, (source, header)
    for script in tree_files("lua/*.lua"):
        for included in re.findall(r"^--#include (\S+)", (ROOT / script).read_text(), re.M):
            assert f"lua/{included}" in built.sdist_names, (script, included)


def test_wheel_carries_the_extension_scripts_types_and_license(built: Built) -> None:
    assert f"moderato/_accel{sysconfig.get_config_var('EXT_SUFFIX')}" in built.wheel_names
    # Every script of lua/, installed as moderato/lua/ (where an installed loader looks).
    shipped = {f"moderato/lua/{path.name}" for path in (ROOT / "lua").glob("*.lua")}
    assert {f"moderato/lua/{name}.lua" for name in (*SCRIPT_NAMES, "prelude")} <= shipped
    assert {name for name in built.wheel_names if name.endswith(".lua")} == shipped
    assert {"moderato/py.typed", "moderato/_accel.pyi"} <= built.wheel_names
    assert "moderato/dashboard/page.html" in built.wheel_names  # the dashboard's one page
    # every module, in every subpackage pyproject.toml lists
    assert tree_files("moderato/**/*.py") <= built.wheel_names
    assert f"moderato-{moderato.__version__}.dist-info/licenses/LICENSE" in built.wheel_names
    assert not any(name.startswith(("csrc/", "tests/", "tools/")) for name in built.wheel_names)


def test_license_metadata_is_pep_639_without_a_classifier(built: Built) -> None:
    metadata = built.wheel_metadata
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["License"] is None
    assert not [c for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_the_builds_print_no_license_deprecation_warning(built: Built) -> None:
    assert "SetuptoolsDeprecationWarning" not in built.output
    lines = [line for line in built.output.splitlines() if "licen" in line.lower()]
    assert not [line for line in lines if re.search("deprecat|warning", line, re.I)], lines


def test_extras_mean_what_they_say(built: Built) -> None:
    requirements: dict[str, set[str]] = {}
    for requirement in built.wheel_metadata.get_all("Requires-Dist") or []:
        extra = re.search(r"""extra == ["']([\w-]+)["']""", requirement)
        name = re.match(r"[A-Za-z0-9_.\-\[\],]+", requirement)
        assert name is not None
        requirements.setdefault(extra.group(1) if extra else "", set()).add(name.group(0))
    assert requirements[""] == {"hiredis"}
    assert requirements["starlette"] == {"starlette"}  # no FastAPI for Starlette users
    assert requirements["fastapi"] == {"fastapi", "starlette"}
    assert requirements["metrics"] == {"prometheus_client"}
    assert requirements["dashboard"] == {"starlette"}
    assert requirements["all"] == {"moderato[fastapi,metrics]"}
    extras = set(built.wheel_metadata.get_all("Provides-Extra") or [])
    assert {
        "starlette",
        "fastapi",
        "metrics",
        "dashboard",
        "all",
        "test",
        "dev",
        "demo",
        "chart",
        "bench",
    } <= extras


# -- one version -------------------------------------------------------------------


def test_version_lives_in_one_place(built: Built) -> None:
    assert moderato.__version__ == importlib.metadata.version("moderato")
    assert built.wheel_metadata["Version"] == moderato.__version__
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    declared = re.findall(
        r"__version__ = \"([^\"]+)\"", (ROOT / "moderato/_version.py").read_text()
    )
    assert declared == [moderato.__version__]


# -- building on compilers we do not control ------------------------------------------


def build_ext(tmp_path: Path, *prefix: str, **env: str) -> subprocess.CompletedProcess[str]:
    args = [
        "setup.py",
        "build_ext",
        "--force",
        "--build-lib",
        str(tmp_path / "lib"),
        "--build-temp",
        str(tmp_path / "temp"),
    ]
    return run([sys.executable, *prefix, *args], ROOT, **env)


def assert_one_clear_message(result: subprocess.CompletedProcess[str], missing: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stdout
    assert f"error: moderato's C extension cannot be built here: {missing}" in result.stdout
    assert "sudo apt-get install build-essential python3-dev" in result.stdout
    assert "sudo dnf install gcc python3-devel" in result.stdout
    assert result.stdout.count("cannot be built here") == 1


def test_a_missing_compiler_is_named_with_what_to_install(tmp_path: Path) -> None:
    result = build_ext(tmp_path, CC=MISSING_CC)
    assert_one_clear_message(result, f"the C compiler '{MISSING_CC}' was not found")


def test_missing_python_headers_are_named_with_what_to_install(tmp_path: Path) -> None:
    # The real compiler, told that Python's include directory is an empty one.
    headerless = tmp_path / "include"
    headerless.mkdir()
    pretend = (
        "import runpy, sys, setuptools\n"
        "from setuptools._distutils import sysconfig\n"
        f"sysconfig.get_python_inc = lambda plat_specific=False, prefix=None: {str(headerless)!r}\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
    )
    result = build_ext(tmp_path, "-c", pretend)
    assert "Python.h" in result.stdout  # the compiler's own complaint comes first
    assert_one_clear_message(result, "the Python headers (Python.h) were not found in ")


def compile_flags(tmp_path: Path, strict: str) -> list[str]:
    # The missing compiler fails fast, after setuptools printed the command it tried.
    result = build_ext(tmp_path, CC=MISSING_CC, MODERATO_STRICT_BUILD=strict)
    commands = [line for line in result.stdout.splitlines() if line.startswith(MISSING_CC)]
    assert commands, result.stdout
    return commands[0].split()


def test_warnings_are_errors_only_in_strict_builds(tmp_path: Path) -> None:
    users = compile_flags(tmp_path, "")
    assert {"-Wall", "-Wextra"} <= set(users) and "-Werror" not in users
    assert "-Werror" in compile_flags(tmp_path, "1")
    assert "-Werror" not in compile_flags(tmp_path, "0")


def test_ci_installs_the_way_users_do_on_the_oldest_and_newest_python() -> None:
    steps = re.findall(r"^make ([\w-]+)$", (ROOT / ".ci/run").read_text(), re.M)
    assert steps[0] == "test"  # the README's test command stays first
    assert "install-check" in steps
    recipe = re.search(r"^install-check:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    oldest, newest = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
    assert recipe.group(1) == f"bash tools/install_check.sh {oldest} {newest}"
    script = (ROOT / "tools/install_check.sh").read_text()
    assert "-m build --sdist" in script and "pip wheel -q --no-deps" in script


# -- the release configuration -----------------------------------------------------


def test_cibuildwheel_config_covers_every_supported_python_and_platform() -> None:
    config = PYPROJECT["tool"]["cibuildwheel"]
    assert SUPPORTED_MINORS == [9, 10, 11, 12, 13]
    assert config["build"].split() == [f"cp3{minor}-*" for minor in SUPPORTED_MINORS]
    assert PYPROJECT["project"]["requires-python"] == f">=3.{SUPPORTED_MINORS[0]}"
    assert config["linux"]["archs"] == ["x86_64", "aarch64"]
    assert config["macos"]["archs"] == ["x86_64", "arm64"]
    assert config["windows"]["archs"] == ["AMD64"]
    # The test every wheel runs is CI's install check, shipped in the sdist.
    assert config["test-command"] == "python {project}/tools/installed_check.py"
    assert config["windows"]["test-command"] == f"{config['test-command']} --without-redis"
    assert (ROOT / "tools/installed_check.py").is_file()
    assert "tools/installed_check.py" in (ROOT / "tools/install_check.sh").read_text()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="cibuildwheel itself needs Python 3.11+")
@pytest.mark.parametrize(
    ("platform", "tags"),
    [
        (
            "linux",
            [
                f"{libc}_{arch}"
                for libc in ("manylinux", "musllinux")
                for arch in ("x86_64", "aarch64")
            ],
        ),
        ("macos", ["macosx_x86_64", "macosx_arm64"]),
        ("windows", ["win_amd64"]),
    ],
)
def test_cibuildwheel_reads_the_config(platform: str, tags: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    expected = {f"cp3{minor}-{tag}" for minor in SUPPORTED_MINORS for tag in tags}
    assert set(result.stdout.split()) == expected
    # What each wheel's test environment gets: a redis-server (none on Windows) and the check.
    from cibuildwheel.options import CommandLineArguments, compute_options

    arguments = CommandLineArguments.defaults()
    arguments.platform = platform  # type: ignore[assignment]
    options = compute_options(platform, arguments, env={})  # type: ignore[arg-type]
    options.check_for_invalid_configuration(sorted(expected))
    check = "python {project}/tools/installed_check.py"
    for identifier in expected:
        build = options.build_options(identifier)
        assert (build.before_all, build.test_command) == {
            "manylinux": ("dnf install -y redis", check),
            "musllinux": ("apk add --no-cache redis", check),
            "macosx": ("brew install redis", check),
            "win": ("", f"{check} --without-redis"),
        }[re.split(r"[-_]", identifier)[1]], identifier


def test_release_workflow_builds_wheels_from_the_sdist_and_publishes_releases() -> None:
    workflow: dict[Any, Any] = yaml.safe_load((ROOT / ".github/workflows/wheels.yml").read_text())
    # YAML 1.1 reads the bare key `on` as True.
    assert set(workflow[True]) == {"workflow_dispatch", "release"}
    jobs = workflow["jobs"]
    assert set(jobs) == {"sdist", "wheels", "publish"}
    sdist_steps = " ".join(str(step.get("run", "")) for step in jobs["sdist"]["steps"])
    assert "python -m build --sdist --outdir dist" in sdist_steps
    wheels = jobs["wheels"]
    assert wheels["needs"] == "sdist"
    assert wheels["strategy"]["matrix"]["os"] == ["ubuntu-latest", "macos-latest", "windows-latest"]
    runs = " ".join(str(step.get("run", "")) for step in wheels["steps"])
    assert "python -m cibuildwheel --output-dir wheelhouse dist/moderato-*.tar.gz" in runs
    assert jobs["publish"]["needs"] == ["sdist", "wheels"]
    assert jobs["publish"]["if"] == "github.event_name == 'release'"


# -- an install without its scripts -------------------------------------------------


@pytest.fixture
def scripts_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The loader pointed at an empty directory, as in an install that lost its package data."""
    empty = tmp_path / "lua"
    empty.mkdir()
    monkeypatch.setattr(scripts_module, "_SCRIPTS_DIR", empty)
    load_script.cache_clear()
    yield empty
    load_script.cache_clear()


def test_missing_scripts_raise_backend_error_saying_how_to_fix(scripts_missing: Path) -> None:
    with pytest.raises(BackendError) as raised:
        load_script("token_bucket")
    assert str(raised.value) == (
        f"moderato's Lua script token_bucket.lua is missing from {scripts_missing}: this "
        "installation of moderato is incomplete (its package data was not installed). "
        "Reinstall it: pip install --force-reinstall --no-cache-dir moderato; when building "
        "from source, build from the sdist or a full checkout, where the scripts are "
        "lua/*.lua"
    )


def test_a_missing_include_is_the_same_error(scripts_missing: Path) -> None:
    (scripts_missing / "gcra.lua").write_bytes(b"--#include prelude.lua\nreturn 1\n")
    with pytest.raises(BackendError, match=r"Lua script prelude\.lua is missing from "):
        load_script("gcra")


async def test_missing_scripts_answer_503_over_http(redis_url: str, scripts_missing: Path) -> None:
    async with RateLimiter(redis_url, key_prefix="packaging") as limiter:
        with pytest.raises(BackendError, match="is missing from"):
            await limiter.check("someone", "5/minute")
        reached: list[str] = []

        async def endpoint(request: Request) -> PlainTextResponse:
            reached.append(request.url.path)
            return PlainTextResponse("ok")

        app = Starlette(
            routes=[Route("/search", endpoint)],
            middleware=[Middleware(RateLimitMiddleware, limiter=limiter, rate="5/minute")],
        )
        async with client(app) as http:
            response: httpx.Response = await http.get("/search")
    assert response.status_code == 503
    assert response.json() == {"error": "Rate limit backend unavailable"}
    assert reached == []


def test_the_install_check_refuses_a_source_tree(tmp_path: Path) -> None:
    # The dev venv imports moderato from this checkout (an editable install):
    # the check must say so and fail, not pass on the wrong files.
    result = run([sys.executable, str(ROOT / "tools/installed_check.py")], tmp_path)
    installs = sorted({Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")})
    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == (
        f"installed check FAILED: moderato was imported from {ROOT / 'moderato/__init__.py'}, "
        f"not from {installs}"
    )
