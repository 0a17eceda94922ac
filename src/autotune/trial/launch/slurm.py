"""Several nodes inside a SLURM allocation: one srun step, one task per GPU, ranks from SLURM_* in the worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.errors import UserError
from autotune.trial.launch.heartbeat import HeartbeatTiming
from autotune.trial.launch.processes import own_trial_env
from autotune.trial.launch.spawn import WORKER_MODULE, LaunchPlan, launch_trial, trial_directory, worker_args
from autotune.trial.trial_types import TrialResult, TrialSpec

DEFAULT_MASTER_PORT = 29500
# "srun: error: node7: task 1: Killed", "srun: error: node7: tasks 0-3,5: Exited with exit code 1"
_SRUN_TASK_FAILURE = re.compile(r"tasks?\s+([\d,\-]+):\s*(Killed|Out Of Memory|Exited with exit code (\d+))")
_SIGKILL_EXIT = -9


def _task_ids(text: str) -> list[int]:
    ids: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return ids


def srun_exit_codes(log_text: str) -> dict[int, int]:
    """Per-task failures srun reports; "Killed" and cgroup "Out Of Memory" both read as SIGKILL."""
    codes: dict[int, int] = {}
    for tasks, _how, exit_code in _SRUN_TASK_FAILURE.findall(log_text):
        for task in _task_ids(tasks):
            codes[task] = int(exit_code) if exit_code else _SIGKILL_EXIT
    return codes


# srun's own words when the allocation cannot hold the step (SLURM 22.05 src/srun/libsrun, observed here)
_STEP_REFUSED = re.compile(
    r"srun: error: (Unable to create step for job \S+ (?:More processors requested than permitted|Requested node"
    r" configuration is not available|Memory required by task is not available).*|Only allocated \d+ nodes asked for"
    r" \d+.*)"
)


def step_refusal(log_text: str) -> str | None:
    """srun's reason when the allocation cannot hold the trial's step, else None."""
    match = _STEP_REFUSED.search(log_text)
    return match.group(1).strip() if match else None


def first_hostname(nodelist: str, run: Callable[..., str] | None = None) -> str:
    """The allocation's first host (the rendezvous master), expanded by scontrol as SLURM itself does."""
    run = run or (lambda *cmd: subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    hosts = run("scontrol", "show", "hostnames", nodelist).split()
    if not hosts:
        raise UserError(f"scontrol expanded SLURM_JOB_NODELIST={nodelist!r} to no host")
    return hosts[0]


def srun_command(srun: str, python: str, spec: TrialSpec, worker: list[str]) -> list[str]:
    return [
        srun,
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.world_size}",
        f"--ntasks-per-node={spec.nprocs_per_node}",
        "--kill-on-bad-exit=1",  # one rank failing ends the step: a trial fails if any rank fails
        "--export=ALL",
        python, "-m", WORKER_MODULE, *worker,
    ]  # fmt: skip


class SlurmLauncher:
    """srun across the current allocation (run the tuner inside salloc/sbatch).

    The trial directory must be on a filesystem every node sees: ranks write their results there.
    """

    def __init__(
        self,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        *,
        srun: str = "srun",
        master_addr: str | None = None,  # default: first host of SLURM_JOB_NODELIST
        master_port: int = DEFAULT_MASTER_PORT,
        poll_interval_s: float = 0.5,
        kill_grace_s: float = 10.0,
        heartbeat: HeartbeatTiming = HeartbeatTiming(),  # trial/launch/heartbeat.py
    ) -> None:
        self.python = python
        self.env = dict(env or {})
        self.workdir = workdir or Path(os.environ.get("SLURM_SUBMIT_DIR", ".")) / "autotune-trials"
        self.srun = srun
        self.master_addr = master_addr
        self.master_port = master_port
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self.heartbeat = heartbeat

    def run(self, spec: TrialSpec) -> TrialResult:
        with trial_directory(self.workdir) as trial_dir:
            result = launch_trial(
                spec, self.plan(spec), trial_dir, self.poll_interval_s, kill_grace_s=self.kill_grace_s
            )
            refused = step_refusal((trial_dir / "launcher.log").read_text(errors="replace"))
        if refused:
            # not this config's fault: every trial would fail the same way, so stop with one clear error
            raise UserError(
                f"srun cannot start the trial's {spec.world_size} task(s) ({spec.nodes} node(s) x"
                f" {spec.nprocs_per_node}) in SLURM job {os.environ.get('SLURM_JOB_ID', '?')}: {refused}; the"
                f" allocation is smaller than the tuning needs (submit with --nodes={spec.nodes}"
                f" --ntasks-per-node={spec.nprocs_per_node})"
            )
        return result

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        env = own_trial_env({**os.environ, **self.env})
        if "SLURM_JOB_ID" not in env:
            raise UserError("SlurmLauncher needs a SLURM allocation (run inside salloc or sbatch)")
        master_addr = self.master_addr or first_hostname(env.get("SLURM_JOB_NODELIST", ""))
        env.update(MASTER_ADDR=master_addr, MASTER_PORT=str(self.master_port))
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # the worker must take its rank from SLURM_*
            env.pop(name, None)
        return LaunchPlan(
            command=lambda spec_path, out, at: srun_command(
                self.srun, self.python, spec, worker_args(spec_path, out, at, heartbeat=self.heartbeat)
            ),
            ranks=range(spec.world_size),
            env=env,
            rank_exit_codes=lambda _code, log: srun_exit_codes(log),
            heartbeat=self.heartbeat,
        )
