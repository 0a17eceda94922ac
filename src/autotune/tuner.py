"""`tune()`: probe -> model -> estimate -> search with real trials -> emit ds_config.json and a report."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.core.batch import describe_global_batch
from autotune.core.choices import Device
from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.core.versions import library_versions
from autotune.dsconfig.base import placeholder_notes
from autotune.dsconfig.emit import LaunchCommands, emit_launchers, write_configs
from autotune.errors import NothingFitsError, TrialsFailedError, UserError
from autotune.infra.environment import deepspeed_accelerator, preserved_environment
from autotune.infra.paths import cache_dir
from autotune.modes.applies import approximation
from autotune.modes.search_view import ModeRecord
from autotune.report.assumptions import write_assumptions
from autotune.report.data import (
    Batch,
    Choice,
    HostNeed,
    ModeEntry,
    OwnCommand,
    Skipped,
    Training,
    TrialEntry,
    TuneReport,
    VerdictEntry,
)
from autotune.report.markdown import write_report
from autotune.request.context import TuneContext, check_host_capacity
from autotune.request.tune_request import TuneRequest, output_path, uses_warm_workers
from autotune.search.cache import ResultsCache, StoredAnswer
from autotune.search.for_context import context_search, mode_facts, planned_modes
from autotune.search.recommend import host_line, passed_over_line, recommend
from autotune.search.records import SearchEvent, SearchOutcome, TrialRecord
from autotune.training.checks import training_choices_report
from autotune.trial.plausible import Bounds
from autotune.trial.types import DETERMINISTIC_STATUSES, TrialLauncher, TrialResult, TrialSpec

__all__ = ["TuneRequest", "TuneResult", "ds_config_for", "tune", "world_size_for"]

log = logging.getLogger(__name__)

RESULTS_FILE = "results.sqlite"  # inside --cache-dir (a directory, as for the hook)


@dataclass
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
    if not request.use_cache:
        return None
    directory = Path(request.cache_dir) if request.cache_dir else cache_dir()
    return ResultsCache(directory / RESULTS_FILE)


class TrialOps:
    """DeepSpeed's JIT ops, loaded before the first trial that needs them, in a child with the trials'
    interpreter and environment (building there if needed), so no trial timeout absorbs a build or a stale
    build lock. CPU Adam waits for the first optimizer-offload trial: a search that never offloads (the README
    demo) never builds it; a build never runs beside a trial, whose speed it would slow."""

    def __init__(self, device: str, observe: Callable[[SearchEvent], None]) -> None:
        self.device = device
        self.observe = observe
        self.ready: set[str] = set()

    def before(self, candidate: Candidate | None = None) -> None:
        from autotune.trial.ops import ensure_ops_ready, extensions_dir, ops_built, ops_for

        offload = candidate is not None and candidate.rung.offload_optimizer is not None
        names = tuple(name for name in ops_for(self.device, offload) if name not in self.ready)
        if not names:
            return
        if not ops_built(self.device, names):
            where = f"cached in {extensions_dir()}, TORCH_EXTENSIONS_DIR"
            what = ", ".join(names)
            self.observe(SearchEvent("prepare", message=f"building DeepSpeed ops once, in parallel: {what} ({where})"))
        try:
            ensure_ops_ready(self.device, report=self._say, names=names)
        except (RuntimeError, OSError) as error:
            raise UserError(str(error)) from None
        self.ready.update(names)

    def _say(self, message: str) -> None:
        self.observe(SearchEvent("prepare", message=message))


@contextlib.contextmanager
def _launcher_for(
    request: TuneRequest, given: TrialLauncher | None, observe: Callable[[SearchEvent], None] | None = None
) -> Iterator[TrialLauncher]:
    """The caller's launcher, else warm workers (start-up paid once: by default on the CPU backend,
    request.uses_warm_workers) or a fresh process per trial. Several nodes: srun inside a SLURM
    allocation, else one launcher per node with a chosen master port."""
    device, nodes = request.device, request.nodes
    if given is not None:
        yield given
        return
    from autotune.trial import LocalLauncher, WarmWorkerPool

    if nodes > 1:
        from autotune.trial.nodes import LocalNodesLauncher, in_slurm_allocation

        if in_slurm_allocation():
            from autotune.trial import SlurmLauncher

            yield SlurmLauncher()
        else:
            yield LocalNodesLauncher(env={"MALLOC_MMAP_THRESHOLD_": "65536"} if device == "cpu" else None)
        return

    # glibc keeps freed arenas; returning large frees to the OS makes peak RSS the working set the memory
    # model predicts (about 20% lower than default glibc on CPU trials; benchmarks/results/estimate.md).
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"} if device == "cpu" else None
    if not uses_warm_workers(request):
        yield LocalLauncher(env=env)
        return
    with WarmWorkerPool(env=env, on_replace=_replaced_note(observe)) as pool:
        yield pool


def _replaced_note(observe: Callable[[SearchEvent], None] | None) -> Callable[[int, str], None] | None:
    """The progress line for warm workers the pool replaced because their memory grew (trial/warm.py)."""
    if observe is None:
        return None

    def note(grown: int, what: str) -> None:
        observe(
            SearchEvent(
                "prepare",
                message=f"new trial workers: the last ones' {what} grew {format_bytes(grown)} since their first trial,"
                " which the next trial would have measured on top of its own",
            )
        )

    return note


def script_launcher(request: TuneRequest) -> TrialLauncher | None:
    """Own-command mode: every trial runs the user's launch command (trial/script.py)."""
    if request.command is None:
        return None
    from autotune.trial.script import ScriptLauncher

    return ScriptLauncher(request.command)


