"""Trials that run the user's own training command instead of our synthetic worker.

The speed is the median wall clock of the command's whole optimizer steps, timed at the engine's step boundaries by
the step hook (trial/own_command/script_steps.py); DeepSpeed's engine-side autotuning metric, switched on in each
trial's
ds_config, stays a secondary figure (`profiled_samples_per_s`): it times one optimizer step of the engine's calls
only, on rank 0. Memory is sampled from outside (trial/own_command/script_memory.py).

Reasoning and sources: trial/README.md#script
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.measurement import MIN_STEPS, enough_steps, steps_until_enough
from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_json
from autotune.trial.launch.gpus import nvml_used_bytes, wait_for_release
from autotune.trial.launch.oom_evidence import OomKillWatch
from autotune.trial.launch.processes import (
    free_port,
    launcher_variables,
    new_tag,
    one_rank_env,
    spawn,
    stop_processes,
    trial_env,
)
from autotune.trial.launch.shm import command_ports, remove_segments
from autotune.trial.launch.spawn import trial_directory
from autotune.trial.outcome import (
    PINNED_HOST_FAILURE,
    BudgetBreach,
    classify_line,
    describe_exit,
    first_error_line,
    is_pinned_path,
    is_sigkill,
    killed_by_signal,
    oom_status,
    traceback_before,
    unexplained_signal,
)
from autotune.trial.own_command.script_command import CommandTemplate, parse_command
from autotune.trial.own_command.script_memory import GpuReader, TreeMemorySampler, visible_gpu_indices
from autotune.trial.own_command.script_steps import hook_env, read_boundaries, step_times
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec, TrialStatus

log = logging.getLogger(__name__)

# DeepSpeed's own defaults (autotuning/constants.py:59,62): profile from step 3, exit after step 6.
START_PROFILE_STEP = 3
END_PROFILE_STEP = 5
METRIC_FILE = "autotuning_metric.json"
STEP_LOG = "steps"  # the step hook's files: steps.rank<R>
WALL_CLOCK_SOURCE = "step_wall_clock"  # TrialResult.metric_source of steps timed by the step hook
CONFIG_FILE = "ds_config.json"
# Environment a job launcher sets per rank; removed before a trial so an outer job's values (the hook runs
# inside torchrun or SLURM jobs) do not leak into the user's command.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                   "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ScriptOutcome:
    """What the parent saw of one run of the user's command."""

    exit_code: int | None
    log_text: str
    metric: dict[str, Any] | None  # the engine's metric file, when rank 0 wrote one
    wall_s: float
    timed_out: bool = False
    breach: BudgetBreach | None = None
    oom_evidence: str | None = None  # trial/launch/oom_evidence.py: the kernel's word that a SIGKILL was its OOM killer
    # whole optimizer steps timed by the step hook (trial/own_command/script_steps.py)
    step_times_s: tuple[float, ...] = ()
    measured: bool = False  # enough steps were timed, so the tuner stopped the command


def classify(outcome: ScriptOutcome, timeout_s: float, end_profile_step: int) -> tuple[TrialStatus, str | None]:
    """Status and reason of one run; the order puts root causes first (an OOM makes peers fail too)."""
    if outcome.timed_out:
        return "timeout", (
            f"no metric within the {timeout_s:g} s trial timeout (the job hung or is too slow to reach step"
            f" {end_profile_step + 1}); all trial processes killed"
        )
    if outcome.breach:
        return "over_budget", outcome.breach.message()
    if outcome.measured:
        return "ok", None  # the tuner stopped it: its steps were timed
    if outcome.metric is not None and outcome.exit_code == 0:
        # Every rank reached the hook's exit; an OOM the script caught itself (auto_find_batch_size) is no failure.
        return "ok", None
    oom = _oom_line(outcome.log_text)
    if oom:
        return oom
    code = -9 if _sigkilled_rank(outcome.log_text) and not is_sigkill(outcome.exit_code) else outcome.exit_code
    if killed_by_signal(code):
        status, why = unexplained_signal(code, outcome.oom_evidence)
        return status, f"a process of the job was {why}"
    error_line = first_error_line(outcome.log_text)
    if outcome.metric is not None:  # rank 0 wrote the metric, yet the job did not exit cleanly
        return (classify_line(error_line), error_line) if error_line else ("ok", None)
    if outcome.exit_code == 0:
        return "incomplete", (
            f"the command exited (code 0) without reaching the profiled steps: DeepSpeed's autotuning hook"
            f" writes its metric after optimizer step {end_profile_step + 1}, so the job ran fewer steps"
            " through a DeepSpeed engine configured with the trial's config (finished early, too few"
            " --max_steps, or never called deepspeed.initialize with it)"
        )
    if error_line:
        return classify_line(error_line), error_line  # "error", or "inconclusive" for the network or file system
    how = describe_exit(outcome.exit_code) if outcome.exit_code is not None else "ended"
    return "error", f"the command {how} before the profiled steps, with no error message"


