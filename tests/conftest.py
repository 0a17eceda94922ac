"""Shared test setup: every test gets its own autotune cache dir, and DeepSpeed runs on the CPU backend.

Tests that need a tool the README's install does not bring are marked and skipped, with the reason, where it is
missing: `nvme` (libaio, for DeepSpeed's async_io op) here; `slurm` in tests/cluster.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.versions import installed, version_tuple

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def _async_io_missing() -> str | None:
    """Why DeepSpeed's async_io op (NVMe offload) cannot be built here, or None when it can."""
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):
        return None
    return "DeepSpeed's async_io op needs libaio (apt-get install libaio-dev)"


def needs(package: str, version: str, why: str) -> pytest.MarkDecorator:
    """Skip, with the reason, where the installed `package` is older than `version`: the behaviour under test
    (a DeepSpeed mode, a transformers code path a figure was measured on) first ships there. The floors cell
    (.ci/run, benchmarks/results/version_floors.json) runs the suite on the oldest versions pyproject allows."""
    have = installed(package)
    older = have is not None and (version_tuple(have) or ()) < (version_tuple(version) or ())
    return pytest.mark.skipif(older, reason=f"needs {package} >= {version} ({why}); installed {have}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("nvme") is not None and (reason := _async_io_missing()):
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("autotune-cache")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))  # the cache's signing key
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the installed `autotune` entry point as a user would."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}  # no wrapping of the lines we assert on
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
