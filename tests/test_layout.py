"""The package layout shows the pipeline: each step has its folder, imports only point down, no import cycles.

Read from the source with `ast`, so a function-level import or one under `TYPE_CHECKING` counts as much as a
module-level one: a cycle hidden by a lazy import is still a cycle to a reader following the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "autotune"

# Lowest first. A module may import its own unit and the units before it, never one after it.
LAYERS = (
    "errors",  # the one error base: everything may raise
    "core",  # pure values
    "infra",  # files, paths, environment, signals
    "hardware",  # 1. probe
    "models",  # 2. model
    "training",  # the user's optimizer and LoRA choices
    "modes",  # the modern memory modes
    "dsconfig",  # ds_config build, base, validation, emit
    "estimate",  # 3. estimate
    "trial",  # 5. real trials
    "report",  # the typed report and its renderings
    "request",  # one request, one context
    "search",  # 4. search over trials, the cache, the plan-only recommendation
    "tuning",  # one tuning around the search: needs a TuneContext
    "tuner",  # tune(): orchestration
    "check",  # autotune check
    "hook",  # autotune hook
    "cli",  # the typer app
    "__main__",
    "",  # the package's own __init__ (its lazy `tune`)
)
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "errors.py", "tuner.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The module an imported name lives in (`autotune.core.ladder.Rung` -> `autotune.core.ladder`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[str]:
    """Every autotune module `module` imports, wherever the import statement stands."""
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("autotune") else None
            if target is not None and target != module:
                yield target


def _unit(module: str) -> str:
    """The layer a module belongs to: its folder under autotune/, or its own name for a top-level file."""
    return module.split(".")[1] if "." in module else ""


def _edges() -> dict[str, set[str]]:
    return {module: set(_imports(module)) for module in MODULES}


def test_only_the_entry_points_and_the_error_base_stay_at_the_top() -> None:
    files = {path.name for path in PACKAGE.glob("*.py")}
    assert files == TOP_LEVEL_FILES


def test_every_unit_has_a_layer() -> None:
    assert {_unit(module) for module in MODULES} == set(LAYERS)


def test_imports_only_point_down() -> None:
    rank = {unit: index for index, unit in enumerate(LAYERS)}
    upward = [
        f"{module} -> {target}"
        for module, targets in _edges().items()
        for target in targets
        if rank[_unit(target)] > rank[_unit(module)]
    ]
    assert upward == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each a cycle a reader would walk into."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_not_even_through_a_lazy_import() -> None:
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
