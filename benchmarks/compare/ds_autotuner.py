"""DeepSpeed's own autotuner (`deepspeed --autotuning tune`, fast mode) over the shared grid.

Set-up as documented: "autotuning": {"enabled": true, "fast": true} in the config, the training script
launched by the `deepspeed` runner. The space is constrained as far as its config allows: a list of ZeRO
stages and a list of micro-batches (a list replaces its own micro-batch search). With a list, it fixes
the per-rank batch at max(list) x GAS and gives smaller micro-batches more accumulation steps, which is
why autotune and the grid run at the same global batch.

What it really explored is read back from its results dir (one sub-dir per launched experiment, each with
exp.json, cmd.txt, stderr.log and, when it ran, metrics.json), not from its log. Its throughput comes from
its engine's internal forward/backward/step timers over steps start..end_profile_step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from autotune.trial.launch.processes import free_port
from compare.records import ChosenConfig, MethodRun
from compare.settings import SHARED_RUNGS, BenchSettings

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "ds_autotuning_train.py"
DS_REPORTED_BY = "DeepSpeed autotuner: engine timers (forward + backward + step) over its profile steps"
_ERROR_WORDS = ("Error", "error", "ERROR")  # its own failure test (autotuning/utils.py: search_error)


def autotuning_config(base: dict, settings: BenchSettings, workdir: Path) -> dict:
    """The user config handed to the autotuner: autotune's optimizer and precision, lists where it tunes."""
    config = {key: value for key, value in base.items() if key not in ("train_batch_size", "zero_optimization")}
    config["train_micro_batch_size_per_gpu"] = list(settings.micro_batches)
    config["gradient_accumulation_steps"] = 1
    config["zero_optimization"] = {"stage": [rung.stage for rung in SHARED_RUNGS]}
    config["autotuning"] = {
        "enabled": True,
        "fast": True,
        "metric": "throughput",
        "start_profile_step": settings.ds_start_profile_step,
        "end_profile_step": settings.ds_end_profile_step,
        "min_train_micro_batch_size_per_gpu": min(settings.micro_batches),
        "max_train_micro_batch_size_per_gpu": max(settings.micro_batches),
        "results_dir": str(workdir / "autotuning_results"),
        "exps_dir": str(workdir / "autotuning_exps"),
        "overwrite": True,
    }
    return config


def command(settings: BenchSettings, config_path: Path, master_port: int) -> list[str]:
    """Its runner gives experiment i the port master_port + i: start from a free one, not the shared 29500."""
    runner = shutil.which("deepspeed") or "deepspeed"
    script_args = ["--model", settings.model, "--seq-len", str(settings.seq_len), "--device", settings.device]
    if settings.gpu_memory_fraction:
        script_args += ["--gpu-memory-fraction", str(settings.gpu_memory_fraction)]
    return [
        runner, "--autotuning", "tune", "--num_gpus", str(settings.ranks), "--master_port", str(master_port),
        str(TRAIN_SCRIPT), *script_args, "--deepspeed_config", str(config_path),
    ]  # fmt: skip


def first_error(stderr_file: Path) -> str | None:
    """The autotuner's own verdict: the first stderr line with the word error in it marks a failure."""
    if not stderr_file.exists():
        return "stderr.log does not exist"
    for line in stderr_file.read_text(errors="replace").splitlines():
        if any(word in line for word in _ERROR_WORDS):
            return line.strip()[:300]
    return None


def explored_experiments(results_dir: Path) -> list[dict]:
    """One row per experiment directory it launched, in launch order."""
    rows = []
    for exp_file in sorted(results_dir.glob("*/exp.json")):
        exp = json.loads(exp_file.read_text())
        exp_dir = exp_file.parent
        metrics_file = exp_dir / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else None
        ds_config = exp.get("ds_config", {})
        stage = ds_config.get("zero_optimization", {}).get("stage")
        error = first_error(exp_dir / "stderr.log")
        profile = exp.get("name") == "profile_model_info"
        status = "error" if error else ("profile" if profile else ("ok" if metrics else "no_metrics"))
        rows.append(
            {
                "exp_id": exp.get("exp_id"),
                "name": exp.get("name"),
                "launched": (exp_dir / "cmd.txt").exists(),
                "stage": stage,
                "micro_batch": ds_config.get("train_micro_batch_size_per_gpu"),
                "gradient_accumulation": ds_config.get("gradient_accumulation_steps"),
                "status": status,
                "samples_per_s": metrics.get("throughput") if metrics else None,
                "latency_us": metrics.get("latency") if metrics else None,  # its throughput = batch * 1e6 / latency
                "error": error,
            }
        )
    rows.sort(key=lambda row: row["exp_id"] if row["exp_id"] is not None else 1_000_000)
    return rows


