"""The tuning report: every trial, every skipped rung and why, the choice, and how to launch it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from autotune.core.ladder import Candidate
from autotune.core.measurement import speed_of
from autotune.core.units import format_bytes
from autotune.dsconfig.launchers import LaunchCommands
from autotune.infra.atomic import atomic_write_json, atomic_write_text
from autotune.report.data import Batch, ModeEntry, OwnCommand, Picture, TrialEntry, TuneReport
from autotune.report.pick import lead_lines, trial_status
from autotune.report.plot import embed_line, write_report_plot
from autotune.trial.trial_types import TrialResult

# The launch purpose of the pick's fresh-process confirmation, as the JSON's launches_by_purpose names it (the search,
# a layer above, defines it: search/records.py LaunchPurpose.FRESH; tests/test_warm_nodes.py checks they agree).
FRESH_PURPOSE = "fresh-process confirmation"


def _speed(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"


def _speed_with_spread(result: TrialResult) -> str:
    """'4.86 (4.71-5.02)': the median's rate and its interval (autotune.core.measurement)."""
    speed = speed_of(result.step_times_s, result.samples_per_s)
    if speed is None or not result.ok:
        return _speed(result.samples_per_s)
    return f"{speed.median:.2f} ({speed.low:.2f}-{speed.high:.2f})"


def _steps(result: TrialResult) -> str:
    """How many whole optimizer steps a figure is from; an own-command trial's profiled step beside them."""
    if not result.ok:
        return ""
    steps = str(len(result.step_times_s))
    if result.metric_source == "deepspeed_autotuning":
        return f"{steps} (profiled step only)"
    if result.profiled_samples_per_s:
        return f"{steps} (profiled step: {result.profiled_samples_per_s:.2f}/s)"
    return steps


_LAUNCH_LABELS = (
    ("deepspeed", "plain DeepSpeed script, `deepspeed` launcher (`--deepspeed` flag, config via `--deepspeed_config`)"),
    ("torchrun", "the same script under torchrun (OMP threads restored to cores / ranks, as `deepspeed` sets them)"),
    ("hf_trainer", "HF Trainer script: the .hf.json plus the TrainingArguments flags that match it"),
    ("accelerate", "HF Trainer script under `accelerate launch` (the accelerate config points at the .hf.json)"),
)


def _launch_lines(launch: LaunchCommands) -> list[str]:
    """One block per launcher; each was run on the CPU backend in tests/test_launch_paths.py."""
    lines = ["Launch (pick the one that matches your script and launcher):", ""]
    for key, label in _LAUNCH_LABELS:
        if command := getattr(launch, key):
            lines += [f"- {label}:", "  ```", f"  {command}", "  ```"]
    return lines


def _candidate_label(candidate: Candidate) -> str:
    """'z3+offload_opt mb4 ckpt ratio0.5': the rung, micro-batch, checkpointing and any mode's parts."""
    label = f"{candidate.rung.value} mb{candidate.micro_batch}{' ckpt' if candidate.grad_checkpointing else ''}"
    return label + ("" if candidate.mode.is_classic else f" {'+'.join(candidate.mode.parts)}")


def _best_classic_speed(trials: tuple[TrialEntry, ...]) -> float | None:
    speeds = [
        t.result.samples_per_s
        for t in trials
        if t.candidate.mode.is_classic and t.within_headroom and t.result.samples_per_s
    ]
    return max(speeds) if speeds else None


def _versus(mode_speed: float | None, choice_speed: float | None) -> str:
    if not mode_speed or not choice_speed:
        return ""
    change = mode_speed / choice_speed - 1
    return "the choice" if abs(change) < 1e-9 else f"{change:+.1%} vs the choice"


def _modes_headline(report: TuneReport) -> list[str]:
    """Whether a mode or the classic ladder won, by measured speed, and whether the figures are predictions."""
    modes, choice = report.modes, report.choice
    choice_speed = choice.samples_per_s if choice else None
    classic = _best_classic_speed(report.trials)
    measured = [m for m in modes if m.status == "measured"]
    if choice and not choice.candidate.mode.is_classic:
        label = choice.candidate.mode.label
        beaten = f"the best classic config measured {classic:.2f} samples/s" if classic else "no classic config fitted"
        lines = [f"A mode won: **{label}** measured {_speed(choice_speed)} samples/s; {beaten}."]
    elif measured:
        best = max(measured, key=lambda m: m.samples_per_s or 0.0)
        lines = [
            f"The classic ladder won: its choice measured {_speed(choice_speed)} samples/s, the fastest mode"
            f" ({best.label} on {best.rung}) {_speed(best.samples_per_s)}."
        ]
    else:
        lines = ["No mode was measured here; the choice is from the classic ladder."]
    if not report.verified:
        lines.append("Plan only: every mode below is a prediction of the memory model, **not trial-verified**.")
    elif any(m.status == "planned" for m in modes):
        lines.append(
            "Modes marked **not trial-verified** cannot run on this backend: their figures are predictions only,"
            " and they are never picked over a measured config."
        )
    return lines


