"""Bad input through the real CLI: one line on stderr, exit 2, no traceback, and before any trial runs.

The battery is the one a new user's session found (tracebacks, hangs, "nothing fits" for a timeout, silent
acceptance); every case must now be refused up front. In-process where the CLI allows it (fast), as a
subprocess where the case is about the process (a hang, the environment, a signal handler).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from tests.conftest import run_cli
from tests.fakes.launchers import FailingLauncher

from autotune import tune
from autotune.cli import main
from autotune.core.ladder import Rung
from autotune.errors import TrialsFailedError
from autotune.tuner import TuneRequest

TINY_CPU = ["--model", "tiny-gpt2", "--device", "cpu", "--seq-len", "32"]


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _gpt2_config(tmp_path: Path, name: str, **fields: object) -> str:
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 2, "n_embd": 8}
    _write(tmp_path / name / "config.json", json.dumps({**config, **fields}).encode())
    return str(tmp_path / name)


def _device_node(path: Path) -> Path:
    """A character device like /dev/null (1, 3) made with mknod where allowed (root with CAP_MKNOD), else a FIFO."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.mkfifo(path)
    return path


def _many_keys(path: Path) -> Path:
    """A 14 MB config with 700k top-level keys: `check` ran past 300 s and 1.6 GB on it."""
    keys = {f"key_{i:07d}": i for i in range(700_000)}
    return _write(path, json.dumps({"train_micro_batch_size_per_gpu": 1, **keys, "x": 0}).encode())


