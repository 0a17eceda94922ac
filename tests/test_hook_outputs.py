"""The hook leaves at every rank's --out what `tune` leaves at its --out, all naming that --out; waiting
ranks say what they wait for, with timestamps, as the tuner's own lines have them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO
from tests.fakes.hook import TINY, one_node_job

from autotune.hook.coordinate import SharedSlot, coordinate, note_progress
from autotune.hook.env import JobEnv
from autotune.hook.progress import waiting_line
from autotune.hook.run import HookRecord

STAMP = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ autotune: "
TUNE = [a for a in TINY if a != "--json"]


def files_and_modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir() if not p.name.startswith(".")}


def named_paths(report: dict) -> list[Path]:
    """Every file path the report names: its config files, its picture, and those in each launch command."""
    paths = [report["config_path"], report["hf_config_path"], (report.get("picture") or {}).get("path")]
    for command in (report.get("launch") or {}).values():
        paths += [word for word in command.split() if word.startswith("/")]
    return [Path(p) for p in paths if p]


@pytest.mark.slow
def test_two_slurm_ranks_leave_the_files_tune_leaves_and_their_reports_name_them(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cli = [sys.executable, "-m", "autotune"]
    tune_out = ["--cache-dir", str(tmp_path / "c1"), "--out", str(tmp_path / "tune/ds_config.json")]
    tuned = subprocess.run([*cli, *TUNE, *tune_out], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stderr
    ranks = []
    for rank in (0, 1):  # two hook processes of one SLURM job on one node, each with its own --out
        out = ["--cache-dir", str(tmp_path / "c2"), "--out", str(tmp_path / f"rank{rank}/ds_config.json")]
        job_env = {**env, **one_node_job("41", rank), "SLURM_NTASKS": "2"}
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        ranks.append(subprocess.Popen([*cli, "hook", *TUNE, *out], cwd=REPO, env=job_env, **pipes))
    logs = [process.communicate(timeout=600) for process in ranks]
    assert [p.returncode for p in ranks] == [0, 0], logs
    expected = files_and_modes(tmp_path / "tune")
    assert set(expected) >= {"ds_config.json", "ds_config.hf.json", "ds_config.accelerate.yaml",
                             "ds_config.autotune.json", "autotune-report.md", "autotune-report.json"}  # fmt: skip
    if importlib.util.find_spec("matplotlib"):
        assert "autotune-report.png" in expected
    assert set(expected.values()) == {0o644}, expected
    for rank in (0, 1):
        out = tmp_path / f"rank{rank}"
        assert files_and_modes(out) == expected
        report = json.loads((out / "autotune-report.json").read_text())
        assert report["config_path"] == str(out / "ds_config.json")
        for path in named_paths(report):
            assert path.exists() and "staging" not in str(path), path
        assert str(out / "ds_config.json") in (out / "autotune-report.md").read_text()
        assert f"deepspeed_config_file: {out / 'ds_config.hf.json'}" in (out / "ds_config.accelerate.yaml").read_text()
    stderr = "\n".join(err for _, err in logs)
    assert re.search(STAMP + r"started trial 1 ", stderr, re.M), stderr  # the tuner's lines, as under tune
    # the waiting rank's first line comes at once, before or after the tuner has published who it is
    waiting = r"hook: rank [01] waiting for the tuner (on \S+ \(pid \d+\)|\(not started yet\)): "
    assert re.search(STAMP + waiting, stderr, re.M), stderr


def job(rank: int = 3) -> JobEnv:
    return JobEnv(
        "slurm", "9", 2, 4, rank=rank, node_rank=rank // 4, local_rank=rank % 4, nodelist=("n1", "n2"), master_addr="n1"
    )


def test_waiting_line_reads_the_tuners_progress(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k")
    assert waiting_line(slot, job(), 5) == (
        "rank 3 waiting for the tuner (not started yet): preparing (model, probe, DeepSpeed ops), waited 5s"
    )
    slot.leader_path.write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "started": 0}))
    assert "preparing" in waiting_line(slot, job(), 5)
    note_progress(slot, {"trial": 4, "budget": 12, "candidate": "ZeRO-0, micro-batch 8", "since": 1000.0})
    line = waiting_line(slot, job(), 192, now=1065.0)
    assert line == (
        f"rank 3 waiting for the tuner on {os.uname().nodename} (pid {os.getpid()}): trial 4 of at most 12 running"
        " (ZeRO-0, micro-batch 8, for 1m05s), waited 3m12s"
    )


def test_a_waiting_process_reports_at_once_and_every_minute(tmp_path: Path) -> None:
    slot = SharedSlot(tmp_path, "k")
    now = [0.0]
    reports: list[float] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 150:  # the tuner publishes
            record = HookRecord(
                "k", "complete", "{}", "tuned", verified=True, job_id=None, hardware="hw", leader="x", created=0.0
            )
            from autotune.hook.coordinate import publish

            publish(slot, record)

    import filelock

    held = filelock.FileLock(slot.lock_path)  # another process tunes
    tmp_path.mkdir(exist_ok=True)
    with held:
        outcome = coordinate(
            slot, accept=lambda r: True, produce=lambda: pytest.fail("must not tune"), wait_timeout_s=600,
            poll_interval_s=10, clock=lambda: now[0], sleep=sleep, waiting=reports.append,
        )  # fmt: skip
    assert outcome.role == "follower"
    assert reports == [0.0, 60.0, 120.0]
