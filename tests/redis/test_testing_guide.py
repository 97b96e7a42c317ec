"""docs/testing.md is a pytest project: every snippet is a file of it, and every test passes.

A snippet whose id starts with ``test_`` is a test module; the others
(``myapp``, ``conftest``, ``shop``) are the modules beside them. All are
written to a fresh directory and pytest runs them there in a process of its
own, as a reader would (one session, so the fixtures must keep the modules'
tests apart; no moderato test fixtures, no configuration but pytest's
defaults): every test each module defines must pass, none failed, skipped or
missing.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from doc_snippets import snippets

PAGE = "testing.md"
SUPPORT = ("myapp", "conftest", "shop")
"""The page's modules that are not tests, in the order the page introduces them."""

TEST_MODULES = [name for name in snippets(PAGE) if name.startswith("test_")]


def test_every_snippet_is_a_module_of_the_project() -> None:
    found = list(snippets(PAGE))
    assert [name for name in found if not name.startswith("test_")] == list(SUPPORT)
    assert TEST_MODULES == ["test_limits", "test_windows", "test_lifting", "test_shop"]


def defined_tests(code: str) -> list[str]:
    """The names of the module-level test functions, sync or async."""
    return [
        node.name
        for node in ast.parse(code).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    ]


def test_the_page_is_a_pytest_project_whose_tests_all_pass(tmp_path: Path) -> None:
    found = snippets(PAGE)
    for name, code in found.items():
        (tmp_path / f"{name}.py").write_text(code, encoding="utf-8")
    report = tmp_path / "report.xml"
    environment = {key: value for key, value in os.environ.items() if key != "RATE_LIMIT_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran: dict[str, list[str]] = {module: [] for module in TEST_MODULES}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        # No failure, error or skip recorded (captured output is allowed).
        assert {child.tag for child in case} <= {"system-out", "system-err"}, case.attrib
        name = str(case.get("name")).split("[")[0]  # anyio's "[asyncio]" parameter
        ran[str(case.get("classname"))].append(name)
    for module in TEST_MODULES:
        assert sorted(ran[module]) == sorted(defined_tests(found[module])), module
    assert sum(map(len, ran.values())) == 11
