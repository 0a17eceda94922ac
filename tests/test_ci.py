"""CI runs what the README says, on a PATH without SLURM's tools (as on a machine set up by the README alone)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO


def _test_commands(path: Path) -> list[str]:
    """Lines that install autotune and run its tests (the README's quick start installs without running them)."""
    return [line for line in path.read_text().splitlines() if "pip install" in line and "pytest" in line]


def test_ci_runs_the_readme_test_command_word_for_word() -> None:
    readme = _test_commands(REPO / "README.md")
    assert len(readme) == 1 and readme[0].endswith("python3 -m pytest -q")
    assert _test_commands(REPO / ".ci" / "run") == readme


def test_the_ci_path_hides_slurm_but_keeps_every_other_program(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("srun", "sbatch", "scontrol", "gcc-like"):
        (tools / name).write_text("#!/bin/sh\necho ran\n")
        (tools / name).chmod(0o755)
    path = f"{tools}:{os.environ['PATH']}"
    shadow = tmp_path / "shadow"
    made = subprocess.run(
        [str(REPO / ".ci" / "path-without-slurm"), str(shadow)],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    scrubbed = made.stdout.strip()
    looked_up = subprocess.run(
        ["bash", "-c", "for t in srun sbatch scontrol gcc-like python3; do command -v $t || echo no-$t; done"],
        env={**os.environ, "PATH": scrubbed},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert looked_up[:3] == ["no-srun", "no-sbatch", "no-scontrol"]
    assert Path(looked_up[3]).parent.parent == shadow and Path(looked_up[3]).resolve() == tools / "gcc-like"
    if not any((Path(d) / "srun").exists() for d in os.environ["PATH"].split(":")):
        assert scrubbed.split(":")[1:] == os.environ["PATH"].split(":")  # directories without SLURM stay as they are