def _oom_line(log_text: str) -> tuple[TrialStatus, str] | None:
    """The first line of the job's output (any rank) that names an out-of-memory, with its class (outcome.py)."""
    for raw in log_text.splitlines():
        line = raw.strip()
        lowered = line.lower()
        status = oom_status(line)
        if status is None and ("outofmemoryerror" in lowered or ("nccl" in lowered and "out of memory" in lowered)):
            status = "oom_gpu"
        if status == "oom_gpu" and is_pinned_path(traceback_before(log_text, raw)):
            return "oom_host", f"{PINNED_HOST_FAILURE}: {line}"
        if status is not None:
            return status, line
    return None


def _sigkilled_rank(log_text: str) -> bool:
    """A rank killed by SIGKILL as torchrun (`exitcode : -9`) or the deepspeed launcher reports it."""
    lowered = log_text.lower()
    return any(
        marker in lowered for marker in ("exitcode  : -9", "exitcode : -9", "return code = -9", "signal 9 (sigkill)")
    )


def metric_result(
    metric: Mapping[str, Any], spec: TrialSpec, ranks: list[RankMetrics], wall_s: float, command: list[str]
) -> TrialResult:
    """A successful trial from the engine's metric (what it measures: README.md#script)."""
    latency_s = float(metric.get("latency", 0.0)) / 1e6
    throughput = float(metric.get("throughput", 0.0)) or None
    flops = float(metric.get("FLOPS_per_gpu", 0.0) or 0.0)
    tflops = flops / 1e12 if flops > 0 else None
    return TrialResult(
        status="ok",
        ranks=ranks,
        step_times_s=[latency_s] if latency_s > 0 else [],
        samples_per_s=throughput,
        tokens_per_s=throughput * spec.seq_len if throughput else None,
        tflops_per_gpu=tflops,
        mfu=tflops / spec.peak_tflops if tflops and spec.peak_tflops else None,
        wall_s=wall_s,
        command=command,
        metric_source="deepspeed_autotuning",
    )


def wall_clock_result(
    step_times_s: list[float],
    metric: Mapping[str, Any] | None,
    spec: TrialSpec,
    ranks: list[RankMetrics],
    wall_s: float,
    command: list[str],
) -> TrialResult:
    """A successful trial from the command's own optimizer steps (median wall clock of whole steps); the
    engine's one profiled step, when it wrote it, stays beside it as `profiled_samples_per_s`."""
    samples_per_step = int(spec.ds_config["train_batch_size"])
    rate = samples_per_step / statistics.median(step_times_s)
    profiled = (float(metric.get("throughput", 0.0)) or None) if metric else None
    return TrialResult(
        status="ok",
        ranks=ranks,
        step_times_s=list(step_times_s),
        samples_per_s=rate,
        tokens_per_s=rate * spec.seq_len,
        wall_s=wall_s,
        command=command,
        metric_source=WALL_CLOCK_SOURCE,
        profiled_samples_per_s=profiled,
    )


def placeholder_values(spec: TrialSpec, trial_dir: Path, master_port: int) -> dict[str, str]:
    config = spec.ds_config
    precision = "bf16" if (config.get("bf16") or {}).get("enabled") else "fp16" if (
        config.get("fp16") or {}).get("enabled") else "fp32"  # fmt: skip
    return {
        "micro_batch": str(config["train_micro_batch_size_per_gpu"]),
        "grad_accum": str(config.get("gradient_accumulation_steps", 1)),
        "train_batch": str(config["train_batch_size"]),
        "zero_stage": str((config.get("zero_optimization") or {}).get("stage", 0)),
        "grad_checkpointing": "true" if spec.grad_checkpointing else "false",
        "precision": precision,
        "bf16": "true" if precision == "bf16" else "false",
        "fp16": "true" if precision == "fp16" else "false",
        "seq_len": str(spec.seq_len),
        "gpus": str(spec.nprocs_per_node),
        "nodes": str(spec.nodes),
        "world_size": str(spec.world_size),
        "master_port": str(master_port),
        "trial_dir": str(trial_dir / "work"),
    }