def _mode_row(mode: ModeEntry, choice_speed: float | None) -> str:
    status = mode.status + ("" if mode.trial_verifiable or not mode.applies else " (not trial-verified)")
    did = f"{status}: {mode.detail}" if mode.detail else status
    mb = "" if mode.micro_batch is None else f"{mode.micro_batch}{' ckpt' if mode.grad_checkpointing else ''}"
    speed = _speed(mode.samples_per_s)
    if mode.samples_per_s and (versus := _versus(mode.samples_per_s, choice_speed)):
        speed += f" ({versus})"
    peak = format_bytes(mode.predicted_peak_bytes) if mode.predicted_peak_bytes else "-"
    return f"| {mode.rung} | {mode.label} | {did} | {mb or '-'} | {peak} | {speed} |"


def _modes_lines(report: TuneReport) -> list[str]:
    """Modern memory modes: what was considered on each rung, whether it applied and why, what the search
    did with it, and why the classic ladder won or lost against it (by measured speed only)."""
    modes = report.modes
    if not modes:
        return []
    choice_speed = report.choice.samples_per_s if report.choice else None
    lines = ["", "## Modern modes", "", *_modes_headline(report)]
    lines += [
        "",
        "| rung | mode | what the search did | micro-batch | predicted peak | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [_mode_row(m, choice_speed) for m in modes if m.applies]
    inapplicable = sum(1 for m in modes if not m.applies)
    lines += ["", f"Why each mode applies, with sources, and the {inapplicable} that do not: `modes` in the JSON."]
    return lines


def _launch_detail(report: TuneReport) -> str:
    """Why the trials were launched, and in how many processes where warm workers ran several in one. Across nodes
    every launch spans the whole job, so it also says which figures a fresh full-scale launch measured (the pick's
    fresh-process confirmation, or the pick's own trial where it was the first of its launch) and which warm workers
    across the nodes did (all the others)."""
    why = ", ".join(f"{purpose} {count}" for purpose, count in report.launches_by_purpose.items())
    starts, nodes = report.process_starts, report.assumptions.nodes
    processes = f" in {starts} process start(s) (warm workers)" if starts is not None else ""
    if starts is not None and nodes > 1:
        fresh = report.launches_by_purpose.get(FRESH_PURPOSE, 0)
        measured = f"{fresh} fresh, full-scale ({FRESH_PURPOSE})"
        if not fresh and report.choice is not None and report.choice.peak_in_fresh_process:
            measured = "the pick's own trial the first of its launch, so fresh and full-scale"
        processes = (
            f" in {starts} launch(es) of all {nodes} nodes: {measured}, the others' figures from warm workers across"
            " the nodes"
        )
    return f"{processes}" + (f" ({why})" if why else "")


def _batch_headline(batch: Batch) -> str:
    return (
        f"Global batch {batch.global_batch} samples ({batch.tokens_per_step} tokens) per optimizer step ="
        f" micro-batch {batch.micro_batch} x accumulation {batch.accumulation} x {batch.world_size} rank(s);"
        f" {batch.how}"
    )


def _header_lines(report: TuneReport) -> list[str]:
    """The pick's lead, then the hardware, the question asked, the notes, the headroom and how the search went."""
    lines = [f"# autotune report: {report.model_name}", ""]
    if lead := lead_lines(report):
        lines += [f"**{lead[0]}**", "", *(f"- {line}" for line in lead[1:]), ""]
    lines.append(f"- Hardware: {report.target_description}")
    lines.append(
        f"- Sequence length {report.seq_len}, precision {report.precision}, world size {report.world_size}"
        + (f", global batch {report.global_batch}" if report.global_batch else "")
    )
    if report.training:
        lines.append(f"- Training: {report.training.summary}")
    lines += [f"- Note: {note}" for note in report.notes]
    lines.append(
        f"- Headroom: peak at most {report.headroom:.0%} of free memory"
        f" ({format_bytes(report.limit_bytes)} per {'rank' if report.device == 'cpu' else 'GPU'})"
    )
    if not report.verified:
        lines.append(
            "- **PLAN ONLY: not verified by trials** (no GPU of this kind here); predictions from the memory model."
        )
    lines.append(
        f"- Search: {report.trials_launched} trial(s) launched{_launch_detail(report)}, {report.elapsed_s:.1f} s;"
        f" stopped because {report.stop_message or report.stop_reason.value}"
    )
    if report.from_cache:
        lines.append("- Answered from the results cache (no trials run now).")
    return lines


def _recommendation_lines(report: TuneReport) -> list[str]:
    lines = ["", "## Recommendation", ""]
    choice = report.choice
    if not choice:
        return [*lines, f"Nothing fits. {report.nothing_fits_reason or ''}"]
    lines += [f"**{choice.description}**", ""]
    if report.batch:
        lines += [f"**{_batch_headline(report.batch)}**", ""]
    if choice.samples_per_s:
        lines.append(f"Measured {choice.samples_per_s:.2f} samples/s, peak {format_bytes(choice.peak_bytes)}.")
    else:
        lines.append(f"Predicted peak {format_bytes(choice.predicted_peak_bytes)}.")
    lines += [
        "",
        f"Config: `{report.config_path}`"
        + (f" (HF variant: `{report.hf_config_path}`)" if report.hf_config_path else ""),
        "",
    ]
    return lines + (_launch_lines(report.launch) if report.launch else [])


def _rank_peak(result: TrialResult) -> int | None:
    """The worst rank's own peak: device memory it used, else the allocator's reserve, else host RSS."""
    peaks = [r.device_used_bytes or r.max_reserved_bytes or r.host_rss_peak_bytes for r in result.ranks]
    return max([p for p in peaks if p] or [0]) or None


def _trial_lines(report: TuneReport) -> list[str]:
    if not report.trials:
        return []
    lines = [
        "",
        "## Trials",
        "",
        *([report.picture.markdown, ""] if report.picture else []),
        "| candidate | status | peak | predicted | samples/s (95% interval) | steps | cached |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in report.trials:
        r = t.result
        status = trial_status(r, t.within_headroom)
        lines.append(
            f"| {_candidate_label(t.candidate)} | {status} | {format_bytes(_rank_peak(r))} |"
            f" {format_bytes(t.predicted_peak_bytes)} | {_speed_with_spread(r)} | {_steps(r)} |"
            f" {'yes' if t.from_cache else ''} |"
        )
    return lines


def _skipped_lines(report: TuneReport) -> list[str]:
    if not report.skipped:
        return []
    lines = ["", "## Skipped", ""]
    for s in report.skipped:
        mode = f" ({s.mode.label})" if s.mode else ""
        ckpt = " + grad checkpointing" if s.grad_checkpointing else ""
        lines.append(f"- {s.rung}{mode}{ckpt}: {s.reason}")
    return lines


def render_markdown(report: TuneReport) -> str:
    """Markdown from the report, so it and the JSON always say the same thing. It leads with the pick
    (pick_summary); what only a closer look needs (modes that do not apply, their sources, every trial's raw
    figures) is in the JSON beside it."""
    lines = [*_header_lines(report), *_recommendation_lines(report), *_trial_lines(report), *_skipped_lines(report)]
    lines += _modes_lines(report)
    if report.own_command:
        lines += _own_command_lines(report.own_command, report.trials)
    return "\n".join(lines) + "\n"


def _own_command_lines(own: OwnCommand, trials: tuple[TrialEntry, ...]) -> list[str]:
    """Own-command mode: which trials ran the user's command, with which arguments, and what was measured."""
    lines = ["", "## Your command", "", f"Template ({own.form}): `{' '.join(own.template)}`", ""]
    lines += [f"Speed: {own.metric}.", "", "Train with the answer:", "```", own.train_command, "```", ""]
    for t in trials:
        result = t.result
        ran = f"`{' '.join(result.command)}`" if result.command else "not launched"
        reason = f" ({result.error})" if result.error else ""
        lines.append(f"- {_candidate_label(t.candidate)}: {result.status}{reason}: {ran}")
    return lines


REPORT_STEM = "autotune-report"


def write_report(report: TuneReport, out_dir: Path, stem: str = REPORT_STEM, redraw: bool = True) -> tuple[Path, Path]:
    """The JSON, the picture (when matplotlib is there) and the markdown that embeds it.

    redraw=False keeps a picture already there (a cache hit reports the same trials): importing matplotlib
    and drawing costs about a second, most of a cache hit's time.
    """
    existing = out_dir / f"{stem}.png"
    picture: Path | None
    try:
        if not redraw and existing.exists():
            picture, line = existing, embed_line(existing)
        else:
            picture, line = write_report_plot(report, existing)
    except OSError as error:
        picture, line = None, f"No picture: could not write it ({error.strerror or error})."
    report = replace(report, picture=Picture(path=str(picture) if picture else None, markdown=line))
    json_path = atomic_write_json(out_dir / f"{stem}.json", report.to_json())
    md_path = atomic_write_text(out_dir / f"{stem}.md", render_markdown(report))
    return md_path, json_path
