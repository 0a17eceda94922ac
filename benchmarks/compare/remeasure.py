"""Re-measure every chosen config the same way: same trial worker, same warm-up and measured steps, same timer.

Each method reports its choice's speed with its own clock (DeepSpeed's autotuner with engine timers that
leave out data and launch overheads, so they read high), so none of those figures is compared directly.

Two kinds of runs per config:
  cold  one fresh worker process, as a tuning trial runs: its peak RSS (VmHWM) is the config's peak memory;
  warm  `repeats` runs in one warm worker (fresh model and engine each, start-up paid once), interleaved
        A B C A B C ... so that a burst of load from other processes on the shared host spreads over all
        configs instead of landing on one; their median is the config's throughput.
A trial's measured window is short (it stops once three steps agree), so many cheap warm repeats give a
steadier median than a few cold ones would for the same time.
"""

from __future__ import annotations

from dataclasses import replace

from autotune.core.ladder import Candidate, Rung
from autotune.request.context import TuneContext  # the context tune() itself uses
from autotune.trial import LocalLauncher, WarmWorkerPool, run_trial
from autotune.trial.trial_types import TrialLauncher, TrialSpec
from autotune.tuner import TuneRequest
from compare.records import ChosenConfig, Remeasured
from compare.settings import BenchSettings


def distinct(configs: list[ChosenConfig]) -> list[ChosenConfig]:
    seen: dict[str, ChosenConfig] = {}
    for config in configs:
        seen.setdefault(config.key, config)
    return list(seen.values())


def _measure(spec: TrialSpec, launcher: TrialLauncher, kind: str) -> dict:
    result = run_trial(spec, launcher)
    return {
        "kind": kind,
        "status": result.status,
        "samples_per_s": result.samples_per_s,
        "peak_bytes": result.peak_memory_bytes,
        "steps": len(result.step_times_s),
        "step_times_s": result.step_times_s,
        "wall_s": result.wall_s,
        "error": result.error,
    }


def remeasure(
    settings: BenchSettings, request: TuneRequest, configs: list[ChosenConfig], progress=print
) -> dict[str, Remeasured]:
    """One cold run (peak memory) and `repeats` warm runs (throughput) per distinct config; no memory cap."""
    template = TuneContext.build(request, outputs=False).spec(Candidate(Rung.Z0, settings.micro_batches[0]))
    measurement = settings.measurement
    unique = distinct(configs)
    specs = {
        config.key: replace(
            template,
            ds_config=config.ds_config,
            grad_checkpointing=config.grad_checkpointing,
            warmup_steps=measurement.warmup_steps,
            max_steps=measurement.max_steps,
            host_memory_budget_bytes=None,
        )
        for config in unique
    }
    results = {config.key: Remeasured(config.key, config.label) for config in unique}
    cold = LocalLauncher()
    for config in unique:
        run = _measure(specs[config.key], cold, "cold")
        results[config.key].runs.append(run)
        progress(f"  cold {config.label}: {run['status']} peak {(run['peak_bytes'] or 0) / 2**20:.0f} MiB")
    order = [config for _ in range(measurement.repeats) for config in unique]
    with WarmWorkerPool() as warm:
        for index, config in enumerate(order, start=1):
            run = _measure(specs[config.key], warm, "warm")
            results[config.key].runs.append(run)
            speed = f"{run['samples_per_s']:.2f} samples/s" if run["samples_per_s"] else run["error"] or ""
            progress(f"  warm {index}/{len(order)} {config.label}: {run['status']} {speed}")
    return results
