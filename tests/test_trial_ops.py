"""Ops ready before trials: stale torch-extensions build locks are cleared and reported, a held lock is
named when the ops do not load in time, and the load runs in the trials' interpreter and environment."""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

import pytest

from autotune.trial.launch.ops import STALE_LOCK_S, build_locks, clear_stale_locks, ensure_ops_ready


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
    python = _fake_python(tmp_path, "echo '{\"CPUAdamBuilder\": 0.5}'")
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


def test_each_op_builds_in_its_own_process_at_once_with_a_line_when_ready(tmp_path: Path) -> None:
    # the stand-in interpreter gets `-m autotune.trial.worker.ops_build --device cpu --op NAME`: CPU Adam takes longest
    python = _fake_python(tmp_path, '[ "$6" = CPUAdamBuilder ] && sleep 2; echo "{\\"$6\\": 1.0}"')
    env = {"PATH": os.environ["PATH"], "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    reports: list[str] = []
    started = time.monotonic()
    seconds = ensure_ops_ready("cpu", env=env, python=python, report=reports.append)
    assert seconds == {"ShareMemCommBuilder": 1.0, "FusedAdamBuilder": 1.0, "CPUAdamBuilder": 1.0}
    assert time.monotonic() - started < 2 + 3  # together, not one after another
    assert [r.split()[2] for r in reports][-1] == "CPUAdamBuilder" and len(reports) == 3
    assert all(re.fullmatch(r"DeepSpeed op \w+ ready after \d+ s", r) for r in reports)


def test_cpu_adam_waits_for_the_first_optimizer_offload_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune import tuner
    from autotune.core.ladder import Candidate, Rung
    from autotune.trial.launch import ops

    loaded: list[tuple[str, ...]] = []
    monkeypatch.setattr(ops, "ensure_ops_ready", lambda device, report, names: loaded.append(names) or {})
    prepared = tuner.TrialOps("cpu", lambda event: None)
    prepared.before()
    for rung in (Rung.Z0, Rung.Z3, Rung.Z2_OFFLOAD_OPT, Rung.Z3_OFFLOAD_ALL):
        prepared.before(Candidate(rung, 8, False))
    assert loaded == [("ShareMemCommBuilder", "FusedAdamBuilder"), ("CPUAdamBuilder",)]


def test_a_build_that_prints_more_than_a_pipe_holds_still_finishes(tmp_path: Path) -> None:
    # 256 KiB of compiler chatter: a pipe (64 KiB) nobody reads until exit would block the child for good
    python = _fake_python(tmp_path, 'head -c 262144 /dev/zero | tr "\\0" x >&2; echo "{\\"$6\\": 2.0}"')
    env = {"PATH": os.environ["PATH"], "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    assert ensure_ops_ready("cpu", env=env, python=python, timeout_s=60, names=("FusedAdamBuilder",)) == {
        "FusedAdamBuilder": 2.0
    }


def test_the_ops_directory_is_the_one_torch_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCH_EXTENSIONS_DIR first, else $XDG_CACHE_HOME/torch_extensions (torch/utils/cpp_extension.py
    `_get_build_directory`, torch/_appdirs.py `user_cache_dir`), checked against torch's own answer."""
    from torch.utils import cpp_extension

    from autotune.trial.launch.ops import extensions_dir

    assert extensions_dir({"TORCH_EXTENSIONS_DIR": str(tmp_path / "given")}) == tmp_path / "given"
    moved = tmp_path / "xdg"
    assert extensions_dir({"XDG_CACHE_HOME": str(moved)}) == moved.resolve() / "torch_extensions"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(moved))
    assert extensions_dir() == Path(cpp_extension.get_default_build_root())


def test_every_op_load_is_announced_built_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch may rebuild ops whose .so files exist (other sources, flags or torch version): a line before every
    load, never silent minutes."""
    from autotune import tuner
    from autotune.trial.launch import ops

    lines: list[str] = []
    monkeypatch.setattr(ops, "ensure_ops_ready", lambda device, report, names: {})
    for built in (True, False):
        monkeypatch.setattr(ops, "ops_built", lambda device, names, built=built: built)
        tuner.TrialOps("cpu", lambda event: lines.append(event.message)).before()
    assert len(lines) == 2
    assert lines[0].startswith("loading DeepSpeed ops") and "minutes if torch rebuilds" in lines[0]
    assert lines[1].startswith("building DeepSpeed ops once")
    assert str(ops.extensions_dir()) in lines[0] and str(ops.extensions_dir()) in lines[1]