def _cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    a_file = _write(tmp_path / "a_file", b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _write(tmp_path / "latin" / "config.json", b'{"model_type": "gpt2", "n_embd": "\xff\xfe"}')
    _write(tmp_path / "deep" / "config.json", b"[" * 100_000 + b"]" * 100_000)
    plan_t4 = ["--gpu-type", "t4"]
    node = _device_node(tmp_path / "node")
    (tmp_path / "to_stdout").symlink_to("/proc/self/fd/1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ds.json").symlink_to(tmp_path / "elsewhere.json")
    huge_int = _write(tmp_path / "huge_int.json", b'{"train_micro_batch_size_per_gpu": 1%s}' % (b"0" * 5000))
    inf = _write(tmp_path / "inf.json", b'{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1e400}')
    return [
        ([*TINY_CPU, "--out", str(node)], "not a regular file"),
        ([*TINY_CPU, "--out", str(fifo)], "a FIFO, not a regular file"),
        ([*TINY_CPU, "--out", "/dev/full"], "under /dev"),
        ([*TINY_CPU, "--out", str(tmp_path / "to_stdout")], "symlink to /proc/"),
        ([*TINY_CPU, "--out", str(tmp_path / "sub" / "ds.json")], "outside"),
        ([*TINY_CPU, "--cache-dir", "/proc/x"], "--cache-dir /proc/x is under /proc"),
        ([*TINY_CPU, "--report-dir", "/proc/self"], "--report-dir"),
        ([*TINY_CPU, "--report-dir", str(fifo)], "--report-dir"),
        (["plan", "--model", "../x", *plan_t4], "unknown model '../x'"),
        (["plan", "--model", "org/..", *plan_t4], "unknown model 'org/..'"),
        (["plan", "--model", "x" * 5000, *plan_t4], "File name too long"),
        (["check", str(huge_int)], "beyond 64 bits"),
        (["check", str(inf)], "beyond a float's range"),
        (["plan", "--model", "gpt2", *plan_t4, "--config", str(huge_int)], "beyond 64 bits"),
        (["plan", "--model", "gpt2", *plan_t4, "--config", str(inf)], "beyond a float's range"),
        (["check", str(_many_keys(tmp_path / "many.json"))], "700,002 keys"),
        (["check", str(_write(tmp_path / "ok.json", b'{"train_batch_size": 8}')), "--fix", str(node)], "--fix output"),
        (["plan", "--model", _gpt2_config(tmp_path, "neg", n_embd=-5), *plan_t4], "n_embd must be a positive integer"),
        (["plan", "--model", _gpt2_config(tmp_path, "str", n_embd="big"), *plan_t4], "n_embd must be a positive"),
        (["plan", "--model", str(tmp_path / "latin"), *plan_t4], "not UTF-8"),
        (["plan", "--model", str(tmp_path / "deep"), *plan_t4], "nested too deeply"),
        ([*TINY_CPU, "--memory-budget", "1e400"], "--memory-budget"),
        ([*TINY_CPU, "--memory-budget", "nan"], "--memory-budget"),
        ([*TINY_CPU, "--memory-budget", "-2GiB"], "--memory-budget"),
        ([*TINY_CPU, "--max-micro-batch", "0"], "--max-micro-batch"),
        ([*TINY_CPU, "--micro-batches", "0,2"], "--micro-batches"),
        ([*TINY_CPU, "--report-dir", str(a_file / "sub")], "--report-dir"),
        ([*TINY_CPU, "--report-dir", str(a_file)], "--report-dir"),
        ([*TINY_CPU, "--out", str(a_file / "ds.json")], "--out"),
        ([*TINY_CPU, "--out", str(tmp_path)], "is a directory"),
        ([*TINY_CPU, "--cache-dir", str(a_file)], "--cache-dir"),
        ([*TINY_CPU, "--trial-timeout", "0"], "--trial-timeout"),
        ([*TINY_CPU, "--time-budget", "-5"], "--time-budget"),
        ([*TINY_CPU, "--time-budget", "nan"], "--time-budget"),
        ([*TINY_CPU, "--headroom", "nan"], "--headroom"),
        ([*TINY_CPU, "--headroom", "1.5"], "--headroom"),
        ([*TINY_CPU, "--gpu-type", "a100-80gb"], "no meaning with --device cpu"),
        ([*TINY_CPU, "--gpu-memory-fraction", "0.5"], "no meaning with --device cpu"),
        ([*TINY_CPU, "--gpu-memory-fraction", "nan"], "--gpu-memory-fraction"),
        ([*TINY_CPU, "--gpus", "2", "--memory-budget", "100TiB"], "RAM available"),
        ([*TINY_CPU, "--gpus", "100000"], "core"),
        ([*TINY_CPU, "--device", "tpu"], "--device"),
        ([*TINY_CPU, "--precision", "int8"], "--precision"),
        ([*TINY_CPU, "--attention", "xformers"], "--attention"),
        ([*TINY_CPU, "--rungs", "z9"], "z9"),
        (["--model", "gpt2", "--gpu-type", "a100"], "ambiguous"),
        (["--model", "gpt2", "--gpu-type", "h100"], "h100-80gb, h100-pcie"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--memory-budget", "2GiB"], "--memory-budget applies to"),
        (["--model", "gpt2", "--gpu-memory", "80GiB", "--gpu-type", "t4"], "not both"),
        (["--model", "gpt2", "--gpu-memory", "0"], "--gpu-memory"),
        (["plan", "--model", "gpt2", "--gpu-type", "t4", "--seq-len", "4096"], "exceeds the model's 1024"),
        (["check", "/dev/zero"], "not a regular file"),
        (["check", str(fifo)], "not a regular file"),
        (["check", str(tmp_path / "missing.json")], "not found"),
    ]


def test_every_bad_input_is_one_line_and_exit_2_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, fragment in _cases(tmp_path):
        with pytest.raises(SystemExit) as exited:
            main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2, (args, err)
        assert err and err[-1].startswith("autotune: error: ") and fragment in err[-1], (args, err)
        assert not any("Traceback" in line for line in err), args
    assert not list(tmp_path.rglob("ds_config*.json")) and not list(tmp_path.rglob("autotune-report*"))
    node = os.lstat(tmp_path / "node").st_mode
    assert (stat.S_ISCHR(node) or stat.S_ISFIFO(node)) and not list(tmp_path.glob("node.*"))
    assert not (tmp_path / "elsewhere.json").exists()


@pytest.mark.parametrize(
    "args,env,fragment",
    [
        (["--cache-dir", "{a_file}"], {}, "--cache-dir"),
        (["--wait-timeout", "-1"], {}, "--wait-timeout"),
        (["--wait-timeout", "nan"], {}, "--wait-timeout"),
        (["--nodelist", "n[1-100000000]", "--nodes", "100000000"], {}, "more than 65536 hosts"),
        ([], {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "5"}, "node rank 5"),
        (
            [],
            {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "PATH": "/nonexistent"},
            "srun",
        ),
        (["--trial-timeout", "0"], {}, "--trial-timeout"),
        (["--out", "/dev/full"], {}, "--out /dev/full is under /dev"),
        (["--out", "{a_file}/ds.json"], {}, "--out"),
        (["--cache-dir", "/proc/x"], {}, "--cache-dir /proc/x is under /proc"),
    ],
)
def test_hook_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], env: dict, fragment: str) -> None:
    a_file = _write(tmp_path / "a_file", b"x")
    argv = [a.format(a_file=a_file) for a in args]
    done = run_cli("hook", *TINY_CPU, "--memory-budget", "1GiB", "--out", str(tmp_path / "ds.json"), *argv, env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1].startswith("autotune: error: ") and fragment in lines[-1], lines
    assert "Traceback" not in done.stderr and not (tmp_path / "ds.json").exists()


