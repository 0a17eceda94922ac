"""Own-command mode for real (CPU backend): the user's scripts under tests/scripts/user_jobs/ are tuned end to
end (every trial runs the script; speed comes from DeepSpeed's engine hook), the answer then trains with the
script, and misbehaving scripts are classified with no process left behind."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from tests.conftest import run_cli

from autotune.core.ladder import Candidate, Rung
from autotune.core.measurement import MIN_STEPS
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.trial.launch.processes import one_rank_env
from autotune.trial.launch.shm import SEGMENT_PREFIX, SHM_DIRECTORY, segment_port
from autotune.trial.own_command.script import ScriptLauncher
from autotune.trial.own_command.script_steps import step_times
from autotune.trial.trial_types import TrialSpec

JOBS = Path(__file__).parent / "scripts" / "user_jobs"
RANK_VARIABLES = set(one_rank_env(port=0))
PROFILE = Path(__file__).parents[1] / "profiles" / "models" / "tiny-gpt2.json"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """The user's model as a local config.json, read by the scripts and by `--model` alike."""
    config = json.loads(PROFILE.read_text())["config"]
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    return path


def _survivors(marker: str) -> list[str]:
    """Processes whose command line names this test's directory: a trial's leftovers."""
    found = []
    for process in psutil.process_iter(["cmdline", "pid"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if marker in cmdline and process.pid != os.getpid():
            found.append(cmdline)
    return found


def _tune(tmp_path: Path, model_dir: Path, options: list[str], command: list[str]) -> dict:
    done = run_cli("--model", str(model_dir / "config.json"), "--gpus", "1", "--device", "cpu", "--seq-len", "64",
                   "--no-cache", "-o", str(tmp_path / "out" / "ds_config.json"), "--json", *options, "--", *command,
                   timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _train_with_answer(report: dict, extra: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The printed command as printed (through the shell), in an environment without rank or accelerator
    variables: what a user who pastes it has."""
    command = f"{report['own_command']['train_command']} {shlex.join(extra)}"
    env = {k: v for k, v in os.environ.items() if k not in {*RANK_VARIABLES, "DS_ACCELERATOR"}}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def _assert_trials_ran_the_command(report: dict, script: Path) -> None:
    launched = [t for t in report["trials"] if not t["from_cache"]]
    assert launched and report["trials_launched"] == len(launched)
    for trial in launched:
        result = trial["result"]
        assert result["command"] and str(script) in result["command"]
        if result["status"] == "ok":
            assert result["metric_source"] == "step_wall_clock" and result["samples_per_s"] > 0
            assert len(result["step_times_s"]) >= MIN_STEPS and result["profiled_samples_per_s"] > 0
            assert result["ranks"][0]["host_rss_peak_bytes"] > 100 * 2**20  # a real torch process, seen from outside


@pytest.mark.slow
def test_plain_deepspeed_script_tuned_end_to_end(tmp_path: Path, model_dir: Path) -> None:
    script = JOBS / "plain_deepspeed.py"
    command = [sys.executable, str(script), "--deepspeed_config", "{ds_config}", "--model-config", str(model_dir),
               "--seq-len", "{seq_len}", "--gradient-checkpointing", "{grad_checkpointing}"]  # fmt: skip
    report = _tune(tmp_path, model_dir, ["--micro-batches", "2,8", "--rungs", "z0,z1", "--memory-budget", "3GiB"],
                   command)  # fmt: skip
    _assert_trials_ran_the_command(report, script)
    choice = report["choice"]
    assert choice and choice["samples_per_s"] > 0
    config = json.loads(Path(report["config_path"]).read_text())
    assert "autotuning" not in config  # the answer trains to the end, unlike DeepSpeed's ds_config_optimal.json
    assert config["train_micro_batch_size_per_gpu"] == choice["micro_batch"]
    assert "## Your command" in (tmp_path / "out" / "autotune-report.md").read_text()
    trained = _train_with_answer(report, ["--steps", "3"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads(trained.stdout.strip().splitlines()[-1]) == {"steps": 3, "micro_batch": choice["micro_batch"]}
    assert not _survivors(str(model_dir))


@pytest.mark.slow
def test_hf_trainer_script_moves_over_with_arg_mappings(tmp_path: Path, model_dir: Path) -> None:
    """An existing DeepSpeed Autotuning setup for an HF script: `--deepspeed user.json` whose autotuning
    section maps config keys to Trainer flags; the command is given unchanged."""
    user_config = tmp_path / "ds_user.json"
    user_config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "zero_optimization": {"stage": "auto"}, "bf16": {"enabled": "auto"},
        "autotuning": {"enabled": True, "arg_mappings": {
            "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
            "gradient_accumulation_steps ": "--gradient_accumulation_steps"}},
    }))  # fmt: skip
    script = JOBS / "hf_trainer.py"
    command = [sys.executable, str(script), "--model_config", str(model_dir), "--seq_len", "64",
               "--deepspeed", str(user_config), "--per_device_train_batch_size", "1", "--max_steps", "40",
               "--bf16", "true", "--use_cpu", "true", "--output_dir", str(tmp_path / "hf-out"), "--report_to", "none",
               "--save_strategy", "no", "--logging_steps", "1000", "--dataloader_num_workers", "0"]  # fmt: skip
    report = _tune(tmp_path, model_dir, ["--micro-batches", "4", "--rungs", "z2"], command)
    _assert_trials_ran_the_command(report, script)
    assert report["own_command"]["arg_mappings"] == {
        "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
        "gradient_accumulation_steps": "--gradient_accumulation_steps",
    }
    ran = report["trials"][0]["result"]["command"]
    assert ran[ran.index("--per_device_train_batch_size") + 1] == "4" and str(user_config) not in ran
    assert report["choice"]["micro_batch"] == 4
    config = json.loads(Path(report["config_path"]).read_text())
    assert config["optimizer"]["params"]["lr"] == "auto"  # the user's keys kept for HF to fill
    trained = _train_with_answer(report, ["--max_steps", "3"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert json.loads(trained.stdout.strip().splitlines()[-1])["global_step"] == 3
    assert not _survivors(str(model_dir))


def _fault_spec(micro_batch: int, timeout_s: float = 300.0, budget: int | None = None) -> TrialSpec:
    config = build_ds_config(Candidate(Rung.Z1, micro_batch, False), TrainSettings(world_size=1))
    return TrialSpec(model_config={}, architecture="GPT2LMHeadModel", family="decoder-only", ds_config=config,
                     seq_len=32, device="cpu", timeout_s=timeout_s, host_memory_budget_bytes=budget)  # fmt: skip


def _fault_launcher(model_dir: Path, fault: str) -> ScriptLauncher:
    return ScriptLauncher([sys.executable, str(JOBS / "plain_deepspeed.py"), "--deepspeed_config", "{ds_config}",
                           "--model-config", str(model_dir), "--seq-len", "{seq_len}", "--fault", fault,
                           "--grow-mib", "256"], kill_grace_s=2.0)  # fmt: skip


@pytest.mark.slow  # one DeepSpeed job of the tiny model: about 40 s on the shared 2-core machine
def test_own_command_steps_are_timed_by_wall_clock_and_the_job_stopped_once_known(model_dir: Path) -> None:
    """The step hook times whole optimizer steps of the unchanged script; the tuner stops it once the median is
    known (well before the script's own 400 steps), and the engine's profiled step stays as a secondary figure."""
    script = [sys.executable, str(JOBS / "plain_deepspeed.py"), "--deepspeed_config", "{ds_config}"]
    launcher = ScriptLauncher([*script, "--model-config", str(model_dir), "--seq-len", "{seq_len}", "--steps", "400"])
    spec = replace(_fault_spec(2), max_steps=12)
    result = launcher.run(spec)
    assert result.status == "ok", result.error
    assert result.metric_source == "step_wall_clock" and result.profiled_samples_per_s
    assert MIN_STEPS <= len(result.step_times_s) <= 12 and all(t > 0 for t in result.step_times_s)
    assert result.samples_per_s == pytest.approx(2 / statistics.median(result.step_times_s))
    assert not _survivors(str(model_dir))


def test_step_times_are_the_slowest_ranks_gap_after_the_warm_up() -> None:
    boundaries = [[0.0, 1.0, 2.0, 3.5, 4.5, 5.0], [0.1, 1.2, 2.1, 3.4, 4.6]]
    assert step_times(boundaries, warmup_steps=2) == pytest.approx([1.0, 1.5, 1.2])  # steps 3-5: rank 1 did 5


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "micro_batch", "status", "reason"),
    [
        ("raise", 2, "error", "ValueError: user code failed: bad batch shape"),
        ("early", 2, "incomplete", "without reaching the profiled steps"),
        ("grow", 1, "ok", ""),
        ("grow", 8, "over_budget", "exceeds the host-memory budget"),
        ("hang", 2, "timeout", "all trial processes killed"),
    ],
)
def test_misbehaving_scripts_are_classified_and_leave_nothing(
    model_dir: Path, fault: str, micro_batch: int, status: str, reason: str
) -> None:
    """grow holds micro_batch x 256 MiB: 2 GiB at micro-batch 8, over the 1.5 GiB budget (a job that OOMs
    above some micro-batch); hang sleeps in the training loop until the trial timeout."""
    timeout = 90.0 if fault == "hang" else 600.0
    result = _fault_launcher(model_dir, fault).run(_fault_spec(micro_batch, timeout, budget=3 * 2**29))
    assert result.status == status, result.error
    assert reason in (result.error or "")
    assert result.command and "--fault" in result.command
    assert not _survivors(str(model_dir))


@pytest.mark.slow
@pytest.mark.skipif(not SHM_DIRECTORY.is_dir(), reason="no /dev/shm")
def test_a_deepspeed_launcher_trial_leaves_no_shared_memory_segment(model_dir: Path) -> None:
    """The user's command through `deepspeed` on the CPU backend: the launcher sets LOCAL_SIZE, so each rank makes
    a 66 MiB segment that DeepSpeed never unlinks (trial/launch/shm.py); after the trial none with its port is left."""
    launcher = ScriptLauncher([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1",
                               "--master_port", "{master_port}", str(JOBS / "plain_deepspeed.py"),
                               "--deepspeed_config", "{ds_config}", "--model-config", str(model_dir),
                               "--seq-len", "{seq_len}"], kill_grace_s=2.0)  # fmt: skip
    mine = f"{SEGMENT_PREFIX}_{os.getuid()}_*"
    before = {path.name for path in SHM_DIRECTORY.glob(mine)}
    result = launcher.run(_fault_spec(2))
    assert result.status == "ok", result.error
    port = int(result.command[result.command.index("--master_port") + 1])
    left = {path.name for path in SHM_DIRECTORY.glob(mine)} - before
    assert not [name for name in left if segment_port(name, os.getuid()) == port]
