"""A tuning's report (`TuneReport`), built once from its context and the search's outcome: the pick, every trial
and skip, the modes, the verdict; a tuning that emitted a config adds its batch, training and own command.
The report's types, markdown and plot are `autotune.report`; this is where a search's results become one.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune.core.batch import describe_global_batch
from autotune.core.ladder import Candidate
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.core.versions import library_versions
from autotune.dsconfig.base_config import placeholder_notes
from autotune.dsconfig.emit import LaunchCommands
from autotune.modes.applies import approximation
from autotune.modes.search_view import ModeRecord
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
from autotune.request.context import TuneContext
from autotune.search.records import TIME_BUDGET_CUT, SearchOutcome, TrialRecord, Verdict
from autotune.training.checks import training_choices_report
from autotune.tuning.for_context import mode_facts, planned_modes


def no_trial_completed(outcome: SearchOutcome) -> str | None:
    """When trials ran but none finished (timeouts, crashes) and none ran out of memory, the answer is not
    "nothing fits": the message names what went wrong instead."""
    if outcome.best is None and outcome.stop_reason is StopReason.TIME_BUDGET:  # not "nothing fits": not all tried
        if not outcome.trials:
            return f"the time budget ran out before any trial ran ({outcome.stop_message}; raise --time-budget)"
        tried = ", ".join(f"{t.candidate.key} {t.result.status}" for t in outcome.trials)
        return (
            f"the time budget ran out before a trial verified a config ({outcome.stop_message}; tried {tried});"
            " raise --time-budget"
        )
    if outcome.best is not None or not outcome.trials or any(t.memory_failure for t in outcome.trials):
        return None
    first = outcome.trials[0].result
    statuses = sorted({t.result.status for t in outcome.trials})
    detail = f": {first.error}" if first.error else ""
    budget_cut = any((t.result.error or "").startswith(TIME_BUDGET_CUT) for t in outcome.trials)
    hint = " (raise --time-budget?)" if budget_cut else " (raise --trial-timeout?)" if "timeout" in statuses else ""
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


def pick_speed(best: TrialRecord | None, verdict: Verdict | None) -> tuple[float | None, float | None]:
    """The pick's samples/s and tokens/s as every output states them: the speed its verdict was decided on (the
    median of the pick's pooled steps, or of its interleaved re-measurement after a close call), else its one
    trial's. Tokens/s keep the trial's tokens per sample."""
    if best is None:
        return None, None
    samples, tokens = best.result.samples_per_s, best.result.tokens_per_s
    if verdict is None or verdict.pick != best.candidate or not samples:
        return samples, tokens
    decided = verdict.speed.median
    return decided, tokens * decided / samples if tokens else None


def _choice(
    ctx: TuneContext,
    candidate: Candidate,
    best: TrialRecord | None,
    fresh: TrialRecord | None = None,
    verdict: Verdict | None = None,
) -> tuple[Choice, HostNeed]:
    """The pick as the report states it, and what it needs from each node's host: its speed the one its verdict
    was decided on (`pick_speed`; the fastest single trial kept beside it under its own name), its memory from
    its fresh-process confirmation where there is one (the memory the job will find)."""
    from autotune.estimate import estimate
    from autotune.estimate.pinned import pinned_host_bytes

    predicted = estimate(ctx.model, ctx.target, candidate, ctx.settings)
    memory = fresh or best
    samples, tokens = pick_speed(best, verdict)
    fastest = best.result.samples_per_s if best else None
    choice = Choice(
        candidate=candidate,
        description=candidate.describe(),
        samples_per_s=samples,
        tokens_per_s=tokens,
        peak_bytes=memory.result.peak_memory_bytes if memory else None,
        predicted_peak_bytes=predicted.gpu_peak_bytes,
        peak_in_fresh_process=True if fresh else None,
        fastest_trial_samples_per_s=fastest if fastest != samples else None,
    )
    measured_host = memory.host_peak_bytes if memory and ctx.request.hardware.device != "cpu" else None
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


def report_of(
    ctx: TuneContext,
    *,
    elapsed_s: float,
    candidate: Candidate | None = None,
    outcome: SearchOutcome | None = None,
    plan_data: dict | None = None,
    config_path: Path | None = None,
    hf_path: Path | None = None,
    launch: LaunchCommands | None = None,
) -> TuneReport:
    """The report of what was found; a finished tuning adds its batch, training and command (`finished_report`)."""
    request = ctx.request
    fresh = outcome.fresh_confirmation if outcome else None
    verdict = outcome.verdict if outcome else None
    best = outcome.best if outcome else None
    choice, host_need = _choice(ctx, candidate, best, fresh, verdict=verdict) if candidate else (None, None)
    modes = outcome.modes if outcome else planned_modes(ctx)
    return TuneReport(
        model={k: v for k, v in ctx.model.to_dict().items() if k != "config"},
        target=ctx.target.to_dict(),
        target_description=ctx.target.describe(),
        device=request.hardware.device,
        verified=ctx.verified and outcome is not None,
        seq_len=ctx.seq_len,
        precision=ctx.precision,
        world_size=ctx.target.world_size,
        global_batch=request.training.global_batch,
        headroom=request.search.headroom,
        limit_bytes=ctx.limit_bytes,
        assumptions=ctx.assumptions(candidate),
        notes=tuple(ctx.notes),
        micro_batch_grid=tuple(ctx.grid),
        choice=choice,
        config_path=str(config_path) if config_path else None,
        base_config=request.training.base_config,
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


def finished_report(
    ctx: TuneContext,
    report: TuneReport,
    *,
    candidate: Candidate,
    config: dict,
    config_path: Path,
    plan_notes: list[str],
) -> TuneReport:
    """A tuning that emitted a config: its notes on the config, the global batch, the training and any own
    command, added once to the report `report_of` built."""
    request = ctx.request
    notes = [*placeholder_notes(config, ctx.base, measured=ctx.verified), *([] if ctx.verified else plan_notes)]
    if changes := approximation(candidate.mode, mode_facts(ctx)):  # only reachable with --allow-approximate
        notes.append(f"changes the training: {changes}")
    batch = describe_global_batch(config, ctx.seq_len, ctx.batch_chosen_by, request.training.tokens_per_step)
    return replace(
        report.with_notes(*notes),
        batch=Batch.from_json(batch.to_dict()),
        training=Training.from_json(training_choices_report(request.training.optimizer, ctx.lora, ctx.model)),
        own_command=own_command_entry(ctx, candidate, config_path),
    )


def own_command_entry(ctx: TuneContext, candidate: Candidate, config_path: Path) -> OwnCommand | None:
    """Own-command mode: the user's command, naming this run's config path."""
    if not ctx.request.training.command:
        return None
    from autotune.request.own_command_mode import command_report

    return OwnCommand.from_json(command_report(ctx.request, ctx.spec(candidate), config_path))


def _mode_hint(records: list[ModeRecord]) -> str:
    """A mode predicted to fit where nothing classic (or measured) does: said in the "nothing fits" message."""
    from autotune.modes.mode_summary import ModeSummary

    clause = ModeSummary.from_records([r for r in records if r.status == "planned"]).nothing_fits_hint()
    return f"; but {clause}" if clause else ""
