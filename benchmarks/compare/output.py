"""Write what a run measured: the JSON (the only source of figures), a PNG chart, and a markdown section.

The chart and the markdown are rendered from the JSON dict alone, so `--render-only` can redraw them
from a stored JSON and no figure can appear in the README that the JSON does not hold.
"""

from __future__ import annotations

import json
from pathlib import Path

from portable_paths import portable  # benchmarks/ is on the path of every script that writes results

METHOD_LABELS = {
    "autotune": "autotune",
    "deepspeed_autotuning": "DeepSpeed Autotuning",
    "exhaustive": "exhaustive grid",
}


def write_json(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(data), indent=2, sort_keys=False, default=str) + "\n")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def write_chart(data: dict, path: Path) -> None:
    """Two panels per scenario: wall time to a recommendation, and re-measured throughput of the choice."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(data["scenarios"])
    figure, axes = plt.subplots(len(scenarios), 2, figsize=(11, 3.6 * len(scenarios)), squeeze=False)
    colors = {"autotune": "#2a9d8f", "deepspeed_autotuning": "#e76f51", "exhaustive": "#8d99ae"}
    for row, name in enumerate(scenarios):
        methods = data["scenarios"][name]["methods"]
        labels = [METHOD_LABELS[m] for m in methods]
        walls = [methods[m].get("wall_s") or 0.0 for m in methods]
        speeds = [(methods[m].get("remeasured") or {}).get("samples_per_s_median") or 0.0 for m in methods]
        lows, highs = [], []
        for method, speed in zip(methods, speeds, strict=True):
            measured = methods[method].get("remeasured") or {}
            low, high = measured.get("samples_per_s_min"), measured.get("samples_per_s_max")
            lows.append(speed - low if low is not None else 0.0)
            highs.append(high - speed if high is not None else 0.0)
        bar_colors = [colors[m] for m in methods]
        wall_axis, speed_axis = axes[row]
        bars = wall_axis.bar(labels, walls, color=bar_colors)
        for bar, method in zip(bars, methods, strict=True):
            launches = methods[method].get("launches")
            wall_axis.annotate(
                f"{bar.get_height():.0f} s\n{launches} launch{'es' if launches != 1 else ''}"
                if launches is not None
                else "failed",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center", va="bottom", fontsize=8,
            )  # fmt: skip
        wall_axis.set_ylabel("wall time to recommendation (s)")
        wall_axis.set_title(f"{data['scenarios'][name]['label']}: tuning cost", fontsize=10)
        wall_axis.margins(y=0.25)
        speed_axis.bar(labels, speeds, color=bar_colors, yerr=[lows, highs], capsize=4)
        for index, (method, speed) in enumerate(zip(methods, speeds, strict=True)):
            chosen = methods[method].get("chosen") or {}
            speed_axis.annotate(
                f"{speed:.1f}", (index, speed + highs[index]), ha="center", va="bottom", fontsize=8,
                xytext=(0, 3), textcoords="offset points",
            )  # fmt: skip
            speed_axis.annotate(
                chosen.get("label", "no choice").replace(", GAS", "\nGAS"), (index, 0), ha="center", va="bottom",
                fontsize=7, color="white", xytext=(0, 4), textcoords="offset points",
            )  # fmt: skip
        speed_axis.set_ylabel("re-measured samples/s (median, min-max)")
        speed_axis.set_title(f"{data['scenarios'][name]['label']}: quality of the choice", fontsize=10)
        speed_axis.margins(y=0.3)
    settings = data["settings"]
    figure.suptitle(
        f"{settings['model']} seq {settings['seq_len']} on {data['machine']['cpu_model']}"
        f" ({settings['device']}, {settings['ranks']} rank) - {data['date'][:10]}",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _table(data: dict) -> list[str]:
    lines = [
        "| Scenario | Method | Wall to recommendation | Launches | Chosen config | Re-measured samples/s"
        " median (min-max, runs) | Peak RSS per rank | Method's own figure |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for scenario in data["scenarios"].values():
        for method, entry in scenario["methods"].items():
            measured = entry.get("remeasured") or {}
            chosen = entry.get("chosen") or {}
            status = "" if entry["status"] == "ok" else f" ({entry['status']})"
            lines.append(
                f"| {scenario['label']} | {METHOD_LABELS[method]}{status} | {_num(entry.get('wall_s'))} s"
                f" | {entry.get('launches') if entry.get('launches') is not None else '-'}"
                f" | {chosen.get('label', '-')}"
                f" | {_num(measured.get('samples_per_s_median'), 2)} ({_num(measured.get('samples_per_s_min'), 1)}-"
                f"{_num(measured.get('samples_per_s_max'), 1)}, {measured.get('repeats_ok', 0)})"
                f" | {_mib(measured.get('peak_bytes_median'))}"
                f" | {_num(entry.get('reported_samples_per_s'), 2)} |"
            )
    return lines


def _band(band: list | None) -> str:
    """The ratio's noise band: worst repeat of one config against the best of the other, and the reverse."""
    if not band:
        return ""
    if band[0] == band[1]:
        return " (the same config, measured once)"
    return f"; band over repeats {_pct(band[0])}-{_pct(band[1])}"


def _throughput_verdict(ratio: float, band: list | None, target: float = 0.97) -> str:
    """Met or missed on the median, and whether the repeats' noise band can tell at all."""
    on_median = "met" if ratio >= target else "missed"
    if not band or band[0] == band[1] or band[0] >= target or band[1] < target:
        return on_median
    return f"{on_median} on the median, but the noise band straddles the target, so this run cannot tell"


