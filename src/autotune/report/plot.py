"""autotune-report.png: predicted and measured peak per tried candidate against the limit, and the
measured speed with the 95% interval of its median (error bars), the chosen config's bars marked, so the
search and how sure its pick is can be read at a glance.

matplotlib is optional (`pip install 'autotune[plot]'`); without it the report says the picture was skipped.
The figure is drawn on a bare `matplotlib.figure.Figure` with the Agg canvas: no pyplot, so no global
state and no display is touched in the caller's process.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.core.measurement import speed_of
from autotune.infra.atomic import atomic_write_bytes
from autotune.trial.trial_types import TrialResult

if TYPE_CHECKING:
    from autotune.report.data import TuneReport

MIB = 2**20


def _trial_rows(report: TuneReport) -> list[dict[str, Any]]:
    """One bar group per trial: its label, predicted and measured peak, status, speed with interval, and pick."""
    rows = []
    for trial in report.trials:
        candidate, result = trial.candidate, trial.result
        peaks = [
            peak
            for rank in result.ranks
            if (peak := rank.device_used_bytes or rank.max_reserved_bytes or rank.host_rss_peak_bytes)
        ]
        checkpointing = " ckpt" if candidate.grad_checkpointing else ""
        mode = "" if candidate.mode.is_classic else f"\n{'+'.join(candidate.mode.parts)}"
        rows.append(
            {
                "label": f"{candidate.rung.value}\nmb{candidate.micro_batch}{checkpointing}{mode}",
                "predicted": trial.predicted_peak_bytes or 0,
                "measured": max(peaks) if peaks else 0,
                "status": result.status,
                "speed": result.samples_per_s or 0.0,
                "interval": _interval(result),
                "chosen": report.choice is not None and candidate == report.choice.candidate,
            }
        )
    return rows


def _interval(result: TrialResult) -> tuple[float, float]:
    """The speed's distance down and up to its interval's ends (autotune.core.measurement), for error bars."""
    speed = speed_of(result.step_times_s, result.samples_per_s)
    if speed is None or not result.ok:
        return 0.0, 0.0
    return speed.median - speed.low, speed.high - speed.median


def write_report_plot(report: TuneReport, path: Path) -> tuple[Path | None, str]:
    """Draw the picture at `path` (atomically); returns (path or None, a line for the report)."""
    rows = _trial_rows(report)
    if not rows:
        return None, "No picture: no trial ran (plan only or answered from the cache)."
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None, "No picture: matplotlib is not installed (pip install 'autotune[plot]')."
    figure = Figure(figsize=(max(6.0, 1.1 * len(rows) + 2), 6.5), layout="constrained")
    FigureCanvasAgg(figure)
    memory, speed = figure.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    positions = list(range(len(rows)))
    width = 0.38
    memory.bar([x - width / 2 for x in positions], [r["predicted"] / MIB for r in rows], width, label="predicted peak")
    measured = memory.bar(
        [x + width / 2 for x in positions], [r["measured"] / MIB for r in rows], width, label="measured peak"
    )
    for bar, row in zip(measured, rows, strict=True):
        if row["status"] != "ok":
            bar.set_hatch("//")
            memory.annotate(
                row["status"],
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    limit = report.limit_bytes
    if limit:
        memory.axhline(limit / MIB, color="red", linestyle="--", label=f"limit ({report.headroom:.0%} of free)")
    unit = "per-rank RSS" if report.device == "cpu" else "GPU memory"
    memory.set_ylabel(f"peak {unit} (MiB)")
    memory.set_title(f"autotune: {report.model_name} on {report.target_description}")
    memory.legend(loc="upper left", fontsize=8)
    errors = [[r["interval"][0] for r in rows], [r["interval"][1] for r in rows]]
    colors = ["tab:orange" if r["chosen"] else "tab:green" for r in rows]
    speed.bar(positions, [r["speed"] for r in rows], 0.5, color=colors, yerr=errors, capsize=3)
    for x, row in zip(positions, rows, strict=True):
        if row["chosen"]:
            speed.annotate("pick", (x, row["speed"] + row["interval"][1]), ha="center", va="bottom", fontsize=8)
    speed.set_ylabel("samples/s (95% interval)")
    speed.set_xticks(positions, [r["label"] for r in rows], fontsize=8)
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    atomic_write_bytes(path, image.getvalue())  # the mode of every other output, never half a picture
    return path, embed_line(path)


def embed_line(path: Path) -> str:
    """The markdown that shows the picture from the report beside it."""
    return f"![predicted and measured peak per candidate, and speed]({path.name})"
