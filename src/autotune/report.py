"""The tuning report: every trial, every skipped rung and why, the choice, and how to launch it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.atomic import atomic_write_json, atomic_write_text
from autotune.ladder import Mode
from autotune.measurement import speed_of
from autotune.pick_summary import lead_lines
from autotune.report_plot import embed_line, write_report_plot
from autotune.units import format_bytes


def _speed(value: float | None) -> str:
    return f"{value:.2f}" if value else "-"


def _speed_with_spread(result: dict[str, Any]) -> str:
    """'4.86 (4.71-5.02)': the median's rate and its interval (autotune.measurement)."""
    speed = speed_of(result.get("step_times_s") or [], result.get("samples_per_s"))
    if speed is None or result.get("status") != "ok":
        return _speed(result.get("samples_per_s"))
    return f"{speed.median:.2f} ({speed.low:.2f}-{speed.high:.2f})"


def _steps(result: dict[str, Any]) -> str:
    """How many whole optimizer steps a figure is from; an own-command trial's profiled step beside them."""
    if result.get("status") != "ok":
        return ""
    steps = str(len(result.get("step_times_s") or []))
    if result.get("metric_source") == "deepspeed_autotuning":
        return f"{steps} (profiled step only)"
    if result.get("profiled_samples_per_s"):
        return f"{steps} (profiled step: {result['profiled_samples_per_s']:.2f}/s)"
    return steps


_LAUNCH_LABELS = (
    ("deepspeed", "plain DeepSpeed script, `deepspeed` launcher (`--deepspeed` flag, config via `--deepspeed_config`)"),
    ("torchrun", "the same script under torchrun (OMP threads restored to cores / ranks, as `deepspeed` sets them)"),
    ("hf_trainer", "HF Trainer script: the .hf.json plus the TrainingArguments flags that match it"),
    ("accelerate", "HF Trainer script under `accelerate launch` (the accelerate config points at the .hf.json)"),
)


def _launch_lines(launch: dict[str, str]) -> list[str]:
    """One block per launcher; each was run on the CPU backend in tests/test_launch_paths.py."""
    lines = ["Launch (pick the one that matches your script and launcher):", ""]
    for key, label in _LAUNCH_LABELS:
        if launch.get(key):
            lines += [f"- {label}:", "  ```", f"  {launch[key]}", "  ```"]
    return lines


def _candidate_label(cand: dict[str, Any]) -> str:
    """'z3+offload_opt mb4 ckpt ratio0.5': the rung, micro-batch, checkpointing and any mode's parts."""
    label = f"{cand['rung']} mb{cand['micro_batch']}{' ckpt' if cand['grad_checkpointing'] else ''}"
    return label + (f" {'+'.join(Mode.from_dict(cand['mode']).parts)}" if cand.get("mode") else "")


def _best_classic_speed(trials: list[dict[str, Any]]) -> float | None:
    speeds = [
        t["result"]["samples_per_s"]
        for t in trials
        if not t["candidate"].get("mode") and t["within_headroom"] and t["result"].get("samples_per_s")
    ]
    return max(speeds) if speeds else None


def _versus(mode_speed: float | None, choice_speed: float | None) -> str:
    if not mode_speed or not choice_speed:
        return ""
    change = mode_speed / choice_speed - 1
    return "the choice" if abs(change) < 1e-9 else f"{change:+.1%} vs the choice"


