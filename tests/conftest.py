"""Shared test setup: every test gets its own autotune cache dir, and DeepSpeed runs on the CPU backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("autotune-cache")))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed `autotune` entry point as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}  # no wrapping of the lines we assert on
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