def _search(
    ctx: TuneContext,
    cache: ResultsCache | None,
    launcher: TrialLauncher,
    observe: Callable[[SearchEvent], None],
    ops: TrialOps | None = None,
) -> SearchOutcome:
    key = ctx.key
    bounds = run_bounds(ctx)
    cached = believed_trials(cache, key, bounds) if cache else {}

    def run(candidate: Candidate) -> tuple[TrialResult, bool]:
        if candidate in cached:
            return cached[candidate], True
        if ops is not None:
            ops.before(candidate)
        result = run_trial(launcher, ctx.spec(candidate), observe, candidate, bounds)
        if cache and result.status in DETERMINISTIC_STATUSES:  # what a rerun would give again, nothing else
            cache.put_trial(key, candidate, result)
        return result, False

    return context_search(ctx, run, observe).run_search()


def run_bounds(ctx: TuneContext) -> Bounds:
    """What this run's hardware and model allow a trial to measure (trial/plausible.py)."""
    device: Device = "cpu" if ctx.request.device == "cpu" else "cuda"
    peak_tflops = ctx.target.gpu.peak_tflops(ctx.precision)
    return Bounds.for_run(ctx.model.total_params, ctx.target.world_size, device, peak_tflops)


def believed_trials(cache: ResultsCache, key: str, bounds: Bounds) -> dict[Candidate, TrialResult]:
    """The cached trials of this run whose figures the hardware could have produced; the others are deleted."""
    kept = {}
    for candidate, result in cache.trials(key).items():
        if why := bounds.why_implausible(candidate, result):
            log.warning("autotune: dropped cached trial %s as corrupt: %s; measuring it again", candidate.key, why)
            cache.forget_trial(key, candidate)
        else:
            kept[candidate] = result
    return kept


def run_trial(
    launcher: TrialLauncher,
    spec: TrialSpec,
    observe: Callable[[SearchEvent], None],
    candidate: Candidate,
    bounds: Bounds | None = None,
) -> TrialResult:
    """One trial; an inconclusive failure (a signal from outside, a crash, the network or the file system: nothing
    about the candidate), or a figure the hardware cannot produce, is run once more, and if it fails the same way
    again it stays inconclusive (never cached, never a memory fact)."""
    result = _checked(launcher.run(spec), candidate, bounds)
    if result.status != "inconclusive":
        return result
    why = f"trial {candidate.key} inconclusive ({result.error}); running it once more"
    observe(SearchEvent("prepare", candidate, message=why))
    return _checked(launcher.run(spec), candidate, bounds)


