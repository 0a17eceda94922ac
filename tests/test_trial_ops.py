"""Ops ready before trials: stale torch-extensions build locks are cleared and reported, a held lock is
named when the ops do not load in time, and the load runs in the trials' interpreter and environment."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from autotune.trial.ops import STALE_LOCK_S, build_locks, clear_stale_locks, ensure_ops_ready


def _lock(base: Path, op: str, age_s: float) -> Path:
    lock = base / "py311_cpu" / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - age_s
    os.utime(lock, (old, old))
    return lock


def test_a_lock_older_than_any_build_is_removed_and_reported(tmp_path: Path) -> None:
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    stale = _lock(tmp_path, "cpu_adam", STALE_LOCK_S + 60)
    fresh = _lock(tmp_path, "fused_adam", 5)
    assert build_locks("cpu", env) == sorted([stale, fresh])
    cleared, held = clear_stale_locks("cpu", env)
    assert not stale.exists() and fresh.exists()
    assert held == [fresh] and len(cleared) == 1 and str(stale) in cleared[0] and "stale" in cleared[0]


def _fake_python(tmp_path: Path, body: str) -> str:
    """An interpreter stand-in that records its environment, then runs `body` (shell)."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nenv > "{tmp_path}/env.txt"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_ops_load_in_the_trials_environment(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo \'{"CPUAdamBuilder": 0.5}\'')
    env = {"PATH": os.environ["PATH"], "TORCH_EXTENSIONS_DIR": str(tmp_path), "TRIAL_MARK": "1"}
    assert ensure_ops_ready("cpu", env=env, python=python) == {"CPUAdamBuilder": 0.5}
    seen = (tmp_path / "env.txt").read_text()
    assert "TRIAL_MARK=1" in seen and "DS_ACCELERATOR=cpu" in seen


def test_a_held_lock_is_named_instead_of_a_silent_timeout(tmp_path: Path) -> None:
    fresh = _lock(tmp_path, "cpu_adam", 5)
    python = _fake_python(tmp_path, "exec sleep 30")
    env = {"PATH": os.environ["PATH"], "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    reports: list[str] = []
    with pytest.raises(RuntimeError, match=r"build lock .*cpu_adam/lock is still held"):
        ensure_ops_ready("cpu", env=env, python=python, timeout_s=1, report=reports.append)
    assert any(str(fresh) in r for r in reports)


def test_a_failed_load_says_why(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, "echo 'ImportError: undefined symbol: _ZN3c10' >&2; exit 1")
    env = {"PATH": os.environ["PATH"], "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    with pytest.raises(RuntimeError, match="undefined symbol"):
        ensure_ops_ready("cpu", env=env, python=python)
