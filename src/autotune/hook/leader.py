"""What the one tuning process does: tune, and whatever happens, publish a record every rank can act on.

The job must never start with a broken config. So a crash or an exhausted time budget still ends in
a config when one can be justified: the best one verified by a trial so far, else the plan-only
recommendation for the probed hardware, each marked as a fallback (the CLI warns loudly and
`--strict` refuses it). Bad input and "nothing fits" end in a failed record instead, so every rank
fails with the same message rather than each re-running the same doomed tuning.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.errors import NothingFitsError, UserError
from autotune.hook.coordinate import HookRecord, RecordStatus
from autotune.hook.env import JobEnv
from autotune.hook.outputs import published_outputs
from autotune.infra.leftovers import owned_tempdir, sweep
from autotune.infra.terminate import Terminated
from autotune.report.assumptions import read_assumptions
from autotune.report.markdown import REPORT_STEM
from autotune.request.tune_request import memory_size

if TYPE_CHECKING:
    from autotune.core.ladder import Candidate
    from autotune.request.tune_request import TuneRequest
    from autotune.search.records import SearchEvent, TrialRecord
    from autotune.trial.launch.chooser import JobFacts
    from autotune.trial.trial_types import TrialLauncher
    from autotune.tuner import TuneResult

TuneFn = Callable[..., "TuneResult"]  # tune(request, launcher=..., observe=...)


class BestVerified:
    """Observer of the search: keeps the fastest trial that ran within headroom, and counts launches."""

    def __init__(self, forward: Callable[[SearchEvent], None] = lambda event: None) -> None:
        self.forward = forward
        self.record: TrialRecord | None = None
        self.launched = 0
        self.trial_budget: int | None = None  # the search's, as the tuner says it before the first trial

    def __call__(self, event: SearchEvent) -> None:
        self.forward(event)
        if event.trial_budget is not None:
            self.trial_budget = event.trial_budget
        record = event.record
        if event.kind != "trial_end" or record is None:
            return
        self.launched += 0 if record.from_cache else 1
        if not record.within_headroom:
            return
        speed = record.result.samples_per_s or 0.0
        if self.record is None or speed > (self.record.result.samples_per_s or 0.0):
            self.record = record


def probed_plan_memory(tuning: TuneRequest) -> tuple[int, bool] | None:
    """Memory per rank to plan for when no trial verified anything: the smallest free GPU here, or the
    CPU backend's budget per rank."""
    if tuning.hardware.device == "cpu":
        ranks = tuning.hardware.gpus or 1
        budget = tuning.hardware.memory_budget
        per_rank = memory_size(budget, "--memory-budget") if budget else psutil.virtual_memory().available // ranks
        return per_rank, True
    from autotune.hardware.machine_probe import probe_gpus

    gpus, _, _ = probe_gpus()
    if not gpus:
        return None
    return min(g.free_bytes for g in gpus), all(g.bf16 for g in gpus)


def real_tune(request: TuneRequest, **kwargs: Any) -> TuneResult:
    from autotune.tuner import tune

    return tune(request, **kwargs)


def _ds_config_for(request: TuneRequest, candidate: Candidate) -> dict:
    from autotune.tuner import ds_config_for

    return ds_config_for(request, candidate)


@dataclass(frozen=True)
class LeaderJob:
    """Everything the tuning process needs; `tuning` already carries the job's ranks, nodes and cache."""

    key: str
    job: JobEnv
    hardware: str
    tuning: TuneRequest
    launcher_factory: Callable[[], TrialLauncher | JobFacts | None] = lambda: None  # called by the tuner only
    observe: Callable[[SearchEvent], None] = lambda event: None
    tune_fn: TuneFn = real_tune

    def record(
        self, status: RecordStatus, config_text: str | None, source: str, verified: bool, **extra: Any
    ) -> HookRecord:
        return HookRecord(
            key=self.key,
            status=status,
            config_text=config_text,
            source=source,
            verified=verified,
            job_id=self.job.job_id,
            hardware=self.hardware,
            leader=f"{socket.gethostname()} pid {os.getpid()}",
            created=time.time(),
            **extra,
        )


def _details(result: TuneResult) -> dict:
    report = result.report
    return {
        "trials_launched": result.trials_launched,
        "samples_per_s": result.samples_per_s,
        "stop_reason": result.stop_reason.value,
        "stop_message": report.stop_message if report else None,
        "choice": report.choice.description if report and report.choice else None,
        "from_cache": result.from_cache,
    }


def _outputs(result: TuneResult, staged: Path) -> dict:
    """The record's `outputs` (hook/outputs.py): what every process writes beside its --out."""
    picture = staged.parent / f"{REPORT_STEM}.png"
    return published_outputs(result.candidate, result.report if result.report_path else None, staged, picture)


def _from_result(leader: LeaderJob, result: TuneResult, staged: Path) -> HookRecord:
    text = staged.read_text()
    details = {**_details(result), "outputs": _outputs(result, staged)}
    if not result.verified:
        warning = "plan-only recommendation: no trial verified it"
        return leader.record("fallback", text, "plan only", False, warning=warning, details=details)
    if result.stop_reason is StopReason.TIME_BUDGET:  # the hook's --time-budget: tuning was cut short
        warning = f"tuning stopped early ({details['stop_message']}): this is the best config verified so far"
        return leader.record("fallback", text, "best verified so far", True, warning=warning, details=details)
    source = "results cache" if result.from_cache else "tuned"
    return leader.record("complete", text, source, True, details=details)


