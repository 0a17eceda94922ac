"""Rules of the code's shape that ruff cannot state, read with `ast` like tests/test_layout.py: no call passes more than
four positional arguments to a project function (past four, a reader cannot tell which value is which, and a swap of
two same-typed ones goes unnoticed), and no test module imports from another one (shared test builders live in
tests/fakes/, where their rules are written)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "src" / "autotune"
CHECKED = ("src", "tests", "benchmarks", "examples")
MAX_POSITIONAL = 4


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _variadic(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    """A function taking *args: its positional arguments are one list, not a sequence of named ones."""
    return not isinstance(node, ast.ClassDef) and node.args.vararg is not None


def project_callables() -> set[str]:
    """Names of the project's functions, methods and classes, but those taking *args."""
    names: set[str] = set()
    variadic: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        for node in _functions(ast.parse(path.read_text())):
            (variadic if _variadic(node) else names).add(node.name)
    return names - variadic


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def long_positional_calls(path: Path, project: set[str]) -> list[str]:
    """Calls in `path` passing more than MAX_POSITIONAL positional arguments to a project callable; a name the file
    defines itself outside src/ (a test's own helper) is the file's, not the project's."""
    tree = ast.parse(path.read_text())
    own = {node.name for node in _functions(tree)} if SOURCE not in path.parents else set()
    label = path.relative_to(REPO) if REPO in path.parents else path.name
    return [
        f"{label}:{node.lineno} {name}() with {len(node.args)} positional"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (name := _callee(node)) in project - own and len(node.args) > MAX_POSITIONAL
    ]


def python_files() -> list[Path]:
    return sorted(path for folder in CHECKED if (REPO / folder).is_dir() for path in (REPO / folder).rglob("*.py"))


def test_no_call_passes_more_than_four_positional_arguments_to_a_project_function() -> None:
    project = project_callables()
    found = [line for path in python_files() for line in long_positional_calls(path, project)]
    assert not found, "pass these by keyword:\n" + "\n".join(found)


def test_the_check_sees_a_long_positional_call(tmp_path: Path) -> None:
    """The check above can fail: a test file calling a project function with five positional arguments."""
    probe = tmp_path / "probe.py"
    probe.write_text("from autotune.tuner import ds_config_for\n\nds_config_for(1, 2, 3, 4, 5)\nds_config_for(1, 2)\n")
    assert long_positional_calls(probe, project_callables()) == ["probe.py:3 ds_config_for() with 5 positional"]


def test_no_test_module_imports_from_another() -> None:
    """Also inside the scripts tests run in a subprocess (a string): those are searched as text."""
    pattern = "from tests." + "test_"
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if pattern in line
    ]
    assert not found, "move the shared builders to tests/fakes/:\n" + "\n".join(found)