def _checked(result: TrialResult, candidate: Candidate, bounds: Bounds | None) -> TrialResult:
    why = bounds.why_implausible(candidate, result) if bounds else None
    return replace(result, status="inconclusive", error=f"implausible measurement: {why}") if why else result


def _no_trial_completed(outcome: SearchOutcome) -> str | None:
    """When trials ran but none finished (timeouts, crashes) and none ran out of memory, the answer is not
    "nothing fits": the message names what went wrong instead."""
    if outcome.best is not None or not outcome.trials or any(t.memory_failure for t in outcome.trials):
        return None
    first = outcome.trials[0].result
    statuses = sorted({t.result.status for t in outcome.trials})
    detail = f": {first.error}" if first.error else ""
    hint = " (raise --trial-timeout?)" if "timeout" in statuses else ""
    return f"no trial completed ({', '.join(statuses)}){hint}; first: {first.status}{detail}"


def _smallest_shortfall(plan_data: dict | None, outcome: SearchOutcome | None) -> str:
    shortfalls = [
        row["verdict"]["shortfall_bytes"]
        for row in (plan_data or {}).get("rows", [])
        if row["verdict"]["shortfall_bytes"] > 0
    ]
    if outcome is not None:
        shortfalls += [
            t.result.peak_memory_bytes - t.limit_bytes
            for t in outcome.trials
            if t.result.peak_memory_bytes and t.result.peak_memory_bytes > t.limit_bytes
        ]
    if not shortfalls:
        locked = [s.reason for s in (outcome.skipped if outcome else []) if "ulimit -l" in s.reason]
        return f"no rung could be tried; {locked[0]}" if locked else "no rung could be tried"
    return f"smallest shortfall {format_bytes(min(shortfalls))} per {'rank' if outcome else 'GPU'}"


def _choice(ctx: TuneContext, candidate: Candidate, best: TrialRecord | None) -> tuple[Choice, HostNeed]:
    """The pick as the report states it, and what it needs from each node's host."""
    from autotune.estimate import estimate
    from autotune.estimate.pinned import pinned_host_bytes

    predicted = estimate(ctx.model, ctx.target, candidate, ctx.settings)
    choice = Choice(
        candidate=candidate,
        description=candidate.describe(),
        samples_per_s=best.result.samples_per_s if best else None,
        tokens_per_s=best.result.tokens_per_s if best else None,
        peak_bytes=best.result.peak_memory_bytes if best else None,
        predicted_peak_bytes=predicted.gpu_peak_bytes,
    )
    measured_host = best.host_peak_bytes if best and ctx.request.device != "cpu" else None
    host_need = HostNeed(
        ram_bytes=measured_host or predicted.host_ram_bytes,
        measured=measured_host is not None,
        pinned_bytes=pinned_host_bytes(predicted.host_components),  # dsconfig pins every offload
        nvme_bytes=predicted.nvme_bytes,
    )
    return choice, host_need


def _trial_entry(record: TrialRecord) -> TrialEntry:
    return TrialEntry(
        candidate=record.candidate,
        result=record.result,
        predicted_peak_bytes=record.predicted_peak_bytes,
        limit_bytes=record.limit_bytes,
        within_headroom=record.within_headroom,
        host_peak_bytes=record.host_peak_bytes,
        host_limit_bytes=record.host_limit_bytes,
        from_cache=record.from_cache,
        purpose=record.purpose,
    )


def _skipped(ctx: TuneContext, outcome: SearchOutcome | None) -> tuple[Skipped, ...]:
    """What the search skipped, then the rungs this machine cannot run at all (both checkpointing settings)."""
    searched = tuple(Skipped.from_json(s.to_dict()) for s in outcome.skipped) if outcome else ()
    unavailable = tuple(
        Skipped(rung=r.value, grad_checkpointing=ck, reason=why) for r, why in ctx.unavailable for ck in (False, True)
    )
    return searched + unavailable


