"""visor/policy/ reads as one unit: no import cycles inside it, nothing it
needs from outside but the wire layer, the redaction engine and the display
table, and every
module importable first, on its own, in a fresh interpreter.

The import graph is read from the source (``ast``): every import a module
runs, at the top or inside a function, counts; imports under ``if
TYPE_CHECKING:`` are for the type checker only and do not.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import visor.policy

PACKAGE = Path(visor.policy.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")

# What the policy package may use from the rest of Visor: the JSON-RPC layer
# below it, the redaction engine the loader compiles patterns into, and the
# pure table of characters a screen shows as nothing (visor.display), which
# the check for a server question speaking as Visor reads past.
ALLOWED_OUTSIDE = ("visor.wire", "visor.redact", "visor.display")
# Modules that wire the package to the rest of Visor rather than belong to it:
# commands.py is the `visor policy` command line; lint.py reads pack
# selection from visor.session until it imports visor.policy.effective.
EDGE_MODULES = {"commands", "lint"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> set[str]:
    """Every ``visor...`` module a module imports when it runs."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("visor"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("visor"):
            if node.module in ("visor", "visor.policy"):
                # `from visor.policy import paths` imports the module visor.policy.paths
                out.update(f"{node.module}.{a.name}" for a in node.names)
            else:
                out.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
        graph[name] = _runtime_imports(tree)
    return graph


def test_the_import_graph_inside_the_package_has_no_cycle() -> None:
    graph = _graph()
    inside = {
        name: {m.removeprefix("visor.policy.") for m in deps if m.startswith("visor.policy.")}
        for name, deps in graph.items()
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(inside.get(node, ())):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle in visor/policy: " + " -> ".join(cycle))
            if dep not in state:
                walk(dep)
        path.pop()
        state[node] = 2

    for name in MODULES:
        if name not in state:
            walk(name)
    # the check reads real edges: the evaluator imports the checks it runs
    assert "rules" in inside["evaluate"]


def test_the_package_needs_nothing_from_outside_but_the_wire_redaction_and_display() -> None:
    graph = _graph()
    outside = {
        name: sorted(
            m for m in deps if not m.startswith("visor.policy") and not m.startswith(ALLOWED_OUTSIDE)
        )
        for name, deps in graph.items()
        if name not in EDGE_MODULES
    }
    assert {name: deps for name, deps in outside.items() if deps} == {}


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_first_in_a_fresh_interpreter(name: str) -> None:
    # A cycle that only bites when one particular module is imported first
    # shows up here as an ImportError naming a partially initialised module.
    proc = subprocess.run(
        [sys.executable, "-c", f"import visor.policy.{name}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