def test_numbers_without_a_unit_are_gib_and_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--model", "gpt2", "--gpu-memory", "80", "--json"])
    captured = capsys.readouterr()
    assert exited.value.code == 0
    assert "--gpu-memory 80 read as 80 GiB" in captured.err
    assert json.loads(captured.out)["target"]["free_memory_bytes"] == 80 * 2**30


def test_t5_takes_longer_sequences_and_says_the_decoder_length(tmp_path: Path) -> None:
    """T5 has relative positions: 1024 tokens are allowed, and the report says the decoder uses --seq-len too."""
    out = tmp_path / "ds.json"
    result = tune(TuneRequest.of(model="t5-3b", gpus=8, gpu_type="a100-80gb", seq_len=1024, out=str(out)))
    assert result.report.seq_len == 1024
    assert any("decoder" in note for note in result.report.notes)


@pytest.mark.parametrize("status", ["timeout", "error"])
def test_trials_that_never_complete_are_not_reported_as_nothing_fits(tmp_path: Path, status: str) -> None:
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="1GiB", seq_len=32, rungs=(Rung.Z0, Rung.Z2),
        out=str(tmp_path / "ds.json"), use_cache=False,
    )  # fmt: skip
    launcher = FailingLauncher(status)
    with pytest.raises(TrialsFailedError, match=f"no trial completed.*{status}") as raised:
        tune(request, launcher=launcher)
    assert raised.value.exit_code == 2 and launcher.specs
    assert not (tmp_path / "ds.json").exists()


def test_a_symlinked_out_stays_a_symlink(tmp_path: Path) -> None:
    """The link leads to a file not there yet (a link onto an existing file autotune did not write is refused,
    tests/test_output_symlinks.py)."""
    target = tmp_path / "real" / "ds_config.json"
    target.parent.mkdir()
    link = tmp_path / "ds_config.json"
    link.symlink_to(Path("real") / "ds_config.json")
    tune(TuneRequest.of(model="gpt2", gpu_type="t4", out=str(link)))
    assert link.is_symlink() and json.loads(target.read_text())["train_micro_batch_size_per_gpu"] >= 1


def test_markup_characters_in_the_out_path_are_printed_not_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """rich read `[/]` in --out as a closing tag and raised after the config was written (a traceback, exit 1)."""
    out = tmp_path / "x[" / "]y.json"
    with pytest.raises(SystemExit) as exited:
        main(["--model", "gpt2", "--gpu-type", "t4", "--out", str(out)])
    captured = capsys.readouterr()
    assert exited.value.code == 0 and "Traceback" not in captured.err, captured.err
    assert f"config: {out}" in captured.out and json.loads(out.read_text())["train_micro_batch_size_per_gpu"] >= 1


def test_a_disk_that_fills_while_the_report_is_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on the report's fsync (simulated: the filesystem is not ours to fill): one line, exit 2, no temp file."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if "autotune-report" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SystemExit) as exited:
        main(["--model", "gpt2", "--gpu-type", "t4", "--out", str(tmp_path / "ds.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("autotune: error: cannot write ") and "No space left on device" in err[0]
    assert not list(tmp_path.glob(".*.tmp")) and not (tmp_path / "autotune-report.json").exists()
