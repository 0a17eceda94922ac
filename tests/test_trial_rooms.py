"""trial/ by process (issue 43), read with `ast` like tests/test_layout.py: only the rank side (trial/worker/) imports
torch or DeepSpeed under trial/, with the one exception of the in-job hook the user's own command loads
(trial/own_command/step_hook/), and no two modules of the package share a file name."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "autotune"
TRIAL = PACKAGE / "trial"
HEAVY = ("torch", "deepspeed")
ALLOWED = (TRIAL / "worker", TRIAL / "own_command" / "step_hook")
SHARED_NAMES = {"__init__.py", "__main__.py"}


def imported_roots(path: Path) -> set[str]:
    """Top-level packages `path` imports anywhere (module level, functions, TYPE_CHECKING blocks)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def heavy_outside_the_worker(folder: Path) -> list[str]:
    return [
        f"{path.relative_to(folder)} imports {', '.join(sorted(imported_roots(path) & set(HEAVY)))}"
        for path in sorted(folder.rglob("*.py"))
        if imported_roots(path) & set(HEAVY) and not any(allowed in path.parents for allowed in ALLOWED)
    ]


def test_only_the_worker_imports_torch_or_deepspeed_under_trial() -> None:
    assert (TRIAL / "worker").is_dir() and (TRIAL / "launch").is_dir() and (TRIAL / "own_command").is_dir()
    assert heavy_outside_the_worker(TRIAL) == []


def test_the_check_sees_a_heavy_import_outside_the_worker(tmp_path: Path) -> None:
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "local.py").write_text("def f():\n    import torch.cuda\n")
    assert heavy_outside_the_worker(tmp_path) == ["launch/local.py imports torch"]


def test_no_two_modules_share_a_file_name() -> None:
    names = Counter(path.name for path in PACKAGE.rglob("*.py") if path.name not in SHARED_NAMES)
    assert [name for name, count in names.items() if count > 1] == []


def test_no_module_is_named_like_a_package_elsewhere() -> None:
    """`request/own_command.py` beside `trial/own_command/` reads as one thing; cli/ is exempt: each of its modules
    is the command of the same name (accelerate's `commands/` layout), a view onto that package by design."""
    packages = {path.parent.name for path in PACKAGE.rglob("__init__.py")}
    modules = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.stem in packages and path.parent.name != "cli" and path.name not in SHARED_NAMES
    ]
    assert modules == []


def test_the_map_names_every_folder_of_trial() -> None:
    readme = (TRIAL / "README.md").read_text()
    assert readme.startswith("# trial/")
    for folder in ("launch/", "worker/", "own_command/"):
        assert f"`{folder}`" in readme.split("\n\n## ")[0]
