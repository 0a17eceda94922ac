"""`tune()`: probe -> model -> estimate -> search with real trials -> emit ds_config.json and a report.

Orchestration only, readable top to bottom in `_tune`: the context (`request/`), a stored answer that still holds
(`tuning/answers.py`), else the search with its trials (`tuning/trials.py`) or the plan-only recommendation, then
the config (`dsconfig/`) and the report (`tuning/tuning_report.py`, written by `report/`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.dsconfig.emit import LaunchCommands, emit_launchers, write_configs
from autotune.errors import NothingFitsError, TrialsFailedError
from autotune.infra.environment import deepspeed_accelerator, preserved_environment
from autotune.infra.paths import cache_dir
from autotune.infra.terminate import Terminated
from autotune.report.assumptions import write_assumptions
from autotune.report.data import TuneReport
from autotune.report.markdown import write_report
from autotune.request.context import TuneContext, check_host_capacity
from autotune.request.tune_request import TuneRequest, output_path
from autotune.search.cache import ResultsCache, StoredAnswer
from autotune.search.records import SearchEvent
from autotune.trial.launch.chooser import JobFacts, TrialLaunchers
from autotune.trial.trial_types import TrialLauncher
from autotune.tuning.answers import cached_answer, memory_bound
from autotune.tuning.for_context import trial_budget
from autotune.tuning.recommend import host_line, passed_over_line, recommend
from autotune.tuning.trials import SearchTerminated, TrialOps, expected_line, launcher_for, search_with_trials
from autotune.tuning.tuning_report import finished_report, no_trial_completed, own_command_entry, report_of

__all__ = ["TuneRequest", "TuneResult", "ds_config_for", "tune", "world_size_for"]

RESULTS_FILE = "results.sqlite"  # inside --cache-dir (a directory, as for the hook)


@dataclass(kw_only=True)
class TuneResult:
    """What `tune()` returns; `report.to_json()` is autotune-report.json (without its picture)."""

    verified: bool  # True when the choice ran for real; False for a plan-only recommendation
    candidate: Candidate | None
    ds_config: dict | None
    config_path: Path | None
    hf_config_path: Path | None
    report_path: Path | None
    report_json_path: Path | None
    launch: LaunchCommands | None
    samples_per_s: float | None
    trials_launched: int
    from_cache: bool
    elapsed_s: float
    stop_reason: StopReason = StopReason.NO_BETTER
    report: TuneReport | None = field(repr=False, default=None)  # None only from callers that wrote no report


def _results_cache(request: TuneRequest) -> ResultsCache | None:
    if not request.output.use_cache:
        return None
    directory = Path(request.output.cache_dir) if request.output.cache_dir else cache_dir()
    return ResultsCache(directory / RESULTS_FILE)


def tune(
    request: TuneRequest | None = None,
    *,
    launcher: TrialLauncher | TrialLaunchers | JobFacts | None = None,
    observe: Callable[[SearchEvent], None] = lambda event: None,
    **options: object,
) -> TuneResult:
    """Find the fastest config that fits and write it; `tune(model="gpt2", gpus=8)` or `tune(TuneRequest.of(...))`.

    `launcher`: a launcher of the caller's (every trial runs there), or the job's facts from which the one
    launcher chooser decides (trial/launch/chooser.py; the hook's), or None: the facts of this request and process.
    Raises UserError on bad input and NothingFitsError when no candidate fits. The caller's process is left as
    it was found: os.environ, and DeepSpeed's accelerator choice, are restored on the way out.
    """
    request = request or TuneRequest.of(**options)
    with preserved_environment(), deepspeed_accelerator("cpu"):
        return _tune(request, launcher, observe)


def _tune(
    request: TuneRequest,
    launcher: TrialLauncher | TrialLaunchers | JobFacts | None,
    observe: Callable[[SearchEvent], None],
) -> TuneResult:
    started = time.monotonic()
    ctx = TuneContext.build(request)
    if ctx.verified:
        check_host_capacity(request, ctx.target)
    cache = _results_cache(request)
    try:
        return _tune_with(ctx, request, cache, launcher, observe=observe, started=started)
    except Terminated as stopped:  # SIGTERM/SIGINT: say whether a rerun finds the finished trials
        stopped.resumable = cache is not None and not cache.untrusted
        raise


def _tune_with(
    ctx: TuneContext,
    request: TuneRequest,
    cache: ResultsCache | None,
    launcher: TrialLauncher | TrialLaunchers | JobFacts | None,
    *,
    observe: Callable[[SearchEvent], None],
    started: float,
) -> TuneResult:
    out_path = output_path(request.output.out)
    report_dir = Path(request.output.report_dir) if request.output.report_dir else Path(request.output.out).parent
    if cache and ctx.verified and (hit := cached_answer(ctx, cache)):
        return _from_cache(ctx, hit, out_path, report_dir, started=started)
    outcome = None
    terminated: SearchTerminated | None = None  # SIGTERM mid-search: everything is written, then it is re-raised
    plan_data = None
    plan_notes: list[str] = []  # plan-only: the pick's host need and micro-batch, beside the recommendation
    if ctx.verified:
        ours = launcher is None or isinstance(launcher, JobFacts)  # the one chooser's (trial/launch/chooser.py)
        ops = TrialOps(request.hardware.device, observe) if ours else None
        trials_allowed = trial_budget(ctx)
        observe(SearchEvent("prepare", message=expected_line(ctx, ops, trials_allowed), trial_budget=trials_allowed))
        if ops is not None:
            ops.before()  # the ops every trial loads, before the trial workers start
        # --time-budget bounds the search from here: a fresh machine's first op builds are a one-time cost said apart
        # (minutes, and over 10 minutes with other builds beside them on the loaded 2-core machine: our measurement)
        budget = request.search.time_budget_s
        deadline = time.monotonic() + budget if budget is not None else None
        try:
            with launcher_for(request, launcher, observe) as chosen:
                outcome = search_with_trials(ctx, cache, chosen, observe, ops=ops, deadline=deadline)
                outcome.process_starts = chosen.process_starts  # warm workers count their starts
        except SearchTerminated as stop:  # trials stopped by now (the launcher's finally)
            if stop.outcome.best is None:
                raise
            outcome, terminated = stop.outcome, stop
        candidate = outcome.best.candidate if outcome.best else None
        if candidate is None and (failed := no_trial_completed(outcome)):
            report = report_of(ctx, outcome=outcome, elapsed_s=time.monotonic() - started)
            write_report(report, report_dir)
            raise TrialsFailedError(failed)
    else:
        recommendation = recommend(ctx)
        candidate, plan_data = recommendation.candidate, recommendation.plan.to_dict()
        lines = (host_line(recommendation), passed_over_line(recommendation), recommendation.grid_note)
        plan_notes = [line for line in lines if line]
    if candidate is None:
        report = report_of(ctx, outcome=outcome, plan_data=plan_data, elapsed_s=time.monotonic() - started)
        write_report(report, report_dir)
        raise NothingFitsError(f"nothing fits {ctx.target.describe()}: {report.nothing_fits_reason}")
    config = ctx.emitted_config(candidate)
    # The .hf.json is always written: the HF Trainer and accelerate launch paths read it. Not re-validated under
    # SIGTERM: its trial just ran DeepSpeed with this config at this world size, and importing DeepSpeed would
    # spend most of the grace period before SIGKILL (30 s by default in SLURM).
    world, validate = ctx.target.world_size, terminated is None
    config_path, hf_path = write_configs(config, world, out_path, hf=True, base=ctx.hf_base(), validate=validate)
    launch = _launch(ctx, config, candidate, config_path)
    found = report_of(
        ctx,
        candidate=candidate,
        outcome=outcome,
        plan_data=plan_data,
        config_path=config_path,
        hf_path=hf_path,
        launch=launch,
        elapsed_s=time.monotonic() - started,
    )
    report = finished_report(
        ctx, found, candidate=candidate, config=config, config_path=config_path, plan_notes=plan_notes
    )
    write_assumptions(config_path, report)
    report_md, report_json = write_report(report, report_dir)
    if terminated is not None:  # every file a finished tune writes, marked stopped; no answer stored
        written = f"{config_path} (with its .hf.json, .accelerate.yaml, .autotune.json) and {report_md}"
        usable = cache is not None and not cache.untrusted
        resumes = (
            "a rerun resumes from the finished trials" if usable else "no usable results cache: a rerun measures again"
        )
        stopped = Terminated(
            f"{terminated.stopped_by}; wrote the best config verified so far ({candidate.describe()}):"
            f" {written}, marked stopped ({resumes})",
            signum=terminated.signum,
        )
        stopped.files_written = True
        raise stopped from None
    if cache and outcome is not None:
        answer = StoredAnswer(
            candidate=candidate,
            ds_config=config,
            report=report,
            limit_bytes=ctx.limit_bytes,
            memory_bound=memory_bound(ctx, outcome),
        )
        cache.put_recommendation(ctx.answer_key, answer)
    return TuneResult(
        verified=ctx.verified,
        candidate=candidate,
        ds_config=config,
        config_path=config_path,
        hf_config_path=hf_path,
        report_path=report_md,
        report_json_path=report_json,
        launch=launch,
        samples_per_s=report.choice.samples_per_s if report.choice else None,  # the one pick speed every output states
        trials_launched=outcome.trials_launched if outcome else 0,
        from_cache=False,
        elapsed_s=time.monotonic() - started,
        stop_reason=report.stop_reason,
        report=report,
    )


def ds_config_for(request: TuneRequest, candidate: Candidate) -> dict:
    """The ds_config `tune(request)` emits for `candidate`, the same one its trial ran with.

    For callers whose tuning was cut short (the pre-launch hook): the search reports each verified
    trial as it finishes, and this turns the best of them into the config to write.
    """
    return TuneContext.build(request, outputs=False).emitted_config(candidate)


def world_size_for(request: TuneRequest) -> int:
    """The world size `tune(request)` validates its config at (for callers writing a config themselves)."""
    return TuneContext.build(request, outputs=False).target.world_size


def _launch(ctx: TuneContext, config: dict, candidate: Candidate, config_path: Path) -> LaunchCommands:
    return emit_launchers(
        config,
        candidate,
        config_path,
        ctx.target.gpus_per_node,
        nodes=ctx.target.nodes,
        script=ctx.request.training.script or "train.py",
        optimizer=ctx.request.training.optimizer,
        lora_rank=ctx.request.model.lora_rank,
        kernels=ctx.request.model.kernels,
        device=ctx.request.hardware.device,
        precision=ctx.precision,
    )


def _from_cache(ctx: TuneContext, hit: StoredAnswer, out_path: Path, report_dir: Path, started: float) -> TuneResult:
    candidate, config = hit.candidate, hit.ds_config
    # Not the stored bytes: cached_answer accepted the hit only because its config equals the one this version
    # builds for the candidate now, and that same build was validated by this DeepSpeed version at this world
    # size when the answer was stored (both are in the key). Re-validating would import DeepSpeed (~4 s) to
    # re-check a config that was re-derived, not trusted. Hook-published configs are re-validated (infra/sharing.py).
    world = ctx.target.world_size
    config_path, hf_path = write_configs(config, world, out_path, hf=True, validate=False, base=ctx.hf_base())
    launch = _launch(ctx, config, candidate, config_path)
    report = replace(
        hit.report,
        from_cache=True,
        trials_launched=0,
        config_path=str(config_path),
        hf_config_path=str(hf_path) if hf_path else None,
        launch=launch,
        limit_bytes=ctx.limit_bytes,
        elapsed_s=time.monotonic() - started,
    )
    if ctx.request.training.command:  # the command to train with names this run's config path
        report = replace(report, own_command=own_command_entry(ctx, candidate, config_path))
    write_assumptions(config_path, report)
    report_md, report_json = write_report(report, report_dir, redraw=False)
    return TuneResult(
        verified=True,
        candidate=candidate,
        ds_config=config,
        config_path=config_path,
        hf_config_path=hf_path,
        report_path=report_md,
        report_json_path=report_json,
        launch=launch,
        samples_per_s=report.choice.samples_per_s if report.choice else None,
        trials_launched=0,
        from_cache=True,
        elapsed_s=time.monotonic() - started,
        stop_reason=StopReason.CACHE_HIT,
        report=report,
    )
