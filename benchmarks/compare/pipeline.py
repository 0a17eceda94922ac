"""One benchmark run, phase by phase: grid, autotune, DeepSpeed Autotuning, memory-bound scenario,
re-measurement, cache-hit latency; returns the dict the JSON, chart and markdown are made from.

The order is chosen so that autotune and DeepSpeed's autotuner run back to back (similar load on the shared
host), after the grid has warmed the file cache for everyone's imports.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import parse_bytes
from autotune.request.context import TuneContext  # the context tune() itself uses
from autotune.tuner import tune
from compare import environment
from compare.analysis import budget_for_limit, ratios, tight_limit
from compare.ds_autotuner import run_ds_autotuner
from compare.exhaustive import best_within, run_grid
from compare.latency import cache_hit_latency
from compare.ours import make_request, run_autotune
from compare.records import MethodRun
from compare.remeasure import remeasure
from compare.settings import BenchSettings

REPO = Path(__file__).resolve().parents[2]


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _scenario_entry(
    label: str, budget: str | None, limit: int | None, methods: dict[str, MethodRun], measured: dict, notes: list[str]
) -> dict:
    entries = {}
    for name, run in methods.items():
        entry = run.to_dict()
        entry["remeasured"] = measured[run.chosen.key].to_dict() if run.chosen and run.chosen.key in measured else None
        entries[name] = entry
    return {
        "label": label,
        "memory_budget": budget,
        "limit_bytes": limit,
        "methods": entries,
        "ratios": ratios(methods, measured),
        "notes": notes,
    }


def run_benchmark(settings: BenchSettings, workdir: Path, skip_ds: bool = False) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["AUTOTUNE_CACHE_DIR"] = str(workdir / "autotune-cache")  # model summaries and results, isolated
    os.environ["DS_ACCELERATOR"] = settings.device
    if settings.threads:  # inherited by every trial, DeepSpeed autotuner experiment and CLI process alike
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(settings.threads)
    started = time.perf_counter()
    data: dict = {
        "benchmark": "compare_tuners",
        "schema": 1,
        "date": environment.now_utc(),
        "machine": environment.machine(settings.device),
        "versions": environment.versions(),
        "git": environment.git_revision(REPO),
        "settings": settings.to_dict(),
        "workdir": str(workdir),
        "load": {"start": environment.load_average(), "busy_at_start": environment.busy_processes()},
    }
    say(f"workdir {workdir}; load average {data['load']['start']}")

    loose = make_request(settings, settings.memory_budget, workdir / "grid", None)
    loose_limit = TuneContext.build(loose, outputs=False).limit_bytes
    say(f"1/6 exhaustive grid: {settings.grid_size} trials")
    grid_run = run_grid(settings, loose, progress=say)
    main_label = (
        "memory does not bind"
        if settings.device == "cpu"
        else (
            f"emulated card ({settings.gpu_memory_fraction:.2f} of the GPU)"
            if settings.gpu_memory_fraction
            else "whole GPU"
        )
    )

    say("2/6 autotune (results stored to a fresh cache file, for the cache-hit timing)")
    cached = make_request(settings, settings.memory_budget, workdir / "autotune-main", workdir / "cache-main")
    ours_main = run_autotune(settings, "main", cached)
    say(f"  autotune: {ours_main.status}, {ours_main.wall_s:.0f} s, {ours_main.launches} launches")

    methods_main: dict[str, MethodRun] = {"autotune": ours_main}
    if not skip_ds:
        say("3/6 DeepSpeed Autotuning (deepspeed --autotuning tune, fast mode)")
        base = TuneContext.build(loose, outputs=False).spec(Candidate(Rung.Z0, max(settings.micro_batches))).ds_config
        ds_run = run_ds_autotuner(settings, base, workdir / "ds-autotuning")
        say(f"  DeepSpeed: {ds_run.status}, {ds_run.wall_s:.0f} s, {ds_run.launches} launches {ds_run.error or ''}")
        methods_main["deepspeed_autotuning"] = ds_run
    methods_main["exhaustive"] = best_within(grid_run, "main", loose_limit)

    methods_tight: dict[str, MethodRun] = {}
    tight_budget = tight_limit_bytes = None
    tight_notes: list[str] = []
    if settings.tight_budget:
        if settings.tight_budget == "auto":
            derived = tight_limit(grid_run.explored, loose_limit)
            tight_budget = budget_for_limit(derived, settings.headroom) if derived else None
        else:
            tight_budget = settings.tight_budget
        if tight_budget:
            tight_limit_bytes = int(settings.headroom * parse_bytes(tight_budget))
            say(f"4/6 memory-bound scenario: --memory-budget {tight_budget} (limit {tight_limit_bytes} bytes)")
            tight = make_request(settings, tight_budget, workdir / "autotune-tight", None)
            methods_tight["autotune"] = run_autotune(settings, "memory_bound", tight)
            methods_tight["exhaustive"] = best_within(grid_run, "memory_bound", tight_limit_bytes)
            tight_notes.append(
                "DeepSpeed Autotuning is not compared here: on CPU it has no equivalent of a per-rank memory cap."
            )
            tight_notes += checkpointing_notes(methods_tight["autotune"])
            tight_notes.append(
                "the exhaustive answer reuses the grid measured above (every point must run to know whether it"
                " fits), so its wall time and launches are the whole grid's."
            )
        else:
            say("4/6 memory-bound scenario skipped: the grid's peaks leave no budget that excludes the winner")

    say("5/6 re-measuring every chosen config the same way")
    runs = [*methods_main.values(), *methods_tight.values()]
    measured = remeasure(settings, loose, [r.chosen for r in runs if r.chosen], progress=say)

    say("6/6 cache-hit latency")
    hit = tune(cached)
    latency = {
        "cache_hit_in_process_s": hit.elapsed_s if hit.from_cache else None,
        "cache_hit_in_process_from_cache": hit.from_cache,
        "cache_hit_cli": cache_hit_latency(cached),
    }

    ds_main = methods_main.get("deepspeed_autotuning")
    if tight_limit_bytes and ds_main and ds_main.chosen and ds_main.chosen.key in measured:
        peak = measured[ds_main.chosen.key].peak_bytes
        if peak:
            verdict = "over" if peak > tight_limit_bytes else "within"
            tight_notes.append(
                f"DeepSpeed Autotuning's unconstrained choice ({ds_main.chosen.label}) peaks at {peak / 2**20:.0f}"
                f" MiB per rank: {verdict} this scenario's {tight_limit_bytes / 2**20:.0f} MiB limit."
            )
    main_notes = checkpointing_notes(ours_main)
    data["scenarios"] = {
        "main": _scenario_entry(main_label, settings.memory_budget, loose_limit, methods_main, measured, main_notes)
    }
    if methods_tight:
        data["scenarios"]["memory_bound"] = _scenario_entry(
            "per-rank memory budget binds", tight_budget, tight_limit_bytes, methods_tight, measured, tight_notes
        )
    data["exhaustive_grid"] = grid_run.explored
    data["remeasured"] = {m.label: m.to_dict() for m in measured.values()}
    data["latency"] = latency
    data["load"]["end"] = environment.load_average()
    data["total_wall_s"] = time.perf_counter() - started
    data["caveats"] = caveats(data, settings)
    return data


def checkpointing_notes(run: MethodRun) -> list[str]:
    """autotune's space is wider than the grid's: each rung is also tried with gradient checkpointing."""
    trials = sum(row["candidate"]["grad_checkpointing"] for row in run.explored)
    if not trials:
        return []
    return [
        f"{trials} of autotune's {len(run.explored)} trials tried gradient checkpointing, a knob in its space that"
        " neither the grid nor DeepSpeed's autotuner has."
    ]


def caveats(data: dict, settings: BenchSettings) -> list[str]:
    """What a reader needs to weigh the figures; each one computed from the run, none hard-coded."""
    notes = [
        f"Shared host: other people's jobs ran beside this benchmark (load average {data['load']['start']} at the"
        f" start, {data['load']['end']} at the end, on {data['machine']['logical_cores']} cores); per-method load is"
        " in the JSON. Absolute samples/s are noisy: the table gives each re-measured figure's min-max over its"
        " repeats, and each ratio's band (worst vs best repeat) says whether a difference exceeds that noise.",
        "DeepSpeed Autotuning's own figure comes from its engine timers (forward + backward + step over its profile"
        " steps), which leave out launch and data overheads and read high; every throughput compared here is the"
        " re-measured one.",
        "DeepSpeed Autotuning in fast mode sets only the ZeRO stage (its own ZeRO defaults otherwise); autotune's"
        " configs also set buckets and overlap. Each config is re-measured exactly as its tuner emitted it.",
        (
            f"Every trial process of all three methods ran with OMP_NUM_THREADS={settings.threads}: on a shared"
            " host, two OpenMP threads per process wait on the core other jobs hold, and that contention (not"
            " ZeRO) then decides which stage looks fastest."
            if settings.threads
            else "Trial processes ran with torch's default thread count."
        ),
        "Re-measurement: one cold run per config (fresh process, as a tuning trial) gives its peak RSS; the"
        " throughput is the median of warm runs in one reused worker (fresh model and engine each), interleaved"
        " across configs. A run stops before the step cap once three consecutive steps agree within 10%, the"
        " same rule for every config.",
        "autotune's main run stored its trials in a fresh cache file (nothing to read back) so that a second,"
        " identical invocation could be timed as a cache hit.",
    ]
    ds = data["scenarios"]["main"]["methods"].get("deepspeed_autotuning")
    if ds and ds.get("notes"):
        notes += [f"DeepSpeed Autotuning: {n}" for n in ds["notes"]]
    if ds and ds["status"] != "ok":
        notes.append(f"DeepSpeed Autotuning did not produce a recommendation: {ds.get('error')}")
    if settings.device == "cpu":
        notes.append(
            "GPU variant (e.g. `--device cuda --model gpt2-large --seq-len 512 --emulate-gpu-gb 24`) not run: no GPU"
            " was available for this measurement."
        )
    notes.append("`autotune plan` cold-start latency for 7B/13B/70B is measured by benchmarks/plan_latency.py.")
    return notes