class ScriptLauncher:
    """Runs each trial as the user's own command; a TrialLauncher, so the search does not know the difference.

    Every process the command starts carries the trial's tag and is killed afterwards, launcher and ranks
    alike (trial/launch/processes.py). A command that is not a launcher (torchrun, deepspeed, ...) is one rank:
    it gets RANK=0, WORLD_SIZE=1 and a free MASTER_PORT, as the synthetic worker does.
    """

    def __init__(
        self,
        command: Sequence[str] | CommandTemplate,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        *,
        start_profile_step: int = START_PROFILE_STEP,
        end_profile_step: int = END_PROFILE_STEP,
        poll_interval_s: float = 0.2,
        kill_grace_s: float = 5.0,
        read_gpus: GpuReader = nvml_used_bytes,
    ) -> None:
        self.template = command if isinstance(command, CommandTemplate) else parse_command(command)
        if not 0 < start_profile_step <= end_profile_step:
            raise UserError("profile steps must satisfy 0 < start <= end")
        self.cwd = Path(cwd or os.getcwd())
        self.env = dict(env or {})
        self.workdir = workdir
        self.start_profile_step = start_profile_step
        self.end_profile_step = end_profile_step
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self.read_gpus = read_gpus
        self._said_launcher_variables = False

    def trial_config(self, spec: TrialSpec, metric_path: Path) -> dict[str, Any]:
        """The file the trial's command reads: the .hf.json's form for an HF Trainer command, so the trial trains
        with the command's own lr and clipping, as the user's job will (CommandTemplate.consumer)."""
        config = self.template.config_for_consumer(self.template.trial_config(spec.ds_config))
        config["autotuning"] = {
            "enabled": True,
            "start_profile_step": self.start_profile_step,
            "end_profile_step": self.end_profile_step,
            "metric_path": str(metric_path),
        }
        return config

    def run(self, spec: TrialSpec) -> TrialResult:
        refusal = self._refusal(spec)
        if refusal:
            return TrialResult(status="error", error=refusal)
        with trial_directory(self.workdir) as trial_dir:
            return self._run_in(spec, trial_dir)

    def _refusal(self, spec: TrialSpec) -> str | None:
        """Candidates this command cannot express: refused without a launch, with the reason."""
        if spec.nodes > 1:
            return "own-command trials run on this node only (multi-node trials use the synthetic worker)"
        if spec.world_size > 1 and not self.template.starts_ranks():
            return f"{spec.world_size} ranks need a launcher command (torchrun/deepspeed ... with {{gpus}})"
        if spec.grad_checkpointing and not self.template.accepts_grad_checkpointing():
            return "the command has no {grad_checkpointing} placeholder, so checkpointing cannot be tried"
        return None

    def _run_in(self, spec: TrialSpec, trial_dir: Path) -> TrialResult:
        metric_path = trial_dir / METRIC_FILE
        config = self.trial_config(spec, metric_path)
        config_path = atomic_write_json(trial_dir / CONFIG_FILE, config)
        (trial_dir / "work").mkdir()
        port = free_port()
        argv = self.template.render(placeholder_values(spec, trial_dir, port), config_path, config)
        steps_stem = trial_dir / STEP_LOG
        env = hook_env(self._environment(spec, port), steps_stem)
        tag = new_tag()
        sampler = TreeMemorySampler(tag, spec.device, visible_gpu_indices(env, spec.nprocs_per_node), self.read_gpus)
        sampler.start()
        gpus_before = self.read_gpus() if spec.device == "cuda" else None
        log = trial_dir / "command.log"
        started, started_at = time.monotonic(), time.time()
        oom_watch = OomKillWatch.start()
        process = spawn(argv, trial_env(env, tag, spec.device, spec.nprocs_per_node), log, self.cwd)
        timed_out, breach, measured = False, None, False
        try:
            timed_out, breach, measured = self._watch(
                process, spec, sampler, started + spec.timeout_s, steps_stem=steps_stem
            )
        finally:
            stop_processes(process, tag, self.kill_grace_s)
            wait_for_release(gpus_before, read_used=self.read_gpus)
            if spec.device == "cpu":
                remove_segments(command_ports(argv, port), since=started_at)
        outcome = ScriptOutcome(
            exit_code=None if timed_out or breach or measured else process.returncode,
            log_text=log.read_text(errors="replace"),
            metric=_read_metric(metric_path),
            wall_s=time.monotonic() - started,
            timed_out=timed_out,
            breach=breach,
            oom_evidence=oom_watch.evidence(),
            step_times_s=tuple(self._measured_steps(steps_stem, spec)),
            measured=measured,
        )
        ranks = sampler.metrics(range(spec.world_size))
        status, error = classify(outcome, spec.timeout_s, self.end_profile_step)
        if status == "ok" and len(outcome.step_times_s) >= min(MIN_STEPS, spec.max_steps):
            return wall_clock_result(
                list(outcome.step_times_s), outcome.metric, spec, ranks, wall_s=outcome.wall_s, command=argv
            )
        if status == "ok" and outcome.metric is not None:  # the job ended by itself before enough whole steps
            return metric_result(outcome.metric, spec, ranks, outcome.wall_s, command=argv)
        return TrialResult(status=status, error=error, ranks=ranks, wall_s=outcome.wall_s, command=argv)

    def _step_times(self, steps_stem: Path, spec: TrialSpec) -> list[float]:
        """Whole optimizer steps timed so far, after the engine's profiled step (script_steps.py)."""
        return step_times(read_boundaries(steps_stem, spec.world_size), self.end_profile_step + 1)

    def _measured_steps(self, steps_stem: Path, spec: TrialSpec) -> list[float]:
        """The timed steps up to where measuring stops: the job ran on between two polls, and those steps are
        past the trial's cap (`max_steps`, `max_measure_s`) or the point its median was known."""
        return steps_until_enough(self._step_times(steps_stem, spec), spec.max_steps, spec.max_measure_s)

    def _watch(
        self, process: Any, spec: TrialSpec, sampler: TreeMemorySampler, deadline: float, steps_stem: Path
    ) -> tuple[bool, BudgetBreach | None, bool]:
        """Sample memory until the command exits; stop early on timeout, a crossed host budget, or once enough
        whole optimizer steps are timed (the last flag)."""
        budget = spec.host_memory_budget_bytes if spec.device == "cpu" else None
        while process.poll() is None:
            sampler.sample()
            if budget:
                over = {rank: peak for rank, peak in sampler.rank_peaks.items() if peak > budget}
                if over:
                    rank = min(over)
                    return False, BudgetBreach(rank, over[rank], budget), False
            if enough_steps(self._step_times(steps_stem, spec), spec.max_steps, spec.max_measure_s):
                return False, None, True
            if time.monotonic() >= deadline:
                return True, None, False
            time.sleep(self.poll_interval_s)
        return False, None, False

    def _environment(self, spec: TrialSpec, port: int) -> dict[str, str]:
        seen = launcher_variables({**os.environ, **self.env})
        if seen and not self._said_launcher_variables:
            self._said_launcher_variables = True  # once per launcher, not once per trial
            log.warning(
                "autotune: own-command trials keep your environment; an outer launcher's variables seen: %s"
                " (torchrun takes unset options from PET_*; TORCHELASTIC_* are removed)",
                ", ".join(seen),
            )
        env = {
            k: v
            for k, v in {**os.environ, **self.env}.items()
            if k not in _RANK_VARIABLES and not k.startswith("TORCHELASTIC_")  # e.g. the agent store of an outer job
        }
        if not self.template.starts_ranks():
            env.update(one_rank_env(port=port))
        return env


def _read_metric(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def final_command(template: CommandTemplate, spec: TrialSpec, config_path: Path) -> list[str]:
    """The user's command with the chosen config, for the report: how to train with the answer."""
    values = placeholder_values(spec, config_path.parent, 29500)  # torchrun's and DeepSpeed's default port
    values["trial_dir"] = "output"
    values["master_port"] = "29500"
    return template.render(values, config_path, spec.ds_config)


__all__ = ["ScriptLauncher", "classify", "final_command"]