def _budget_ran_out(tuning: TuneRequest, started: float, best: BestVerified) -> bool:
    budget = tuning.search.time_budget_s
    trials = best.trial_budget  # the search's, given or derived, as the tuner said it before the first trial
    spent = trials is not None and best.launched >= trials
    return spent or (budget is not None and time.monotonic() - started >= budget)


def _best_verified(
    leader: LeaderJob, reason: str, best: BestVerified, staged: Path, validate: bool = True, **details: Any
) -> HookRecord:
    """validate=False only under SIGTERM: importing DeepSpeed here costs 10-20 s of a 30 s grace, and its
    trial already ran DeepSpeed with exactly this config at this world size (every reader re-validates)."""
    from autotune.dsconfig.emit import write_configs

    assert best.record is not None
    candidate = best.record.candidate
    write_configs(_ds_config_for(leader.tuning, candidate), leader.job.world_size, staged, validate=validate)
    details = {"trials_launched": best.launched, "samples_per_s": best.record.result.samples_per_s, **details}
    details["outputs"] = published_outputs(candidate, None, staged, None)
    warning = f"{reason}; wrote the best config verified so far ({candidate.describe()})"
    return leader.record("fallback", staged.read_text(), "best verified so far", True, warning=warning, details=details)


def _fallback(leader: LeaderJob, reason: str, best: BestVerified, staged: Path) -> HookRecord:
    """Best verified so far, else plan-only; a failed record when neither can be had."""
    tuning = leader.tuning
    if best.record is not None:
        return _best_verified(leader, reason, best, staged)
    memory = probed_plan_memory(tuning)
    if memory is None:
        return leader.record("failed", None, "none", False, error_kind="failed", error=f"{reason}; no GPU to plan for")
    per_rank, bf16 = memory
    plan_request = tuning.updated(
        device="cuda",
        gpu_type=None,
        gpu_memory=f"{per_rank}B",  # exact bytes (a bare number would be GiB)
        memory_budget=None,
        gpu_memory_fraction=None,
        precision=tuning.training.precision or ("bf16" if bf16 else "fp16"),
        use_cache=False,
    )
    try:
        result = leader.tune_fn(plan_request)
    except (UserError, NothingFitsError) as error:
        kind = "user" if isinstance(error, UserError) else "nothing_fits"
        return leader.record("failed", None, "none", False, error_kind=kind, error=f"{reason}; plan-only: {error}")
    details = {**_details(result), "trials_launched": best.launched, "outputs": _outputs(result, staged)}
    warning = f"{reason}; wrote the plan-only recommendation for {format_bytes(per_rank)} per rank, NOT verified"
    return leader.record("fallback", staged.read_text(), "plan only", False, warning=warning, details=details)


def tune_and_record(leader: LeaderJob, staging_parent: Path) -> HookRecord:
    """Tune for the job (config and report staged in a private directory) and turn any outcome into a record.

    The record carries what the tuner wrote there (hook/outputs.py), among it the `ds_config.autotune.json`
    beside the staged config, so every process writes the same files at its own --out and `autotune check`
    there asks the question the tuner answered."""
    sweep(staging_parent, "")  # staging dirs of tuners that were SIGKILLed on this host
    staging = owned_tempdir(f"{leader.key}.", staging_parent)
    staged = staging / "ds_config.json"
    try:
        tuning = leader.tuning.updated(out=str(staged), report_dir=str(staging))
        record = _record_outcome(replace(leader, tuning=tuning), staged)
        assumptions = read_assumptions(staged) if record.config_text is not None else None
        return replace(record, details={**record.details, "assumptions": assumptions}) if assumptions else record
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _record_outcome(leader: LeaderJob, staged: Path) -> HookRecord:
    best = BestVerified(leader.observe)
    started = time.monotonic()
    try:
        launcher = leader.launcher_factory()
        result = leader.tune_fn(leader.tuning, launcher=launcher, observe=best)
        return _from_result(leader, result, staged)
    except UserError as error:
        return leader.record("failed", None, "none", False, error_kind="user", error=str(error))
    except NothingFitsError as error:
        if not _budget_ran_out(leader.tuning, started, best):
            return leader.record("failed", None, "none", False, error_kind="nothing_fits", error=str(error))
        reason = f"the budget ran out before any config was verified ({error})"
    except Terminated as stopped:
        # SIGTERM (scancel, time limit, preemption) or SIGINT: trials are stopped by now (the launcher's finally).
        # Publish the best verified config, marked so that only this job's processes take it; with
        # none, publish nothing: a resubmitted job resumes from the finished trials in the cache.
        if best.record is None:
            raise
        return _best_verified(leader, stopped.stopped_by, best, staged, validate=False, terminated=True)
    except Exception as error:  # a crashed tuner must still leave the job a config, or a clear failure
        reason = f"tuning failed: {type(error).__name__}: {error}"
    try:
        return _fallback(leader, reason, best, staged)
    except Exception as error:
        return leader.record("failed", None, "none", False, error_kind="failed", error=f"{reason}; {error}")
