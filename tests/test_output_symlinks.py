"""Issue 46: a symlinked output is followed only where the user could mean it (infra/output_paths.py).

`--out fd1.json` with `fd1.json -> /proc/self/fd/1` and the caller's stdout a log file in the same directory used
to pass (realpath resolves the magic link to the log file, inside the link's directory) and the log was replaced
by the config after a whole tuning. Every case here is refused before any work: exit 2, one line, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import tune
from autotune.cli import main
from autotune.tuner import TuneRequest

TINY_CPU = ["--model", "tiny-gpt2", "--device", "cpu", "--seq-len", "32", "--memory-budget", "1GiB"]


def test_a_link_to_the_callers_stdout_is_refused_and_the_log_untouched(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("the caller's log\n")
    (tmp_path / "fd1.json").symlink_to("/proc/self/fd/1")
    with log.open("a") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "autotune", "tune", *TINY_CPU, "--out", "fd1.json"],
            cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "symlink to /proc/self/fd/1, which leads under /proc" in lines[0]
    assert log.read_text() == "the caller's log\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fd1.json", "job.log"]


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_directory_link_into_proc_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fd/1` with `fd -> /proc/self/fd`: the path as a whole resolves to the caller's stdout, its directory to
    /proc."""
    (tmp_path / "fd").symlink_to("/proc/self/fd")
    assert "under /proc" in _refused(["tune", *TINY_CPU, "--out", str(tmp_path / "fd" / "1")], capsys)


def test_a_link_onto_a_file_autotune_did_not_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    (tmp_path / "ds.json").symlink_to("notes.txt")
    line = _refused(["tune", *TINY_CPU, "--out", str(tmp_path / "ds.json")], capsys)
    assert "onto the existing file" in line and "did not write" in line
    assert notes.read_text() == "mine"


@pytest.mark.parametrize("beside", ["ds.hf.json", "ds.accelerate.yaml", "ds.autotune.json", "autotune-report.md"])
def test_a_symlink_where_a_file_is_written_beside_the_config_is_refused(
    tmp_path: Path, beside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / beside).symlink_to(victim)
    line = _refused(["tune", *TINY_CPU, "--out", str(tmp_path / "ds.json")], capsys)
    assert f"{tmp_path / beside}, written beside it, is a symlink" in line
    assert victim.read_text() == "mine" and not (tmp_path / "ds.json").exists()


def test_a_link_to_a_new_file_and_then_to_autotunes_own_output_is_followed(tmp_path: Path) -> None:
    """A link to a file not there yet is followed (the user's way to keep a stable name); a rerun finds the
    `.autotune.json` the first tuning wrote beside the target and is followed again."""
    target = tmp_path / "real" / "ds_config.json"
    target.parent.mkdir()
    link = tmp_path / "ds_config.json"
    link.symlink_to(Path("real") / "ds_config.json")
    for _ in range(2):
        tune(TuneRequest.of(model="gpt2", gpu_type="t4", out=str(link)))
        assert link.is_symlink() and json.loads(target.read_text())["train_micro_batch_size_per_gpu"] >= 1
    assert (target.parent / "ds_config.autotune.json").is_file()