def _report_data(
    ctx: TuneContext,
    candidate: Candidate | None,
    outcome: SearchOutcome | None,
    plan_data: dict | None,
    config_path: Path | None,
    hf_path: Path | None,
    launch: LaunchCommands | None,
    elapsed_s: float,
) -> TuneReport:
    """The report of what was found; a finished tuning adds its batch, training and command (`_finished`)."""
    request = ctx.request
    choice, host_need = _choice(ctx, candidate, outcome.best if outcome else None) if candidate else (None, None)
    modes = outcome.modes if outcome else planned_modes(ctx)
    return TuneReport(
        model={k: v for k, v in ctx.model.to_dict().items() if k != "config"},
        target=ctx.target.to_dict(),
        target_description=ctx.target.describe(),
        device=request.device,
        verified=ctx.verified and outcome is not None,
        seq_len=ctx.seq_len,
        precision=ctx.precision,
        world_size=ctx.target.world_size,
        global_batch=request.global_batch,
        headroom=request.headroom,
        limit_bytes=ctx.limit_bytes,
        assumptions=ctx.assumptions(candidate),
        notes=tuple(ctx.notes),
        micro_batch_grid=tuple(ctx.grid),
        choice=choice,
        config_path=str(config_path) if config_path else None,
        base_config=request.base_config,
        hf_config_path=str(hf_path) if hf_path else None,
        launch=launch,
        trials=tuple(_trial_entry(t) for t in outcome.trials) if outcome else (),
        skipped=_skipped(ctx, outcome),
        trials_launched=outcome.trials_launched if outcome else 0,
        process_starts=outcome.process_starts if outcome else None,
        launches_by_purpose=outcome.launches_by_purpose() if outcome else {},
        stop_reason=outcome.stop_reason if outcome and outcome.stop_reason else StopReason.PLAN_ONLY,
        stop_message=outcome.stop_message if outcome else "plan only: no trials on this machine",
        margin=outcome.margin if outcome else None,
        noise=outcome.noise if outcome else None,
        verdict=VerdictEntry.from_json(outcome.verdict.to_dict()) if outcome and outcome.verdict else None,
        host_need=host_need,
        calibration=outcome.calibration.to_dict() if outcome else None,
        modes=tuple(ModeEntry.from_json(m.to_dict()) for m in modes),
        plan=plan_data,
        elapsed_s=elapsed_s,
        versions=library_versions(),
        from_cache=False,
        nothing_fits_reason=None if candidate else _smallest_shortfall(plan_data, outcome) + _mode_hint(modes),
    )


def _finished(
    ctx: TuneContext, report: TuneReport, candidate: Candidate, config: dict, config_path: Path, plan_notes: list[str]
) -> TuneReport:
    """A tuning that emitted a config: its notes on the config, the global batch, the training and any own
    command, added once to the report `_report_data` built."""
    request = ctx.request
    notes = [*placeholder_notes(config, ctx.base), *([] if ctx.verified else plan_notes)]
    if changes := approximation(candidate.mode, mode_facts(ctx)):  # only reachable with --allow-approximate
        notes.append(f"changes the training: {changes}")
    batch = describe_global_batch(config, ctx.seq_len, ctx.batch_chosen_by, request.tokens_per_step)
    return replace(
        report.with_notes(*notes),
        batch=Batch.from_json(batch.to_dict()),
        training=Training.from_json(training_choices_report(request.optimizer, ctx.lora, ctx.model)),
        own_command=_own_command(ctx, candidate, config_path),
    )


def _own_command(ctx: TuneContext, candidate: Candidate, config_path: Path) -> OwnCommand | None:
    """Own-command mode: the user's command, naming this run's config path."""
    if not ctx.request.command:
        return None
    from autotune.request.own_command import command_report

    return OwnCommand.from_json(command_report(ctx.request, ctx.spec(candidate), config_path))


