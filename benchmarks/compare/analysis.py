"""Turning measurements into the comparison: the tight budget for scenario 2, and the ratios per scenario."""

from __future__ import annotations

import itertools
import math

from compare.records import MethodRun, Remeasured

MiB = 2**20


def tight_limit(grid_rows: list[dict], loose_limit: int | None) -> int | None:
    """A per-rank peak limit that excludes the unconstrained winner, set in the widest gap between measured peaks.

    Chosen from the grid's own peaks so that the budget binds whatever the model; the widest gap below the
    winner's peak keeps every point clearly on one side, so run-to-run RSS noise cannot flip a verdict.
    """
    ok = [r for r in grid_rows if r["status"] == "ok" and r["samples_per_s"] and r["peak_bytes"]]
    ok = [r for r in ok if loose_limit is None or r["peak_bytes"] <= loose_limit]
    if len(ok) < 2:
        return None
    winner = max(ok, key=lambda r: r["samples_per_s"])
    peaks = sorted({r["peak_bytes"] for r in ok if r["peak_bytes"] < winner["peak_bytes"]} | {winner["peak_bytes"]})
    if len(peaks) < 2:
        return None  # the winner is also the smallest: no budget can exclude it and keep anything
    low, high = max(itertools.pairwise(peaks), key=lambda pair: pair[1] - pair[0])
    return (low + high) // 2


def budget_for_limit(limit_bytes: int, headroom: float) -> str:
    """The --memory-budget whose headroom share is `limit_bytes` (rounded up to a MiB), as a user would write it."""
    return f"{math.ceil(limit_bytes / headroom / MiB)}MiB"


def _speed(run: MethodRun | None, measured: dict[str, Remeasured]) -> float | None:
    if run is None or run.chosen is None or run.chosen.key not in measured:
        return None
    return measured[run.chosen.key].samples_per_s


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def _ratio_range(top: MethodRun | None, bottom: MethodRun | None, measured: dict[str, Remeasured]) -> list | None:
    """The ratio's extremes over the repeats (worst of one vs best of the other): its noise band."""
    if not (top and bottom and top.chosen and bottom.chosen):
        return None
    if top.chosen.key == bottom.chosen.key:
        return [1.0, 1.0]  # the same config, measured once: no band
    a, b = measured.get(top.chosen.key), measured.get(bottom.chosen.key)
    if not (a and b and a.speeds and b.speeds):
        return None
    return [min(a.speeds) / max(b.speeds), max(a.speeds) / min(b.speeds)]


def ratios(methods: dict[str, MethodRun], measured: dict[str, Remeasured]) -> dict:
    ours, ds, grid = methods.get("autotune"), methods.get("deepspeed_autotuning"), methods.get("exhaustive")
    best = _speed(grid, measured)
    result = {
        "autotune_wall_over_ds_wall": _ratio(ours.wall_s if ours else None, ds.wall_s if ds else None),
        "autotune_wall_over_exhaustive_wall": _ratio(ours.wall_s if ours else None, grid.wall_s if grid else None),
        "autotune_tput_over_exhaustive_best": _ratio(_speed(ours, measured), best),
        "ds_tput_over_exhaustive_best": _ratio(_speed(ds, measured), best),
        "autotune_tput_ratio_range": _ratio_range(ours, grid, measured),
        "ds_tput_ratio_range": _ratio_range(ds, grid, measured),
        "autotune_launches": ours.launches if ours else None,
        "ds_launches": ds.launches if ds else None,
        "exhaustive_launches": grid.launches if grid else None,
    }
    if ds is not None:
        result["ds_own_figure_over_remeasured"] = _ratio(ds.reported_samples_per_s, _speed(ds, measured))
    if ours is not None:
        result["autotune_own_figure_over_remeasured"] = _ratio(ours.reported_samples_per_s, _speed(ours, measured))
    result["targets"] = {
        "wall_at_most_25pct_of_ds": (
            None if result["autotune_wall_over_ds_wall"] is None else result["autotune_wall_over_ds_wall"] <= 0.25
        ),
        "tput_at_least_97pct_of_exhaustive": (
            None
            if result["autotune_tput_over_exhaustive_best"] is None
            else result["autotune_tput_over_exhaustive_best"] >= 0.97
        ),
    }
    return result
