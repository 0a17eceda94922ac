"""Does a warm GPU worker measure what a fresh process does? The rows of the kit's warm stage.

`autotune` runs trials in warm workers (one process, trial after trial: start-up paid once); on GPUs it runs the
pick once more in a fresh process before recommending it (`--trial-workers auto`), because nobody has yet compared
the two on a GPU: an earlier trial's leftovers (a cached segment, a process group's NCCL buffers) would be counted
in the next trial's peak, or push it into an OOM the user's fresh job would not hit (the search drops a pick that
does not fit fresh, at one fresh launch per dropped pick). The kit's warm stage runs the memory stage's first points
again, one after another in one warm pool, and these rows put each beside its fresh row. What a row says, per
measure: warm, fresh, and warm - fresh; plus start-up and throughput both ways, and the card's used memory after
each warm trial (read from outside the worker, so it does not rest on the pool's own figure).
"""

from __future__ import annotations

MEASURES = ("max_allocated_bytes", "max_reserved_bytes", "nvml_peak_bytes", "host_rss_peak_bytes")
TIMES = ("startup_s", "wall_s", "samples_per_s")


def compare(warm: dict, fresh: dict) -> dict:
    """One warm row beside its fresh twin: each memory measure warm, fresh and the difference; times both ways."""
    row: dict = {"key": warm["key"], "status": warm["status"], "error": warm.get("error")}
    for name in MEASURES:
        a, b = warm.get(name), fresh.get(name)
        row[name] = {"warm": a, "fresh": b, "warm_minus_fresh": a - b if a is not None and b is not None else None}
    for name in TIMES:
        row[name] = {"warm": warm.get(name), "fresh": fresh.get(name)}
    row["card_used_after_bytes"] = warm.get("gpu_used_after_bytes")
    return row


def summary(rows: list[dict], restarts: int, recycled: list[int]) -> dict:
    """The largest difference per measure over the warm trials that ran, and the card's growth between them."""
    ran = [r for r in rows if r["status"] == "ok"]
    out: dict = {"trials": len(rows), "ok": len(ran), "pool_restarts": restarts, "recycled_growth_bytes": recycled}
    for name in MEASURES:
        diffs = [r[name]["warm_minus_fresh"] for r in ran if r[name]["warm_minus_fresh"] is not None]
        if diffs:
            out[f"largest_abs_{name}_diff"] = max(diffs, key=abs)
    used = [r["card_used_after_bytes"] for r in ran if r["card_used_after_bytes"] is not None]
    if len(used) > 1:
        out["card_used_growth_after_first_bytes"] = max(used[1:]) - used[0]
    return out


def pick_confirmation(report_json: dict) -> dict | None:
    """The tune stage's pick: its peak in warm workers beside its fresh-process confirmation (the GPU default,
    search/pick_decision.py), and every pick the confirmation dropped because it did not fit fresh; where its own
    trial was the first of a launch (no confirmation launched, nothing warm to compare), that trial's peak with
    `own_first_trial`; None when the tune wrote no report or confirmed nothing (the CPU backend)."""
    from autotune.errors import MalformedReportError
    from autotune.report.data import TuneReport
    from autotune.search.records import LaunchPurpose

    try:
        report = TuneReport.from_json(report_json)
    except MalformedReportError:  # the tune failed: its row keeps the error
        return None
    confirmations = [t for t in report.trials if t.purpose == LaunchPurpose.FRESH]
    if report.choice is not None and not confirmations and report.choice.peak_in_fresh_process:
        choice = report.choice
        return {"pick": choice.candidate.key, "fresh_peak_bytes": choice.peak_bytes, "own_first_trial": True}
    if report.choice is None or not confirmations:
        return None
    pick = report.choice.candidate
    fresh = [t.result.peak_memory_bytes for t in confirmations if t.candidate == pick and t.within_headroom]
    warm = [
        peak
        for t in report.trials
        if t.candidate == pick and t.purpose != LaunchPurpose.FRESH and (peak := t.result.peak_memory_bytes)
    ]
    out: dict = {
        "pick": pick.key,
        "fresh_peak_bytes": fresh[-1] if fresh else None,
        "warm_peak_bytes": max(warm) if warm else None,
        "dropped_picks": [t.candidate.key for t in confirmations if not t.within_headroom],
    }
    if out["fresh_peak_bytes"] is not None and out["warm_peak_bytes"] is not None:
        out["warm_minus_fresh_bytes"] = out["warm_peak_bytes"] - out["fresh_peak_bytes"]
    return out
