"""The import graph of moderato/: no cycle, typing imports included.

Every ``import`` and ``from ... import`` of every module is read from its
source (no module is imported), including those under ``if TYPE_CHECKING:``
and any other block that runs, or is read by a type checker, at import time.
Imports inside a function run only when it is called: the one kind allowed
to point back up is a limiter's convenience method importing the module that
implements it (the documented hook by which the core reaches the HTTP
integration: ``limiter.limit()`` and friends, ``moderato.__getattr__``; the
blocking limiter's ``limit()``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

PACKAGE = Path(__file__).resolve().parents[2] / "moderato"

DEFERRED_HOOKS = {
    ("moderato", "__getattr__", "moderato.integrations"),
    ("moderato.limiter", "limit", "moderato.integrations.decorator"),
    ("moderato.limiter", "dependency", "moderato.integrations.dependency"),
    ("moderato.limiter", "message_limit", "moderato.integrations.websocket"),
}
"""(module, function, imported module): the core's call-time imports of the integrations."""

OTHER_HOOKS = {("moderato.sync.limiter", "limit", "moderato.sync.decorator")}
"""Call-time imports that would close a cycle otherwise: the blocking limiter's ``limit()``."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
# Compiled modules (the C extension) import nothing of the package; their stubs name them.
LEAVES = {module_name(path) for path in PACKAGE.rglob("*.pyi")} - set(MODULES)


class Import:
    """One import statement's target, and the function it sits in (None: module level)."""

    def __init__(self, target: str, function: Optional[str], line: int) -> None:
        self.target = target
        self.function = function
        self.line = line


def imports_of(name: str) -> list[Import]:
    """Every moderato module ``name`` imports, with where the import sits."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(node: ast.AST, function: Optional[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and function is None:
                inner = child.name
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                source = resolve(child)
                # ``from a import b`` imports the module a.b when there is one, else a.
                targets = [
                    f"{source}.{alias.name}"
                    if f"{source}.{alias.name}" in MODULES or f"{source}.{alias.name}" in LEAVES
                    else source
                    for alias in child.names
                ]
            else:
                targets = []
            for target in targets:
                if target in MODULES and target != name:
                    found.append(Import(target, inner, child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), None)
    return found


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state:
                cycle = walk(successor)
                if cycle is not None:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = walk(node)
            if cycle is not None:
                return cycle
    return None


def graph_of(*, deferred: bool) -> dict[str, set[str]]:
    return {
        name: {each.target for each in imports_of(name) if deferred or each.function is None}
        for name in MODULES
    }


def test_the_reader_sees_typing_and_relative_imports() -> None:
    # What the graph is built from, checked on modules whose imports are known.
    limiter = {each.target for each in imports_of("moderato.limiter") if each.function is None}
    assert {"moderato.specs", "moderato.backends.schemes", "moderato.keys"} <= limiter
    typing_only = {
        each.target for each in imports_of("moderato.integrations.rule") if each.function is None
    }
    assert "moderato.limiter" in typing_only  # under `if TYPE_CHECKING:`
    package = {each.target for each in imports_of("moderato") if each.function is None}
    assert "moderato.integrations" in package  # also under `if TYPE_CHECKING:`
    assert len(MODULES) >= 50
    assert "moderato._accel" in LEAVES
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_moderato_typing_imports_included() -> None:
    cycle = find_cycle(graph_of(deferred=False))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_call_time_imports_close_no_cycle_but_the_documented_hook() -> None:
    hooks = set()
    for name in MODULES:
        if name.startswith("moderato.integrations"):
            continue
        for each in imports_of(name):
            if each.function is not None and each.target.startswith("moderato.integrations"):
                hooks.add((name, each.function, each.target))
    assert hooks == DEFERRED_HOOKS
    # Without that hook, the call-time imports close no cycle either.
    graph = graph_of(deferred=True)
    for name, _, target in DEFERRED_HOOKS | OTHER_HOOKS:
        graph[name].discard(target)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_specs_and_the_core_load_without_starlette() -> None:
    script = textwrap.dedent(
        """
        import sys

        sys.modules["starlette"] = None  # as if not installed
        from moderato.specs import RULE_OPTIONS, KeySpec, check_specs
        from moderato import RateLimiter

        RateLimiter("memory://", key=lambda request: "k", cost=2)
        print(sorted(RULE_OPTIONS), check_specs(key="k", tenant=None, cost=3), KeySpec)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "['algorithm', 'burst', 'cost', 'exempt_when', 'key', 'scope', 'shadow', 'tenant'] 3 "
    )