def _targets(data: dict) -> list[str]:
    lines = []
    for scenario in data["scenarios"].values():
        ratios = scenario["ratios"]
        label = scenario["label"]
        if ratios.get("autotune_wall_over_ds_wall") is not None:
            met = "met" if ratios["autotune_wall_over_ds_wall"] <= 0.25 else "missed"
            lines.append(
                f"- {label}: autotune's wall time is {_pct(ratios['autotune_wall_over_ds_wall'])} of DeepSpeed"
                f" Autotuning's (target at most 25%: **{met}**); launches {ratios.get('autotune_launches')} vs"
                f" {ratios.get('ds_launches')}."
            )
        if ratios.get("autotune_wall_over_exhaustive_wall") is not None:
            lines.append(
                f"- {label}: autotune's wall time is {_pct(ratios['autotune_wall_over_exhaustive_wall'])} of the"
                " exhaustive grid's."
            )
        if ratios.get("autotune_tput_over_exhaustive_best") is not None:
            band = ratios.get("autotune_tput_ratio_range")
            met = _throughput_verdict(ratios["autotune_tput_over_exhaustive_best"], band)
            lines.append(
                f"- {label}: autotune's choice runs at {_pct(ratios['autotune_tput_over_exhaustive_best'])} of the"
                f" exhaustive best's re-measured throughput{_band(band)} (target at least 97%: **{met}**)."
            )
            if ratios["autotune_tput_over_exhaustive_best"] > 1:
                lines.append(
                    f"- {label}: autotune's pick re-measures faster than the grid's own pick: the grid chooses on"
                    " one trial per point, so a noisy trial can crown the wrong point."
                )
        if ratios.get("ds_tput_over_exhaustive_best") is not None:
            lines.append(
                f"- {label}: DeepSpeed Autotuning's choice runs at {_pct(ratios['ds_tput_over_exhaustive_best'])}"
                f" of the exhaustive best's{_band(ratios.get('ds_tput_ratio_range'))}."
            )
        for note in scenario.get("notes", []):
            lines.append(f"- {label}: {note}")
    return lines


def _latency(data: dict) -> list[str]:
    latency = data.get("latency") or {}
    hit = latency.get("cache_hit_cli") or {}
    if not hit:
        return []
    median = hit.get("wall_s_median")
    met = "-" if median is None else ("met" if median < hit["target_s"] else "missed")
    lines = [
        f"- Cache hit, second identical `autotune` invocation (whole process, median of {len(hit['runs'])}):"
        f" {_num(median, 2)} s (target under 1 s: **{met}**); in-process `tune()` answering from the cache:"
        f" {_num(latency.get('cache_hit_in_process_s'), 3)} s. Bare `python -c pass`:"
        f" {_num(hit['python_startup_s'], 2)} s; `autotune --version`: {_num(hit['autotune_version_s'], 2)} s.",
    ]
    imports = hit.get("top_imports") or []
    if imports:
        top = ", ".join(f"{row['module']} {row['cumulative_s']:.2f} s" for row in imports[:6])
        lines.append(f"- Where the cache hit's start-up goes (`-X importtime`, top-level, cumulative): {top}.")
    return lines


def render_markdown(data: dict, chart: str) -> str:
    machine, versions, settings = data["machine"], data["versions"], data["settings"]
    lib = ", ".join(f"{k} {v}" for k, v in versions.items())
    lines = [
        "## Tuning cost and quality: autotune vs DeepSpeed Autotuning vs an exhaustive grid",
        "",
        f"Measured {data['date']} by `benchmarks/compare_tuners.py` in one run of {_num(data['total_wall_s'], 0)} s"
        f" ({_num(data['total_wall_s'] / 60, 1)} min; budget about 20 min), from commit"
        f" {str((data.get('git') or {}).get('commit'))[:10]}"
        f"{' with uncommitted changes' if (data.get('git') or {}).get('dirty') else ''}.",
        f"Machine: {machine['cpu_model']}, {machine['logical_cores']} logical cores, {_mib(machine['ram_bytes'])} RAM"
        f"{', GPUs: ' + ', '.join(machine['gpus']) if machine.get('gpus') else ', no GPU'}. Versions: {lib}.",
        f"Workload: `{settings['model']}`, sequence {settings['seq_len']}, {settings['precision']},"
        f" {settings['device']} backend, ranks {settings['ranks']}, global batch {settings['global_batch']};"
        f" grid: ZeRO {', '.join(settings['shared_rungs'])} x micro-batch"
        f" {', '.join(str(m) for m in settings['micro_batches'])}"
        f" ({len(settings['shared_rungs']) * len(settings['micro_batches'])} points, gradient accumulation"
        " fills the global batch). Tuning trials use a fresh worker process each"
        f" ({settings['launcher']} launcher). Re-measurement: warm-up {settings['measurement']['warmup_steps']},"
        f" up to {settings['measurement']['max_steps']} measured steps; one cold run per config for its peak,"
        f" {settings['measurement']['repeats']} warm runs interleaved for its throughput (median).",
        "",
        *_table(data),
        "",
        *_targets(data),
        *_latency(data),
        "",
        "Notes:",
        "",
        *[f"- {note}" for note in data.get("caveats", [])],
        "",
        f"![tuning cost and quality]({chart})",
        "",
    ]
    return "\n".join(lines)


def write_markdown(data: dict, path: Path, chart: str) -> None:
    """`chart` is the PNG's path as seen from benchmarks/README.md, where the lead pastes this section."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_markdown(data, chart))
