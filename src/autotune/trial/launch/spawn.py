"""The sequence every cold launcher shares: write the spec, start, watch, stop everything, read the ranks."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from autotune.infra.atomic import atomic_write_json
from autotune.infra.leftovers import claim, owned_tempdir, sweep
from autotune.infra.sharing import make_dirs
from autotune.trial.launch.gpus import nvml_used_bytes, wait_for_release
from autotune.trial.launch.heartbeat import HEARTBEAT_FILE, HeartbeatTiming, OwnerHeartbeat
from autotune.trial.launch.oom_evidence import OomKillWatch
from autotune.trial.launch.processes import BudgetWatch, new_tag, spawn, stop_processes, trial_env, wait_for
from autotune.trial.launch.shm import remove_segments
from autotune.trial.outcome import LaunchOutcome, build_result
from autotune.trial.rank_report import log_path, read_reports
from autotune.trial.trial_types import TrialResult, TrialSpec

WORKER_MODULE = "autotune.trial.worker.main"


@contextmanager
def trial_directory(workdir: Path | None) -> Iterator[Path]:
    """A fresh directory per trial, owned by this process (infra/leftovers.py: a SIGKILLed owner's are removed
    by the next run). Under `workdir` (shared with other nodes) it is kept after the trial for its logs,
    until the next run, unless the trial was interrupted; otherwise a temp dir removed afterwards."""
    if workdir is not None:
        sweep(Path(workdir), "trial-")
        path = make_dirs(Path(workdir)) / f"trial-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        claim(path)
        try:
            yield path
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return
    path = owned_tempdir("autotune-trial-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def worker_args(
    spec_path: Path,
    out_dir: Path,
    launched_at: float,
    owner_pid: int | None = None,
    *,
    heartbeat: HeartbeatTiming = HeartbeatTiming(),
) -> list[str]:
    """owner_pid: workers on this host exit when that process (the tuner) dies; not for remote ranks. Every rank,
    on any node, exits once the trial directory's heartbeat (renewed by `launch_trial`) stands still."""
    args = ["--spec", str(spec_path), "--out", str(out_dir), "--launched-at", f"{launched_at:.6f}"]
    args += heartbeat.worker_args(out_dir / HEARTBEAT_FILE)
    return args if owner_pid is None else [*args, "--owner-pid", str(owner_pid)]


@dataclass(frozen=True)
class LaunchPlan:
    """How one launcher starts its share of a trial's ranks."""

    command: Callable[[Path, Path, float], list[str]]  # (spec path, out dir, launch time) -> argv
    ranks: range  # the ranks this launcher starts and answers for
    env: Mapping[str, str]
    rank_exit_codes: Callable[[int | None, str], dict[int, int]]  # (launcher exit code, its log) -> per rank
    master_port: int | None = None  # the rendezvous port, whose CPU all-reduce segments go after the trial (shm.py)
    heartbeat: HeartbeatTiming = field(default_factory=HeartbeatTiming)  # what `command`'s worker_args were given


def launch_trial(
    spec: TrialSpec, plan: LaunchPlan, trial_dir: Path, poll_s: float = 0.1, kill_grace_s: float = 5.0
) -> TrialResult:
    spec_path = atomic_write_json(trial_dir / "spec.json", spec.to_dict())
    tag = new_tag()
    launcher_log = trial_dir / "launcher.log"
    gpus_before = nvml_used_bytes() if spec.device == "cuda" else None
    launched_at = time.time()
    started = time.monotonic()
    oom_watch = OomKillWatch.start()
    with OwnerHeartbeat(trial_dir / HEARTBEAT_FILE, plan.heartbeat.interval_s):  # while the ranks may run
        process = spawn(
            plan.command(spec_path, trial_dir, launched_at),
            trial_env(plan.env, tag, spec.device, spec.nprocs_per_node),
            launcher_log,
            trial_dir,
        )
        budget = None
        if spec.device == "cpu" and spec.host_memory_budget_bytes:
            budget = BudgetWatch(trial_dir, plan.ranks, spec.host_memory_budget_bytes)
        try:
            waited = wait_for(process, started + spec.timeout_s, poll_s, budget=budget)
        finally:
            stop_processes(process, tag, kill_grace_s)
            wait_for_release(gpus_before)
            if spec.device == "cpu" and plan.master_port is not None:
                remove_segments([plan.master_port], since=launched_at)
    log_text = launcher_log.read_text(errors="replace")
    exit_codes = plan.rank_exit_codes(process.returncode, log_text)
    outcome = LaunchOutcome(
        ranks=plan.ranks,
        wall_s=time.monotonic() - started,
        timed_out=waited.timed_out,
        budget_breach=waited.breach,
        exit_codes=exit_codes,
        logs={rank: log_path(trial_dir, rank) for rank in plan.ranks},
        launcher_log=launcher_log,
        oom_evidence=oom_watch.explain(exit_codes, trial_dir, plan.ranks),
    )
    return build_result(spec, read_reports(trial_dir, plan.ranks), outcome)