def _modes_lines(data: dict[str, Any]) -> list[str]:
    """Modern memory modes: what was considered on each rung, whether it applied and why, what the search
    did with it, and why the classic ladder won or lost against it (by measured speed only)."""
    modes = data.get("modes") or []
    if not modes:
        return []
    choice = data.get("choice") or {}
    choice_speed = choice.get("samples_per_s")
    lines = ["", "## Modern modes", ""]
    classic = _best_classic_speed(data.get("trials") or [])
    measured = [m for m in modes if m["status"] == "measured"]
    if choice.get("mode"):
        label = Mode.from_dict(choice["mode"]).label
        beaten = f"the best classic config measured {classic:.2f} samples/s" if classic else "no classic config fitted"
        lines.append(f"A mode won: **{label}** measured {_speed(choice_speed)} samples/s; {beaten}.")
    elif measured:
        best = max(measured, key=lambda m: m["samples_per_s"] or 0.0)
        lines.append(
            f"The classic ladder won: its choice measured {_speed(choice_speed)} samples/s, the fastest mode"
            f" ({best['label']} on {best['rung']}) {_speed(best['samples_per_s'])}."
        )
    else:
        lines.append("No mode was measured here; the choice is from the classic ladder.")
    if not data["verified"]:
        lines.append("Plan only: every mode below is a prediction of the memory model, **not trial-verified**.")
    elif any(m["status"] == "planned" for m in modes):
        lines.append(
            "Modes marked **not trial-verified** cannot run on this backend: their figures are predictions only,"
            " and they are never picked over a measured config."
        )
    lines += [
        "",
        "| rung | mode | what the search did | micro-batch | predicted peak | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for m in (m for m in modes if m["applies"]):
        status = m["status"] + ("" if m["trial_verifiable"] or not m["applies"] else " (not trial-verified)")
        did = f"{status}: {m['detail']}" if m.get("detail") else status
        mb = "" if m["micro_batch"] is None else f"{m['micro_batch']}{' ckpt' if m['grad_checkpointing'] else ''}"
        speed = _speed(m["samples_per_s"])
        if m["samples_per_s"] and (versus := _versus(m["samples_per_s"], choice_speed)):
            speed += f" ({versus})"
        peak = format_bytes(m["predicted_peak_bytes"]) if m.get("predicted_peak_bytes") else "-"
        lines.append(f"| {m['rung']} | {m['label']} | {did} | {mb or '-'} | {peak} | {speed} |")
    inapplicable = sum(1 for m in modes if not m["applies"])
    lines += ["", f"Why each mode applies, with sources, and the {inapplicable} that do not: `modes` in the JSON."]
    return lines


def _launch_detail(data: dict[str, Any]) -> str:
    """Why the trials were launched, and in how many processes where warm workers ran several in one."""
    purposes = data.get("launches_by_purpose") or {}
    why = ", ".join(f"{purpose} {count}" for purpose, count in purposes.items())
    starts = data.get("process_starts")
    processes = f" in {starts} process start(s) (warm workers)" if starts is not None else ""
    return f"{processes}" + (f" ({why})" if why else "")


def _batch_headline(batch: dict[str, Any]) -> str:
    return (
        f"Global batch {batch['global_batch']} samples ({batch['tokens_per_step']} tokens) per optimizer step ="
        f" micro-batch {batch['micro_batch']} x accumulation {batch['accumulation']} x {batch['world_size']} rank(s);"
        f" {batch['how']}"
    )


def render_markdown(data: dict[str, Any]) -> str:
    """Markdown from the JSON report, so both always say the same thing. It leads with the pick (pick_summary);
    what only a closer look needs (modes that do not apply, their sources, every trial's raw figures) is in the
    JSON beside it."""
    lines = [f"# autotune report: {data['model']['name']}", ""]
    if lead := lead_lines(data):
        lines += [f"**{lead[0]}**", "", *(f"- {line}" for line in lead[1:]), ""]
    verified = data["verified"]
    lines.append(f"- Hardware: {data['target_description']}")
    lines.append(
        f"- Sequence length {data['seq_len']}, precision {data['precision']}, world size {data['world_size']}"
        + (f", global batch {data['global_batch']}" if data.get("global_batch") else "")
    )
    if data.get("training"):
        lines.append(f"- Training: {data['training']['summary']}")
    lines += [f"- Note: {note}" for note in data.get("notes") or []]
    lines.append(
        f"- Headroom: peak at most {data['headroom']:.0%} of free memory"
        f" ({format_bytes(data['limit_bytes'])} per {'rank' if data['device'] == 'cpu' else 'GPU'})"
    )
    if not verified:
        lines.append(
            "- **PLAN ONLY: not verified by trials** (no GPU of this kind here); predictions from the memory model."
        )
    lines.append(
        f"- Search: {data['trials_launched']} trial(s) launched{_launch_detail(data)}, {data['elapsed_s']:.1f} s;"
        f" stopped because {data.get('stop_message') or data['stop_reason']}"
    )
    if data.get("from_cache"):
        lines.append("- Answered from the results cache (no trials run now).")
    lines += ["", "## Recommendation", ""]
    choice = data.get("choice")
    if choice:
        lines.append(f"**{choice['description']}**")
        lines.append("")
        if data.get("batch"):
            lines += [f"**{_batch_headline(data['batch'])}**", ""]
        if choice.get("samples_per_s"):
            lines.append(
                f"Measured {choice['samples_per_s']:.2f} samples/s, peak {format_bytes(choice.get('peak_bytes'))}."
            )
        else:
            lines.append(f"Predicted peak {format_bytes(choice.get('predicted_peak_bytes'))}.")
        lines += [
            "",
            f"Config: `{data['config_path']}`"
            + (f" (HF variant: `{data['hf_config_path']}`)" if data.get("hf_config_path") else ""),
            "",
        ]
        lines += _launch_lines(data["launch"])
    else:
        lines.append(f"Nothing fits. {data.get('nothing_fits_reason', '')}")
    if data["trials"]:
        lines += [
            "",
            "## Trials",
            "",
            *([data["picture"]["markdown"], ""] if data.get("picture") else []),
            "| candidate | status | peak | predicted | samples/s (95% interval) | steps | cached |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in data["trials"]:
            r = t["result"]
            peak = (
                max(
                    [
                        x
                        for rank in r["ranks"]
                        for x in (
                            rank.get("device_used_bytes")
                            or rank.get("max_reserved_bytes")
                            or rank.get("host_rss_peak_bytes"),
                        )
                        if x
                    ]
                    or [0]
                )
                or None
            )
            status = r["status"] if t["within_headroom"] or r["status"] != "ok" else "over headroom"
            label = _candidate_label(t["candidate"])
            lines.append(
                f"| {label} | {status} | {format_bytes(peak)} | {format_bytes(t['predicted_peak_bytes'])} |"
                f" {_speed_with_spread(r)} | {_steps(r)} | {'yes' if t['from_cache'] else ''} |"
            )
    if data["skipped"]:
        lines += ["", "## Skipped", ""]
        for s in data["skipped"]:
            mode = f" ({Mode.from_dict(s['mode']).label})" if s.get("mode") else ""
            ckpt = " + grad checkpointing" if s["grad_checkpointing"] else ""
            lines.append(f"- {s['rung']}{mode}{ckpt}: {s['reason']}")
    lines += _modes_lines(data)
    if data.get("own_command"):
        lines += _own_command_lines(data["own_command"], data["trials"])
    return "\n".join(lines) + "\n"


def _own_command_lines(own: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """Own-command mode: which trials ran the user's command, with which arguments, and what was measured."""
    lines = ["", "## Your command", "", f"Template ({own['form']}): `{' '.join(own['template'])}`", ""]
    lines += [f"Speed: {own['metric']}.", "", "Train with the answer:", "```", own["train_command"], "```", ""]
    for t in trials:
        result = t["result"]
        label = _candidate_label(t["candidate"])
        ran = f"`{' '.join(result['command'])}`" if result.get("command") else "not launched"
        reason = f" ({result['error']})" if result.get("error") else ""
        lines.append(f"- {label}: {result['status']}{reason}: {ran}")
    return lines


REPORT_STEM = "autotune-report"


def write_report(
    data: dict[str, Any], out_dir: Path, stem: str = REPORT_STEM, redraw: bool = True
) -> tuple[Path, Path]:
    """The JSON, the picture (when matplotlib is there) and the markdown that embeds it.

    redraw=False keeps a picture already there (a cache hit reports the same trials): importing matplotlib
    and drawing costs about a second, most of a cache hit's time.
    """
    existing = out_dir / f"{stem}.png"
    try:
        if not redraw and existing.exists():
            picture, line = existing, embed_line(existing)
        else:
            picture, line = write_report_plot(data, existing)
    except OSError as error:
        picture, line = None, f"No picture: could not write it ({error.strerror or error})."
    data = {**data, "picture": {"path": str(picture) if picture else None, "markdown": line}}
    json_path = atomic_write_json(out_dir / f"{stem}.json", data)
    md_path = atomic_write_text(out_dir / f"{stem}.md", render_markdown(data))
    return md_path, json_path
