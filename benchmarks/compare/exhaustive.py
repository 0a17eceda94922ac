"""The reference: every point of the shared grid run as a real autotune trial, best measured wins.

Each point runs the very TrialSpec autotune's search would run for it (built by tune's own context from
the same request), on the same kind of launcher, so the grid and autotune differ only in which points
they choose to run.
"""

from __future__ import annotations

import time

from autotune.core.ladder import Candidate
from autotune.request.context import TuneContext  # the context tune() itself uses
from autotune.trial import run_trial
from autotune.tuner import TuneRequest
from compare.launchers import make_launcher
from compare.records import ChosenConfig, MethodRun
from compare.settings import SHARED_RUNGS, BenchSettings

EXHAUSTIVE_REPORTED_BY = "the grid point's own trial: median optimizer step, end to end, after warm-up"


def grid(settings: BenchSettings) -> list[Candidate]:
    return [Candidate(rung, micro_batch) for rung in SHARED_RUNGS for micro_batch in settings.micro_batches]


def _row(candidate: Candidate, ds_config: dict, result) -> dict:
    return {
        "candidate": candidate.to_dict(),
        "ds_config": ds_config,
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "peak_bytes": result.peak_memory_bytes,
        "steps": len(result.step_times_s),
        "wall_s": result.wall_s,
        "startup_s": result.startup_s,
        "error": result.error,
    }


def run_grid(settings: BenchSettings, request: TuneRequest, progress=print) -> MethodRun:
    """Run every grid point; the best is chosen by `best_within` per scenario afterwards."""
    run = MethodRun(method="exhaustive", scenario="all", status="ok", reported_by=EXHAUSTIVE_REPORTED_BY)
    context = TuneContext.build(request, outputs=False)
    started = time.perf_counter()
    with make_launcher(settings.launcher) as launcher:
        for index, candidate in enumerate(grid(settings), start=1):
            spec = context.spec(candidate)
            result = run_trial(spec, launcher)
            row = _row(candidate, spec.ds_config, result)
            run.explored.append(row)
            speed = f"{result.samples_per_s:.2f} samples/s" if result.samples_per_s else result.error or ""
            progress(
                f"  grid {index}/{settings.grid_size} {candidate.key}: {result.status} {speed} ({result.wall_s:.0f} s)"
            )
    run.wall_s = time.perf_counter() - started
    run.launches = len(run.explored)
    run.details = {"limit_bytes": int(settings.headroom * context.target.free_memory_bytes)}
    return run.finish()


def best_within(grid_run: MethodRun, scenario: str, limit_bytes: int | None) -> MethodRun:
    """The grid's answer under a per-rank peak limit: the same test autotune applies (peak <= headroom x budget).

    A tighter scenario reuses the measured grid: every point still has to be run to know whether it fits,
    so wall time and launches are those of the whole grid.
    """
    fitting = [
        row
        for row in grid_run.explored
        if row["status"] == "ok"
        and row["samples_per_s"]
        and (limit_bytes is None or (row["peak_bytes"] or 0) <= limit_bytes)
    ]
    run = MethodRun(
        method="exhaustive",
        scenario=scenario,
        status="ok" if fitting else "nothing_fits",
        wall_s=grid_run.wall_s,
        launches=grid_run.launches,
        reported_by=grid_run.reported_by,
        explored=grid_run.explored,
        load_before=grid_run.load_before,
        load_after=grid_run.load_after,
        details={"limit_bytes": limit_bytes, "fitting_points": len(fitting)},
    )
    if fitting:
        best = max(fitting, key=lambda row: row["samples_per_s"])
        run.chosen = ChosenConfig.from_ds_config(best["ds_config"], best["candidate"]["grad_checkpointing"])
        run.reported_samples_per_s = best["samples_per_s"]
    return run
