"""`pip install .` (a wheel, not the editable checkout) plans from another directory: the profiles ship inside it.

pyproject force-includes profiles/ as autotune/_profiles (autotune.infra.paths.profiles_dir finds them there).
The wheel goes into a fresh virtualenv over this interpreter's stack (--system-site-packages, --no-deps), so
no package is downloaded; the plan runs from a directory that holds no checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # builds a wheel and a virtualenv: ~40 s on 2 cores under load
def test_a_built_wheel_plans_from_another_directory_with_its_own_profiles(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (the README's test command has it)")
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w"]
    assert _run([*pip, str(wheels)], tmp_path).returncode == 0
    (wheel,) = wheels.glob("autotune-*.whl")
    assert _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], tmp_path).returncode == 0
    installed = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr
    code = "import autotune.infra.paths as p; print(p.profiles_dir())"
    where = _run([str(venv / "bin" / "python"), "-c", code], elsewhere)
    assert Path(where.stdout.strip()) == venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / (
        "site-packages/autotune/_profiles"
    )
    plan = _run(
        [str(venv / "bin" / "autotune"), "plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu-type", "a100-80gb"],
        elsewhere,
    )
    assert plan.returncode == 0, plan.stderr
    assert "llama-3-8b" in plan.stdout and "Traceback" not in plan.stderr
