"""The multi-node designs of issue 44 (gpu_sim/designs.py) per scenario, and their table for search_quality.py."""

from __future__ import annotations

from collections.abc import Callable

from autotune.core.ladder import Candidate
from autotune.search.records import SearchOutcome
from gpu_sim.designs import FullScale, small_then_scale, warm_across_nodes
from gpu_sim.ds_autotuning import ds_autotuning
from gpu_sim.machine import Launch, Launcher, SimulatedCluster
from gpu_sim.scale import (
    extra_gpu_hours_per_startup_minute,
    gpu_hours,
    launch_costs,
    launches_seconds,
    model_broadcast_s,
)
from gpu_sim.scenarios import Scenario

SearchFn = Callable[[Scenario], tuple[SimulatedCluster, SearchOutcome]]
TODAY = "today (fresh per trial)"
WARM_RELEASED = "(a) warm across nodes, ZeRO++ groups released"
WARM_REPLACED = "(a) warm across nodes, replaced after ZeRO++"
SMALL, SMALL_TWO, SMALL_ALL = "(b) 1 node, top 3", "(b) 1+2 nodes, top 3", "(b) 1 node, top 3 + unmeasured"


def _pick_of(machine: SimulatedCluster, key: str | None) -> Candidate | None:
    return next((c for c in machine.launched if c.key == key), None)


def _launch_design(machine: SimulatedCluster, launches: list[Launch], pick: Candidate | None) -> dict:
    seconds = launches_seconds(machine, launches)
    return {
        "full_launches": len(launches),
        "small_launches": 0,
        "pick": pick.key if pick else None,
        "samples_per_s": machine.samples_per_s(pick) if pick else 0.0,
        "simulated_wall_s": round(seconds, 1),
        # of the wall, the trials' measured steps (the rest is start-up and builds)
        "steps_s": round(sum(machine.launch_steps_seconds(launch) for launch in launches), 1),
        "gpu_hours_allocation": round(gpu_hours(seconds, machine.world), 1),
        "gpu_hours_busy": round(gpu_hours(seconds, machine.world), 1),
    }


def ds_at_scale(machine: SimulatedCluster, limit: float, global_batch: int | None) -> dict:
    """DeepSpeed Autotuning on the full job, the user's checkpointing off and on (it keeps the script's setting and
    does not tune it), the better of the two counted (in its favour); every experiment a fresh full launch that also
    pays the model's broadcast (gpu_sim/scale.py)."""
    runs = []
    for checkpointing in (False, True):
        pick, launches, wall = ds_autotuning(machine, limit, global_batch, checkpointing=checkpointing)
        speed = machine.samples_per_s(pick) if pick else 0.0
        runs.append((speed, checkpointing, pick, launches, wall + launches * model_broadcast_s(machine)))
    speed, checkpointing, pick, launches, wall = max(runs, key=lambda run: run[0])
    return {
        "checkpointing": checkpointing,
        "full_launches": launches,
        "small_launches": 0,
        "pick": pick.key if pick else None,
        "samples_per_s": speed,
        "simulated_wall_s": round(wall, 1),
        "gpu_hours_allocation": round(gpu_hours(wall, machine.world), 1),
        "gpu_hours_busy": round(gpu_hours(wall, machine.world), 1),
    }


def multi_node_designs(
    scenario: Scenario,
    machine: SimulatedCluster,
    outcome: SearchOutcome,
    unconfirmed_pick: str | None,
    full: FullScale,
    search: SearchFn,
) -> dict:
    """Every design on one multi-node scenario. `machine` ran autotune's search at full scale as the GPU default
    does (warm trials, the pick confirmed fresh), `outcome` its result; `unconfirmed_pick` the pick of the same
    search without the confirmation (today's multi-node default confirms nothing apart)."""
    best_speed = max((machine.samples_per_s(c) for c in _fitting(full)), default=0.0)
    pick = outcome.best.candidate if outcome.best else None
    designs = {
        TODAY: _launch_design(machine, machine.launches(Launcher.FRESH), _pick_of(machine, unconfirmed_pick)),
        WARM_RELEASED: _launch_design(machine, machine.launches(Launcher.WARM_CONFIRMED), pick),
        WARM_REPLACED: _launch_design(machine, warm_across_nodes(machine), pick),
        SMALL: small_then_scale(full, scenario, search),
        SMALL_ALL: small_then_scale(full, scenario, search, unmeasured_at_scale=True),
    }
    if scenario.nodes > 2:
        designs[SMALL_TWO] = small_then_scale(full, scenario, search, small_nodes=(1, 2))
    ds = ds_at_scale(machine, full.limit, scenario.global_batch)
    for row in designs.values():
        row["quality"] = row["samples_per_s"] / best_speed if best_speed else 0.0
        row["vs_ds_autotuning"] = row["samples_per_s"] / ds["samples_per_s"] if ds["samples_per_s"] else None
        row["extra_gpu_hours_per_startup_minute"] = round(
            extra_gpu_hours_per_startup_minute(row["full_launches"], machine.world), 1
        )
    ds["quality"] = ds["samples_per_s"] / best_speed if best_speed else 0.0
    costs = launch_costs(machine)
    return {
        "world": machine.world,
        "exhaustive_samples_per_s": best_speed,
        "launch_costs_s": {
            "process_start": round(costs.process_start_s, 2),
            "fresh_build": round(costs.fresh_build_s, 2),
            "warm_build": round(costs.warm_build_s, 2),
            "model_broadcast": round(model_broadcast_s(machine), 2),
        },
        "designs": designs,
        "ds_autotuning": ds,
    }


def _fitting(full: FullScale) -> list[Candidate]:
    return [
        Candidate(rung, m, ckpt, mode)
        for rung in full.modes
        for mode in full.modes[rung]
        for ckpt in (False, True)
        for m in full.micro_batches
        if full.fits(Candidate(rung, m, ckpt, mode))
    ]


def designs_table(rows: list[dict]) -> str:
    """Per multi-node scenario and design: launches, wall, GPU-hours, pick and its quality."""
    lines = [
        "| scenario | design | full-allocation launches | small launches | simulated wall | GPU-hours (allocation"
        " held) | pick | quality vs exhaustive | vs DS Autotuning's pick |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        multi = row.get("multi_node")
        if not multi:
            continue
        entries = [*multi["designs"].items(), ("DS Autotuning", multi["ds_autotuning"])]
        for name, d in entries:
            versus = d.get("vs_ds_autotuning")
            lines.append(
                f"| {row['scenario']} ({multi['world']} GPUs) | {name} | {d['full_launches']} | {d['small_launches']}"
                f" | {d['simulated_wall_s'] / 60:.1f} min | {d['gpu_hours_allocation']:.1f} | {d['pick']}"
                f" | {d['quality']:.3f} | {'-' if versus is None else f'{versus:.3f}'} |"
            )
    return "\n".join(lines)


def designs_medians(rows: list[dict]) -> dict[str, float]:
    """Median full-allocation launches per design over the multi-node scenarios."""
    per_design: dict[str, list[int]] = {}
    for row in rows:
        for name, d in (row.get("multi_node") or {}).get("designs", {}).items():
            per_design.setdefault(name, []).append(d["full_launches"])
    return {name: _median(values) for name, values in per_design.items()}


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
