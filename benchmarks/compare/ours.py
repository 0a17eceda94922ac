"""autotune's own search over the shared grid, exactly as a user would call it (tune(TuneRequest.of(...)))."""

from __future__ import annotations

import time
from pathlib import Path

from autotune.errors import NothingFitsError
from autotune.tuner import TuneRequest, tune
from compare.launchers import make_launcher
from compare.records import ChosenConfig, MethodRun
from compare.settings import BenchSettings

AUTOTUNE_REPORTED_BY = "autotune's trial: median optimizer step, end to end, after warm-up"


def make_request(settings: BenchSettings, budget: str | None, workdir: Path, cache_file: Path | None) -> TuneRequest:
    """The request both autotune and the exhaustive grid use, so both run identical trial specs.

    With a cache file the run stores its trials and answer (a fresh, empty file reads nothing back), which
    is what lets a second identical invocation be timed as a cache hit.
    """
    cuda = settings.device == "cuda"
    return TuneRequest.of(
        model=settings.model,
        gpus=settings.ranks,
        device=settings.device,
        memory_budget=None if cuda else budget,
        seq_len=settings.seq_len,
        global_batch=settings.global_batch,
        precision=settings.precision,
        headroom=settings.headroom,
        max_trials=settings.max_trials,
        micro_batches=settings.micro_batches,
        rungs=settings.autotune_rungs,
        gpu_memory_fraction=settings.gpu_memory_fraction if cuda else None,
        trial_timeout_s=settings.trial_timeout_s,
        out=str(workdir / "ds_config.json"),
        report_dir=str(workdir),
        use_cache=cache_file is not None,
        cache_dir=str(cache_file) if cache_file else None,
    )


def _explored(report: dict) -> list[dict]:
    rows = []
    for trial in report.get("trials", []):
        result = trial["result"]
        peaks = [r.get("host_rss_peak_bytes") or r.get("device_used_bytes") for r in result.get("ranks", [])]
        rows.append(
            {
                "candidate": trial["candidate"],
                "status": result["status"] if trial["within_headroom"] or result["status"] != "ok" else "over_headroom",
                "samples_per_s": result.get("samples_per_s"),
                "peak_bytes": max((p for p in peaks if p), default=None),
                "predicted_peak_bytes": trial.get("predicted_peak_bytes"),
                "wall_s": result.get("wall_s"),
                "error": result.get("error"),
            }
        )
    return rows


def run_autotune(settings: BenchSettings, scenario: str, request: TuneRequest) -> MethodRun:
    """Time tune() from the call to its written recommendation; every trial is a real launch."""
    run = MethodRun(method="autotune", scenario=scenario, status="ok", reported_by=AUTOTUNE_REPORTED_BY)
    started = time.perf_counter()
    with make_launcher(settings.launcher) as launcher:
        try:
            result = tune(request, launcher=launcher)
        except NothingFitsError as error:
            run.status, run.error = "nothing_fits", str(error)
            run.wall_s = time.perf_counter() - started
            return run.finish()
    run.wall_s = time.perf_counter() - started
    report = result.report.to_json() if result.report else {}  # the JSON autotune-report.json holds
    run.launches = result.trials_launched
    run.explored = _explored(report)
    run.reported_samples_per_s = result.samples_per_s
    if result.candidate and result.ds_config:
        run.chosen = ChosenConfig.from_ds_config(result.ds_config, result.candidate.grad_checkpointing)
    run.details = {
        "stop_reason": report.get("stop_reason"),
        "skipped": report.get("skipped"),
        "limit_bytes": report.get("limit_bytes"),
        "tune_elapsed_s": result.elapsed_s,
        "from_cache": result.from_cache,
        "candidate": result.candidate.to_dict() if result.candidate else None,
    }
    if result.from_cache:
        run.notes.append("answered from the cache: the cache file was not fresh")
    return run.finish()