def _mode_hint(records: list[ModeRecord]) -> str:
    """A mode predicted to fit where nothing classic (or measured) does: said in the "nothing fits" message."""
    from autotune.modes.summary import ModeSummary

    clause = ModeSummary.from_records([r for r in records if r.status == "planned"]).nothing_fits_hint()
    return f"; but {clause}" if clause else ""


def tune(
    request: TuneRequest | None = None,
    *,
    launcher: TrialLauncher | None = None,
    observe: Callable[[SearchEvent], None] = lambda event: None,
    **options: object,
) -> TuneResult:
    """Find the fastest config that fits and write it; `tune(model="gpt2", gpus=8)` or `tune(TuneRequest(...))`.

    Raises UserError on bad input and NothingFitsError when no candidate fits. The caller's process is left as
    it was found: os.environ, and DeepSpeed's accelerator choice, are restored on the way out.
    """
    request = request or TuneRequest(**options)  # type: ignore[arg-type]
    with preserved_environment(), deepspeed_accelerator("cpu"):
        return _tune(request, launcher, observe)


def _tune(request: TuneRequest, launcher: TrialLauncher | None, observe: Callable[[SearchEvent], None]) -> TuneResult:
    started = time.monotonic()
    ctx = TuneContext.build(request)
    if ctx.verified:
        check_host_capacity(request, ctx.target)
    cache = _results_cache(request)
    out_path = output_path(request.out)
    report_dir = Path(request.report_dir) if request.report_dir else Path(request.out).parent
    if cache and ctx.verified and (hit := cached_answer(ctx, cache)):
        return _from_cache(ctx, hit, out_path, report_dir, started)
    outcome = None
    plan_data = None
    plan_notes: list[str] = []  # plan-only: the pick's host need and micro-batch, beside the recommendation
    if ctx.verified:
        ops = TrialOps(request.device, observe) if launcher is None else None
        if ops is not None:
            ops.before()  # the ops every trial loads, before the trial workers start
        # one selection point: the caller's launcher, else the user's command (own-command mode), else ours
        given = launcher or script_launcher(request)
        with _launcher_for(request, given, observe) as chosen:
            outcome = _search(ctx, cache, chosen, observe, ops)
            outcome.process_starts = getattr(chosen, "restarts", None)  # warm workers count their starts
        candidate = outcome.best.candidate if outcome.best else None
        if candidate is None and (failed := _no_trial_completed(outcome)):
            report = _report_data(ctx, None, outcome, None, None, None, None, time.monotonic() - started)
            write_report(report, report_dir)
            raise TrialsFailedError(failed)
    else:
        recommendation = recommend(ctx)
        candidate, plan_data = recommendation.candidate, recommendation.plan.to_dict()
        lines = (host_line(recommendation), passed_over_line(recommendation), recommendation.grid_note)
        plan_notes = [line for line in lines if line]
    if candidate is None:
        report = _report_data(ctx, None, outcome, plan_data, None, None, None, time.monotonic() - started)
        write_report(report, report_dir)
        raise NothingFitsError(f"nothing fits {ctx.target.describe()}: {report.nothing_fits_reason}")
    config = ctx.emitted_config(candidate)
    # The .hf.json is always written: the HF Trainer and accelerate launch paths read it.
    config_path, hf_path = write_configs(config, ctx.target.world_size, out_path, hf=True, base=ctx.base)
    launch = _launch(ctx, config, candidate, config_path)
    found = _report_data(ctx, candidate, outcome, plan_data, config_path, hf_path, launch, time.monotonic() - started)
    report = _finished(ctx, found, candidate, config, config_path, plan_notes)
    write_assumptions(config_path, report)
    report_md, report_json = write_report(report, report_dir)
    if cache and outcome is not None:
        answer = StoredAnswer(
            candidate=candidate,
            ds_config=config,
            report=report,
            limit_bytes=ctx.limit_bytes,
            memory_bound=memory_bound(ctx, outcome),
        )
        cache.put_recommendation(ctx.answer_key, answer)
    best = outcome.best if outcome else None
    return TuneResult(
        ctx.verified,
        candidate,
        config,
        config_path,
        hf_path,
        report_md,
        report_json,
        launch,
        best.result.samples_per_s if best else None,
        outcome.trials_launched if outcome else 0,
        False,
        time.monotonic() - started,
        report.stop_reason,
        report,
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


# A stored answer found under limit L0 still answers a question with limit L when its measured peak fits L and
# either L is at most 5% above L0 (jitter) or memory did not bind the search at L0. If L < L0, the stored choice
# was the fastest of a superset of what fits now, so it is still the fastest; if memory did not bind, more
# memory changes nothing.
ANSWER_GROWTH_TOLERANCE = 1.05


def cached_answer(ctx: TuneContext, cache: ResultsCache) -> StoredAnswer | None:
    """A stored answer that still holds for the memory free now (see above); else None, and the search runs
    (reusing the cached trials of this limit bucket)."""
    hit = cache.recommendation(ctx.answer_key)
    if hit is None:
        return None
    choice = hit.report.choice
    peak = choice.peak_bytes if choice else None
    speed = choice.samples_per_s if choice else None
    tokens_per_s = speed * ctx.seq_len if speed is not None else None
    candidate = hit.candidate
    if why := run_bounds(ctx).why_implausible_figures(candidate, tokens_per_s, [peak] if peak is not None else []):
        log.warning("autotune: dropped the cached answer as corrupt: %s; tuning again", why)
        return None
    if peak is None or peak > ctx.limit_bytes:
        return None
    if ctx.limit_bytes > hit.limit_bytes * ANSWER_GROWTH_TOLERANCE and hit.memory_bound:
        return None
    if hit.ds_config != ctx.emitted_config(candidate):
        # a stored config is never written just because it was stored
        log.warning("autotune: the cached config differs from the one built for its candidate; tuning again")
        return None
    return hit


def memory_bound(ctx: TuneContext, outcome: SearchOutcome) -> bool:
    """Whether more memory could have changed the answer: a trial ran out of memory (or over the headroom), or
    the most memory-hungry candidate (first rung, largest micro-batch, no checkpointing) was predicted not to fit."""
    from autotune.estimate import estimate

    if any(t.memory_failure for t in outcome.trials):
        return True
    hungriest = Candidate(ctx.rungs[0], max(ctx.grid), False)
    return estimate(ctx.model, ctx.target, hungriest, ctx.settings).gpu_peak_bytes > ctx.limit_bytes


def _launch(ctx: TuneContext, config: dict, candidate: Candidate, config_path: Path) -> LaunchCommands:
    return emit_launchers(
        config,
        candidate,
        config_path,
        ctx.target.gpus_per_node,
        ctx.target.nodes,
        ctx.request.script or "train.py",
        ctx.request.optimizer,
        ctx.request.lora_rank,
        kernels=ctx.request.kernels,
        device=ctx.request.device,
        precision=ctx.precision,
    )


def _from_cache(ctx: TuneContext, hit: StoredAnswer, out_path: Path, report_dir: Path, started: float) -> TuneResult:
    candidate, config = hit.candidate, hit.ds_config
    # Not the stored bytes: cached_answer accepted the hit only because its config equals the one this version
    # builds for the candidate now, and that same build was validated by this DeepSpeed version at this world
    # size when the answer was stored (both are in the key). Re-validating would import DeepSpeed (~4 s) to
    # re-check a config that was re-derived, not trusted. Hook-published configs are re-validated (infra/sharing.py).
    world = ctx.target.world_size
    config_path, hf_path = write_configs(config, world, out_path, hf=True, validate=False, base=ctx.base)
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
    if ctx.request.command:  # the command to train with names this run's config path
        report = replace(report, own_command=_own_command(ctx, candidate, config_path))
    write_assumptions(config_path, report)
    report_md, report_json = write_report(report, report_dir, redraw=False)
    return TuneResult(
        True,
        candidate,
        config,
        config_path,
        hf_path,
        report_md,
        report_json,
        launch,
        report.choice.samples_per_s if report.choice else None,
        0,
        True,
        time.monotonic() - started,
        StopReason.CACHE_HIT,
        report,
    )
