"""The lines the terminal summary and autotune-report.md lead with, from the report's JSON, so both say the same:
the pick and its speed with spread, the runner-up and the margin (or the tie), the memory headroom left, and what
the pick needs from the host. `tune` and `hook` print the same head (summary_head), so a job's log says what a
terminal would."""

from __future__ import annotations

from autotune.core.ladder import Candidate
from autotune.core.measurement import speed_of
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.report.data import SpeedEntry, TuneReport
from autotune.trial.trial_types import TrialResult


def _speed(speed: SpeedEntry) -> str:
    low, high = speed.interval
    return (
        f"{speed.samples_per_s:.2f} samples/s ({low:.2f}-{high:.2f}, {speed.confidence:.0%} interval of the"
        f" median of {speed.steps} whole optimizer steps)"
    )


def _label(candidate: Candidate) -> str:
    return candidate.describe()


def speed_lines(report: TuneReport) -> list[str]:
    """The pick's speed with its spread, then the runner-up and the margin, or the tie with both figures."""
    choice, verdict = report.choice, report.verdict
    if not verdict:
        if choice and choice.samples_per_s:
            return [f"Speed: {choice.samples_per_s:.2f} samples/s (one measurement, no spread known)."]
        return ["Speed: not measured (plan only)."]
    lines = [f"Speed: {_speed(verdict.speed)}."]
    runner_up, other = verdict.runner_up, verdict.runner_up_speed
    if not runner_up or not other:
        lines.append("Runner-up: none (nothing else fitted).")
    elif verdict.tie:
        lines.append(
            f"Tie within noise: {_label(verdict.pick)} at {verdict.speed.samples_per_s:.2f} and"
            f" {_label(runner_up)} at {other.samples_per_s:.2f} samples/s ({verdict.margin:+.1%}, spread"
            f" +-{verdict.spread:.1%}): picked the simpler, safer config."
        )
    else:
        lines.append(
            f"Runner-up: {_label(runner_up)}, {_speed(other)}; the pick is {verdict.margin:+.1%} faster,"
            f" beyond the spread (+-{verdict.spread:.1%})."
        )
    if verdict.remeasured:
        lines.append("Close call: re-measured interleaved (A, B, A, B); decided on those trials.")
    return lines


def memory_line(report: TuneReport) -> str:
    """Peak against the limit, and what is left."""
    choice, limit = report.choice, report.limit_bytes
    peak = choice.peak_bytes if choice else None
    what = "measured peak" if peak else "predicted peak"
    if peak and choice and choice.peak_in_fresh_process:
        what = "measured peak (in a fresh process, as your job starts)"
        if (nodes := report.assumptions.nodes) > 1:  # the other trials ran in warm workers across the nodes
            what = f"measured peak (in a fresh launch of all {nodes} nodes, as your job starts)"
    peak = peak or (choice.predicted_peak_bytes if choice else None)
    where = "rank (host RSS)" if report.device == "cpu" else "GPU"
    if not peak or not limit:
        return f"Memory: {what} {format_bytes(peak)} per {where}."
    left = limit - peak
    return (
        f"Memory: {what} {format_bytes(peak)} of the {format_bytes(limit)} limit per {where}"
        f" ({report.headroom:.0%} of free): {format_bytes(max(0, left))} left ({left / limit:.0%})."
    )


def host_line(report: TuneReport) -> str:
    """What the pick needs from the host: RAM per node, how much of it pinned, NVMe."""
    need = report.host_need
    if not need:
        return "Host: nothing beyond the training processes."
    if report.device == "cpu":
        return "Host: the CPU backend's memory is host RAM: the peak above is all of it (nothing pinned)."
    parts = [f"host RAM {format_bytes(need.ram_bytes)} per node"]
    parts.append(f"{format_bytes(need.pinned_bytes)} of it pinned" if need.pinned_bytes else "none pinned")
    if need.nvme_bytes:
        parts.append(f"NVMe {format_bytes(need.nvme_bytes)} per node")
    origin = "measured" if need.measured else "predicted"
    return f"Host: needs {', '.join(parts)} ({origin})."


def lead_lines(report: TuneReport) -> list[str]:
    """Pick, speed, runner-up or tie, memory, host: the first thing a reader sees."""
    if not report.choice:
        return []
    return [f"Pick: {report.choice.description}.", *speed_lines(report), memory_line(report), host_line(report)]


def verification_label(verified: bool, from_cache: bool) -> str:
    """'verified by trials' or 'PLAN ONLY: not verified by trials', and whether the results cache answered."""
    label = "verified by trials" if verified else "PLAN ONLY: not verified by trials"
    return label + (", from cache" if from_cache else "")


def summary_head(report: TuneReport, verified: bool, from_cache: bool) -> list[str]:
    """The terminal summary's first lines: model, target and how the answer was reached, then `lead_lines`
    (tune's summary and hook's both start with these)."""
    head = f"{report.model_name} on {report.target_description}: {verification_label(verified, from_cache)}"
    return [head, *lead_lines(report)]


def not_tried_line(report: TuneReport) -> str:
    """A search a budget stopped: which budget, and the rung groups it did not try, so the user knows what a larger
    --time-budget or --max-trials would add; '' when the search ran to its end."""
    if report.stop_reason not in (StopReason.TIME_BUDGET, StopReason.TRIAL_BUDGET):
        return ""
    groups = [
        f"{s.rung}{' + ckpt' if s.grad_checkpointing else ''}{f' ({s.mode.label})' if s.mode else ''}"
        for s in report.skipped
        if s.reason.startswith("not tried")
    ]
    option = "--time-budget" if report.stop_reason is StopReason.TIME_BUDGET else "--max-trials"
    what = f"not tried: {', '.join(groups)}" if groups else "every rung group was started"
    return f"Stopped early: {report.stop_message}; {what} (raise {option} for more)."


def trial_status(result: TrialResult, within_headroom: bool) -> str:
    """A trial's status as the progress line and the report's table say it: a trial over the headroom is "over
    headroom" whether it ran on (ok) or stopped itself there (over_budget: TrialSpec.stop_over_bytes, or the CPU
    backend's budget watch); its error says which."""
    if result.status == "over_budget" or (result.ok and not within_headroom):
        return "over headroom"
    return result.status


def measured_detail(result: TrialResult) -> str:
    """One trial's figure in full: '4.86 samples/s (4.71-5.02, 12 steps); single steps 2.45-2.61 s (IQR)', and an
    own command's profiled step beside it; '' for a trial that measured nothing."""
    speed = speed_of(result.step_times_s, result.samples_per_s)
    if speed is None or not result.ok:
        return ""
    stats = speed.stats
    text = f"{speed.describe()}; single steps {stats.q1_s:.3g}-{stats.q3_s:.3g} s (IQR)"
    if result.profiled_samples_per_s:
        text += f"; profiled step {result.profiled_samples_per_s:.2f} samples/s (secondary)"
    return text


def measurement_lines(report: TuneReport) -> list[str]:
    """Every trial that measured a speed, fastest first, with its interval: what the pick was decided on."""
    measured = [(t, measured_detail(t.result)) for t in report.trials]
    rows = sorted(((t, d) for t, d in measured if d), key=lambda row: -(row[0].result.samples_per_s or 0))
    if not rows:
        return []
    lines = ["Measured (median of whole optimizer steps, 95% interval):"]
    for trial, detail in rows:
        cached = " (cached)" if trial.from_cache else ""
        lines.append(f"  {trial.candidate.describe()}: {detail}{cached}")
    return lines