def _summary(results_dir: Path) -> dict:
    text = (results_dir / "summary.txt").read_text() if (results_dir / "summary.txt").exists() else ""
    completed = re.search(r"Tuning completed in (\d+):(\d+):(\d+(?:\.\d+)?)", text)
    experiments = re.search(r"Total number of experiments: (\d+)", text)
    return {
        "summary_txt": text,
        "own_duration_s": (
            int(completed[1]) * 3600 + int(completed[2]) * 60 + float(completed[3]) if completed else None
        ),
        "own_experiment_count": int(experiments[1]) if experiments else None,
    }


def _log_lines(log: str) -> list[str]:
    """Its decisions, for the report: which micro-batches per stage, which stages it skipped and why."""
    keep = (
        "tuning_micro_batch_sizes",
        "No need to tune",
        "not runable",
        "might be runable",
        "optimal setup",
        "fast_best_mbs",
    )
    return [line.split("] ", 3)[-1][:300] for line in log.splitlines() if any(k in line for k in keep)]


def _stop(process: subprocess.Popen) -> None:
    """Its runner and every experiment it started live in the session we created for it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_ds_autotuner(settings: BenchSettings, base_config: dict, workdir: Path) -> MethodRun:
    run = MethodRun(method="deepspeed_autotuning", scenario="unconstrained", status="ok", reported_by=DS_REPORTED_BY)
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "ds_autotuning_config.json"
    config_path.write_text(json.dumps(autotuning_config(base_config, settings, workdir), indent=2))
    argv = command(settings, config_path, free_port())
    env = {**os.environ, "DS_ACCELERATOR": settings.device, "PYTHONUNBUFFERED": "1"}
    run.details["command"] = " ".join(argv)
    stdout_path, stderr_path = workdir / "runner.stdout.log", workdir / "runner.stderr.log"
    started = time.perf_counter()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(timeout=settings.ds_timeout_s)
        except subprocess.TimeoutExpired:
            _stop(process)
            run.status, run.error = "failed", f"did not finish within {settings.ds_timeout_s:.0f} s; killed"
    run.wall_s = time.perf_counter() - started
    results_dir = workdir / "autotuning_results"
    run.explored = explored_experiments(results_dir)
    run.launches = sum(row["launched"] for row in run.explored)
    stdout = stdout_path.read_text(errors="replace")
    stderr = stderr_path.read_text(errors="replace")
    run.details.update(_summary(results_dir))
    run.details["returncode"] = process.returncode
    run.details["decisions"] = _log_lines(stdout + stderr)
    if "No such file or directory: 'pdsh'" in stderr:
        run.notes.append("pdsh is not installed: its per-experiment clean-up thread raised (harmless, results intact)")
    optimal = results_dir / "ds_config_optimal.json"
    if run.status == "ok" and optimal.exists():
        ds_config = json.loads(optimal.read_text())
        ds_config.pop("autotuning", None)
        run.chosen = ChosenConfig.from_ds_config(ds_config)
        ok = [row for row in run.explored if row["status"] == "ok" and row["samples_per_s"]]
        run.reported_samples_per_s = max(row["samples_per_s"] for row in ok) if ok else None
    elif run.status == "ok":
        run.status = "failed"
        tail = [line for line in stderr.splitlines() if line.strip()][-15:]
        run.error = f"no ds_config_optimal.json (exit {process.returncode}): " + " | ".join(tail)[-2000:]
    return run.finish()
