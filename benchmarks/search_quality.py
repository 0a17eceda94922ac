"""Search quality on a simulated GPU cluster that does not share the search's beliefs.

For every scenario in `gpu_sim/scenarios.py`: the exhaustive grid's best config (every rung x
checkpointing x micro-batch, and every applicable modern memory mode that the simulator models: each
offload ratio of the real grid, each ZeRO++ variant; within the headroom), autotune's search, and DeepSpeed
Autotuning's strategy (stage x micro-batch, no offload, no modes) on the same simulator. The search runs as autotune's
GPU default does on one node: trials in warm workers, the pick confirmed once more in a fresh process
(`confirm_fresh`). Reports pick throughput / exhaustive best, measured points (trials) and launches (process starts)
apart, under each of autotune's three launchers (`gpu_sim.machine.Launcher`: a fresh process per trial, warm workers,
warm workers with the fresh confirmation), each with its simulated wall time, and under the one autotune's default
really uses for it (`default`: the launcher chooser's answer for the scenario's job, trial/launch/chooser.py, read
through gpu_sim/designs.py default_launcher); the pick the search makes without the confirmation (what the other two
recommend); and the trials counted by why the search launched them (and, finer, `launch_breakdown`, over the fresh
launcher's launches: the walk's direction and which launches another could have carried in its process). The
search gets the same trial budget as before the modes existed (a quarter of the classic grid), so the modes have to
pay for themselves in it; the confirmation is not held to it (search/pick_decision.py Pick.confirm_fresh). For each
multi-node scenario, `multi_node`: today's launches against issue 44's two designs (gpu_sim/designs.py) and
DeepSpeed Autotuning, with full-allocation launches, wall and GPU-hours (gpu_sim/scale.py: start-up figures are lower
bounds).

`under_default` (gpu_sim/budget_report.py): the search as the default runs it against the simulated clock
(gpu_sim/budget.py), under the chooser's launcher and under an injected "warm across nodes + fresh confirmation"
answer, without a time budget (the hook's default), with the CPU's default --time-budget (600 s) kept on GPUs, and
under `autotune tune`'s GPU defaults since commit 1abdede (no time budget, --max-trials derived by
autotune.search.trial_budget from the rungs and the mode options this Search is given, every mode here); the
headline's launches are that last search's under the chooser in the code (`tune_defaults`); `default_proposals`:
the smallest budget and --max-trials that keep 0.99 of the exhaustive best; `shorter_trials` (several nodes): fewer
warm-up and measured steps per trial.

    python benchmarks/search_quality.py            # writes results/search_quality.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.fakes (gpu_sim)

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.estimate.estimate_types import EstimateSettings
from autotune.hardware.specs import Target
from autotune.models import resolve_model, summarize
from autotune.modes.applies import ModeFacts, ModeOption, considered_modes, ratio_grid
from autotune.modes.search_view import is_ratio_mode
from autotune.search.records import LaunchPurpose, RunTrial, SearchLimits, SearchOutcome
from autotune.search.trial_budget import derived_max_trials
from autotune.search.walk import Search, same_group
from gpu_sim.budget import ClockedTrials, SimClock
from gpu_sim.budget_report import (
    CODE_CHOOSER,
    TUNE_DEFAULTS,
    WARM_CHOOSER,
    command_defaults,
    default_summary,
    default_table,
    limits_row,
    proposals,
    shorter_trials,
    summary_of,
    under_default,
)
from gpu_sim.default_rules import scenario_shape
from gpu_sim.design_report import designs_medians, designs_table, multi_node_designs
from gpu_sim.designs import FullScale, default_launcher, warm_across_nodes_chooser
from gpu_sim.ds_autotuning import ds_autotuning
from gpu_sim.machine import WORKER_TRIAL, Launcher, SimulatedCluster, TrialShape, models_mode
from gpu_sim.results import write_result
from gpu_sim.scenarios import SCENARIOS, Scenario

RUNGS = [Rung.Z0, Rung.Z1, Rung.Z2, Rung.Z2_OFFLOAD_OPT, Rung.Z3, Rung.Z3_OFFLOAD_OPT, Rung.Z3_OFFLOAD_ALL]
HEADROOM = 0.9
MAX_MICRO_BATCH = 128  # far above any fitting micro-batch in the scenarios (the largest fits 60-odd)
RESULTS = Path(__file__).resolve().parent / "results" / "search_quality.json"


def grid(scenario: Scenario, world: int) -> list[int]:
    """Every integer micro-batch up to MAX_MICRO_BATCH (autotune's default grid shape since integer micro-batches);
    with a fixed global batch, the divisors of its per-rank share (whole accumulations only)."""
    if scenario.global_batch is None:
        return list(range(1, MAX_MICRO_BATCH + 1))
    per_rank = scenario.global_batch // world
    return [m for m in range(1, min(per_rank, MAX_MICRO_BATCH) + 1) if per_rank % m == 0]


def cluster(scenario: Scenario, shape: TrialShape = WORKER_TRIAL) -> tuple[SimulatedCluster, Target, EstimateSettings]:
    model = summarize(resolve_model(scenario.model))
    gpu = scenario.node.gpu
    # the trials stop over the search's limit after warm-up, as request/context.py's spec asks on GPUs
    limit = int(HEADROOM * gpu.memory_bytes)
    machine = SimulatedCluster(
        model,
        scenario.node,
        scenario.nodes,
        scenario.seq_len,
        scenario.global_batch,
        shape=shape,
        stop_over_bytes=limit,
    )
    target = Target(
        gpu,
        scenario.node.gpus_per_node,
        scenario.nodes,
        gpu.memory_bytes,
        host_ram_bytes=scenario.node.host_ram_bytes,
        nvme_free_bytes=None,
        measured=True,
    )
    return machine, target, EstimateSettings(seq_len=scenario.seq_len, precision="bf16")


def mode_options(scenario: Scenario, *, approximate: bool = True) -> dict[Rung, list[ModeOption]]:
    """autotune.modes.applies' own answer for this machine, per rung. A mode the simulator has no model of (ZenFlow,
    SuperOffload) cannot be "run" here: it is passed on as not trial-verifiable, so the search plans and lists it
    but never picks it, exactly as on a backend that cannot run it. `approximate`: with the modes that change the
    training (--allow-approximate), over which this benchmark measures the search's quality; without, the
    default's own (modes/applies.py _same_training_only)."""
    facts = ModeFacts(
        nodes=scenario.nodes, gpus_per_node=scenario.node.gpus_per_node, device="cuda", allow_approximate=approximate
    )
    return {
        rung: [
            option if models_mode(option.mode) else replace(option, trial_verifiable=False)
            for option in considered_modes(rung, facts)
        ]
        for rung in RUNGS
    }


def derived_trials(scenario: Scenario) -> int:
    """`autotune tune`'s default --max-trials for this scenario's search: src's derived_max_trials over the rungs and
    the mode options the simulator's Search is given (mode_options)."""
    return derived_max_trials(scenario_shape(RUNGS, mode_options(scenario)))


def offload_ratios() -> tuple[float, ...]:
    """The ratio's real settings: the grid autotune.modes.applies searches, whose sub_group_size makes each one act."""
    return tuple(r for r in ratio_grid() if 0.0 < r < 1.0)


def mode_grid(options: dict[Rung, list[ModeOption]]) -> dict[Rung, list[Mode]]:
    """Every mode setting the exhaustive reference tries per rung: classic, every ratio, every ZeRO++ variant."""
    grid: dict[Rung, list[Mode]] = {}
    for rung in RUNGS:
        modes = [Mode()]
        for option in options[rung]:
            if not (option.applies and option.trial_verifiable):
                continue
            if is_ratio_mode(option.mode):
                modes += [Mode(offload_ratio=r) for r in offload_ratios()]
            else:
                modes.append(option.mode)
        grid[rung] = modes
    return grid


def exhaustive(
    machine: SimulatedCluster, micro_batches: list[int], modes: dict[Rung, list[Mode]]
) -> tuple[Candidate | None, float, int]:
    limit = HEADROOM * machine.gpu.memory_bytes
    everything = [
        Candidate(r, m, c, mode) for r in RUNGS for mode in modes[r] for c in (False, True) for m in micro_batches
    ]
    fitting = {
        c: machine.samples_per_s(c) for c in everything if machine.result(c).ok and machine.gpu_bytes(c) <= limit
    }
    best = max(fitting, key=fitting.get, default=None)  # type: ignore[arg-type]
    return best, fitting.get(best, 0.0) if best else 0.0, len(everything)


def classic_best(machine: SimulatedCluster, micro_batches: list[int]) -> dict:
    """The best the classic ladder alone can do: how much the modes are worth in the scenario."""
    best, speed, _ = exhaustive(machine, micro_batches, {rung: [Mode()] for rung in RUNGS})
    return {"pick": best.key if best else None, "samples_per_s": speed}


def launch_breakdown(machine: SimulatedCluster, purposes: list[str], limit: float) -> dict[str, int]:
    """Why each launch of the fresh launcher (a process per trial, `Launcher.FRESH`) happened, finer than the search's
    purposes, and which launches another launch could have carried in its own process. That launcher confirms
    nothing, so the GPU default's fresh confirmations are not among them (counted apart: `fresh_confirmations`).
    A boundary-walk trial goes up (after a fit), down after a run over the headroom (its peak was measured, the
    process ran), or down after an OOM. Two ways one process could carry a later trial, counted apart (hypotheses,
    not built: the trial worker times only its micro-batch and half of it): "smaller point of a launch that ran" (a
    later trial of the same group at a smaller micro-batch than one that ran: it could be timed in that engine after
    it, smaller inputs needing less memory); "checkpointing twin" (a checkpointed group's first trial where the same
    rung and mode without checkpointing had run: the same engine with checkpointing switched on). "either" counts a
    launch once. `purposes`: the search's purpose of each of those launches, in order."""
    counts = {
        "first of a group": 0,
        "walk up after a fit": 0,
        "walk down after a run over the headroom": 0,
        "walk down after an OOM": 0,
        "offload ratio": 0,
        "boundary confirmation": 0,
        "other": 0,
        "could be a smaller point of a launch that ran": 0,
        "could be a checkpointing twin of a launch that ran": 0,
        "could share a process, either way": 0,
    }
    trials = [candidate for candidate, _ in machine.trials(Launcher.FRESH)]
    for index, candidate in enumerate(trials):
        before = trials[:index]
        ran = [c for c in before if machine.result(c).ok]
        group = [c for c in before if same_group(c, candidate)]
        purpose = purposes[index] if index < len(purposes) else ""
        if purpose == "boundary walk" and group:
            last = group[-1]
            if machine.result(last).ok and machine.gpu_bytes(last) <= limit:
                counts["walk up after a fit"] += 1
            elif machine.result(last).ok:
                counts["walk down after a run over the headroom"] += 1
            else:
                counts["walk down after an OOM"] += 1
        elif purpose in counts:
            counts[purpose] += 1
        else:
            counts["other"] += 1
        smaller = any(same_group(c, candidate) and c.micro_batch > candidate.micro_batch for c in ran)
        twin = (
            candidate.grad_checkpointing
            and not group
            and any(c.rung is candidate.rung and c.mode == candidate.mode and not c.grad_checkpointing for c in ran)
        )
        counts["could be a smaller point of a launch that ran"] += smaller
        counts["could be a checkpointing twin of a launch that ran"] += twin and not smaller
        counts["could share a process, either way"] += smaller or twin
    return counts


def trial_budget(micro_batches: list[int]) -> SearchLimits:
    """The budget the search had on powers of two (a quarter of that classic grid), so the integer grid buys nothing
    from a larger budget."""
    powers = [m for m in micro_batches if m & (m - 1) == 0]
    return SearchLimits(max_trials=len(RUNGS) * 2 * len(powers) // 4, headroom=HEADROOM)


def search(scenario: Scenario, confirm: bool) -> tuple[SimulatedCluster, SearchOutcome]:
    """autotune's search on a fresh simulated cluster; `confirm`: the pick confirmed in a fresh process, as the GPU
    default does (Search.confirm_fresh), else as `--trial-workers fresh` and `warm` search."""
    machine, _, _ = cluster(scenario)
    limits = trial_budget(grid(scenario, machine.world))
    outcome = new_search(scenario, machine, limits, run=machine.run, confirm=machine.run_fresh if confirm else None)
    return machine, outcome.run_search()


def new_search(
    scenario: Scenario,
    machine: SimulatedCluster,
    limits: SearchLimits,
    *,
    run: RunTrial,
    confirm: RunTrial | None,
    clock: Callable[[], float] = time.monotonic,
    options: dict[Rung, list[ModeOption]] | None = None,
) -> Search:
    """autotune's Search for `scenario` on `machine`, its trials run by `run` and the pick confirmed by `confirm`;
    `options`: the modes per rung (every mode unless given)."""
    _, target, settings = cluster(scenario)
    options = options or mode_options(scenario)
    return Search(
        machine.model,
        target,
        settings,
        run,
        rungs=RUNGS,
        micro_batches=grid(scenario, machine.world),
        limits=limits,
        global_batch=scenario.global_batch,
        modes=lambda rung: options[rung],
        offload_ratios=offload_ratios(),
        confirm_fresh=confirm,
        clock=clock,
    )


def clocked_search(
    scenario: Scenario,
    launcher: Launcher,
    time_budget_s: float | None,
    max_trials: int | None = None,
    shape: TrialShape = WORKER_TRIAL,
    options: dict[Rung, list[ModeOption]] | None = None,
) -> tuple[ClockedTrials, SearchOutcome]:
    """The search under `launcher` against the simulated clock (gpu_sim/budget.py), with `time_budget_s` as
    --time-budget and `max_trials` as --max-trials (None: the simulator's trial budget); `shape`: the steps of a
    trial (the worker's unless a proposal is measured); `options`: the modes (every mode unless given)."""
    machine, _, _ = cluster(scenario, shape)
    limits = replace(trial_budget(grid(scenario, machine.world)), time_budget_s=time_budget_s)
    if max_trials is not None:
        limits = replace(limits, max_trials=max_trials)
    clock = SimClock()
    trials = ClockedTrials(machine, launcher, clock, deadline_s=time_budget_s)
    confirm = trials.run_fresh if launcher is Launcher.WARM_CONFIRMED else None
    found = new_search(
        scenario, machine, limits, run=trials.run, confirm=confirm, clock=clock, options=options
    ).run_search()
    return trials, found


def unconfirmed_pick(scenario: Scenario, machine: SimulatedCluster) -> str | None:
    """The pick of the search without the fresh confirmation. Its trials must be the confirmed search's up to its
    first confirmation, which the launch accounting of the other two launchers counts on (SimulatedCluster.trials)."""
    alone, outcome = search(scenario, confirm=False)
    expected = [candidate for candidate, _ in machine.trials(Launcher.WARM)]
    if alone.launched != expected:
        raise RuntimeError(f"{scenario.name}: the search without the confirmation ran other trials than counted")
    return outcome.best.candidate.key if outcome.best else None


def launch_figures(machine: SimulatedCluster) -> dict:
    """Per launcher: points (trials), launches (process starts) and simulated wall."""
    return {
        "points": {k.value: len(machine.trials(k)) for k in Launcher},
        "launches": {k.value: len(machine.launches(k)) for k in Launcher},
        "simulated_wall_s": {k.value: round(machine.tune_seconds(k), 1) for k in Launcher},
    }


def run_scenario(scenario: Scenario) -> dict:
    machine, outcome = search(scenario, confirm=True)
    micro_batches = grid(scenario, machine.world)
    best, best_speed, total = exhaustive(machine, micro_batches, mode_grid(mode_options(scenario)))
    classic_total = len(RUNGS) * 2 * len(micro_batches)
    limits = trial_budget(micro_batches)
    ours = outcome.best.candidate if outcome.best else None
    confirmations = [
        t.candidate.key + ":" + ("fits" if t.within_headroom else t.result.status)
        for t in outcome.trials
        if t.purpose == LaunchPurpose.FRESH
    ]
    purposes: dict[str, int] = {}
    launched_purposes: list[str] = []
    for record in outcome.trials:
        if not record.from_cache:
            purpose = getattr(record, "purpose", "") or "not recorded"  # the search before purposes existed
            purposes[purpose] = purposes.get(purpose, 0) + 1
            launched_purposes.append(purpose)
    mode_trials: dict[str, int] = {}
    for candidate in machine.launched:
        if not candidate.mode.is_classic:
            family = "partial offload" if is_ratio_mode(candidate.mode) else candidate.mode.label
            mode_trials[family] = mode_trials.get(family, 0) + 1
    ds_machine, _, _ = cluster(scenario)
    ds_pick, ds_launches, ds_wall = ds_autotuning(
        ds_machine, HEADROOM * ds_machine.gpu.memory_bytes, scenario.global_batch
    )
    ds_speed = ds_machine.samples_per_s(ds_pick) if ds_pick else 0.0
    ds_global = ds_pick.micro_batch * ds_machine.accumulation(ds_pick) * ds_machine.world if ds_pick else None
    default = default_launcher(scenario.nodes)
    pick_alone = unconfirmed_pick(scenario, machine)
    multi = None
    if scenario.nodes > 1:
        _, target, settings = cluster(scenario)
        full = FullScale(machine, target, settings, micro_batches, mode_grid(mode_options(scenario)), HEADROOM)
        multi = multi_node_designs(
            scenario, machine, outcome, pick_alone, full, lambda small: search(small, confirm=False)
        )
    # DeepSpeed Autotuning's pick to beat: on several nodes the better of the user's checkpointing off and on
    ds_reference = multi["ds_autotuning"]["samples_per_s"] if multi else ds_speed
    commands, derived = command_defaults(), derived_trials(scenario)  # the same for every setting below
    defaults = under_default(
        scenario,
        best_speed=best_speed,
        ds_speed=ds_reference,
        search=clocked_search,
        speed_of=machine.samples_per_s,
        defaults=commands,
        derived=derived,
    )
    same_training = default_same_training(scenario, machine, micro_batches, default, ds_speed=ds_reference)
    launchers = {default_launcher(scenario.nodes), default_launcher(scenario.nodes, choose=warm_across_nodes_chooser)}
    proposed = [
        proposals(
            scenario,
            launcher,
            best_speed=best_speed,
            search=clocked_search,
            speed_of=machine.samples_per_s,
            defaults=commands,
            derived=derived,
        )
        for launcher in sorted(launchers, key=lambda launcher: launcher.value)
    ]
    shorter = None
    if multi:
        shorter = shorter_trials(
            scenario,
            best_speed=best_speed,
            ds_speed=ds_reference,
            search=clocked_search,
            speed_of=machine.samples_per_s,
            defaults=commands,
            derived=derived,
        )
    return {
        "scenario": scenario.name,
        "what": scenario.what,
        "model": scenario.model,
        "machine": f"{scenario.nodes} x {scenario.node.name}",
        "seq_len": scenario.seq_len,
        "global_batch": scenario.global_batch,
        "micro_batches": micro_batches,
        "exhaustive": {
            "pick": best.key if best else None,
            "samples_per_s": best_speed,
            "trials": total,
            "classic_trials": classic_total,
            "classic_best": classic_best(machine, micro_batches),
        },
        "autotune": {
            "pick": ours.key if ours else None,
            "samples_per_s": machine.samples_per_s(ours) if ours else 0.0,
            "quality": (machine.samples_per_s(ours) / best_speed) if ours and best_speed else 0.0,
            # measured points of the GPU default, its confirmations included (each also times half its micro-batch)
            "trials": len(machine.launched),
            **launch_figures(machine),
            "fresh_confirmations": confirmations,  # each "key:fits" or "key:<why not>", in order
            "pick_without_confirmation": pick_alone,
            "trial_fraction": len(machine.launched) / total,
            "tried": [c.key + ":" + machine.result(c).status for c in machine.launched],
            "mode_trials": mode_trials,
            "launch_purposes": purposes,
            "launch_breakdown": launch_breakdown(
                machine,
                [p for p in launched_purposes if p != LaunchPurpose.FRESH],
                HEADROOM * machine.gpu.memory_bytes,
            ),
            "budget": limits.max_trials,
            "modes": [
                {k: m[k] for k in ("rung", "label", "applies", "status", "trial_verifiable", "samples_per_s")}
                for m in (record.to_dict() for record in outcome.modes)
                if m["applies"]
            ],
            "stop_reason": outcome.stop_reason,
        },
        # the launcher the chooser gives this job, under the simulator's trial budget (the designs' baseline)
        "default": {
            "launcher": default.value,
            "launches": len(machine.launches(default)),
            "simulated_wall_s": round(machine.tune_seconds(default), 1),
        },
        "multi_node": multi,
        # the search as `autotune tune` on GPUs really runs it: the default's same-training modes, the chooser's
        # launcher, the derived trial budget, no time budget; held to the same-training exhaustive best
        "default_same_training": same_training,
        # the search as the default runs it, with every mode, against the simulated clock, per chooser and limits
        "under_default": defaults,
        # what `autotune tune` at its defaults does here: the chooser's launcher, the derived trial budget, no budget
        "tune_defaults": tune_defaults(defaults),
        # per launcher the default gives it (today's chooser, warm across nodes): what default would keep 0.99
        "default_proposals": proposed,
        # several nodes: the proposal of fewer steps per trial, under the warm-across-nodes answer
        "shorter_trials": shorter,
        "ds_autotuning": {
            "pick": ds_pick.key if ds_pick else None,
            "samples_per_s": ds_speed,
            "quality": ds_speed / best_speed if best_speed else 0.0,
            "trials": ds_launches,
            "launches": ds_launches,
            "simulated_wall_s": round(ds_wall, 1),
            "global_batch": ds_global,
            "trial_fraction": ds_launches / total,
        },
    }


def default_same_training(
    scenario: Scenario, machine: SimulatedCluster, micro_batches: list[int], launcher: Launcher, *, ds_speed: float
) -> dict:
    """What the default really does (modes/applies.py without --allow-approximate, the chooser's `launcher`, the
    derived --max-trials, no time budget), against the simulated clock, and the exhaustive best over those modes."""
    options = mode_options(scenario, approximate=False)
    _, best_speed, _ = exhaustive(machine, micro_batches, mode_grid(options))
    limits = (None, derived_max_trials(scenario_shape(RUNGS, options)))
    row = limits_row(
        scenario,
        launcher,
        limits,
        best_speed=best_speed,
        ds_speed=ds_speed,
        search=partial(clocked_search, options=options),
        speed_of=machine.samples_per_s,
    )
    return {"launcher": launcher.value, "exhaustive_samples_per_s": best_speed, **row}


def same_training_table(rows: list[dict]) -> str:
    """Per scenario, the default as it really runs (`default_same_training`)."""
    lines = [
        "the default as it really runs (same-training modes, the chooser's launcher, derived --max-trials, no time"
        " budget; quality against the same-training exhaustive best):",
        "| scenario | launcher | pick | quality vs exhaustive | vs DS Autotuning | launches | simulated wall"
        " (of it confirmation) | GPU-hours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        d = row["default_same_training"]
        versus = "-" if d["vs_ds_autotuning"] is None else f"{d['vs_ds_autotuning']:.3f}"
        lines.append(
            f"| {row['scenario']} | {d['launcher']} | {d['pick']} | {d['quality']:.3f} | {versus} | {d['launches']}"
            f" | {d['simulated_wall_s'] / 60:.1f} min ({d['confirmation_s'] / 60:.1f}) | {d['gpu_hours']:.1f} |"
        )
    return "\n".join(lines)


def tune_defaults(under: dict) -> dict:
    """The row of `under_default` that is `autotune tune` at its GPU defaults: the code's chooser, TUNE_DEFAULTS."""
    row = under[CODE_CHOOSER]["limits"][TUNE_DEFAULTS]
    keys = ("max_trials", "time_budget_s", "quality", "launches", "simulated_wall_s", "stop_reason")
    return {"launcher": under[CODE_CHOOSER]["launcher"], **{key: row[key] for key in keys}}


def median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def by_launcher(values: dict[str, float], format_one: Callable[[float], str] = str) -> str:
    """One figure per launcher, in `Launcher`'s order, for a table cell."""
    return " / ".join(format_one(values[k.value]) for k in Launcher)


def table(rows: list[dict]) -> str:
    names = " / ".join(k.value for k in Launcher)
    lines = [
        "| scenario | exhaustive best (integers) | autotune pick | autotune quality | points (of them modes)"
        f" + fresh confirmations | launches: {names} | simulated wall: {names} | DS Autotuning pick"
        " | DS quality | DS launches | DS simulated wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ex, ours, ds = r["exhaustive"], r["autotune"], r["ds_autotuning"]
        modes = sum(ours["mode_trials"].values())
        unconfirmed = ours["points"][Launcher.WARM.value]
        lines.append(
            f"| {r['scenario']} | {ex['pick']} ({ex['samples_per_s']:.1f}/s) | {ours['pick']} | {ours['quality']:.3f}"
            f" | {unconfirmed} ({modes}) + {len(ours['fresh_confirmations'])} | {by_launcher(ours['launches'])}"
            f" | {by_launcher(ours['simulated_wall_s'], lambda s: f'{s / 60:.0f}')} min | {ds['pick']}"
            f" | {ds['quality']:.3f} | {ds['launches']} | {ds['simulated_wall_s'] / 60:.0f} min |"
        )
    lines.append(headline(rows))
    medians = {k: median([r["autotune"]["launches"][k.value] for r in rows]) for k in Launcher}
    lines.append(
        "median autotune launches per tune if every scenario ran under one launcher: "
        + ", ".join(f"{medians[k]:g} {k.value}" for k in Launcher)
    )
    changed = [r["scenario"] for r in rows if r["autotune"]["pick"] != r["autotune"]["pick_without_confirmation"]]
    lines.append(f"picks the fresh confirmation changed: {', '.join(changed) or 'none'}")
    return "\n".join(lines)


def headline(rows: list[dict]) -> str:
    """Launches of `autotune tune` at its GPU defaults (`tune_defaults`: the chooser's launcher, the derived trial
    budget, no time budget), single- and multi-node apart, each part naming the launchers it counts."""
    parts = [f"\ntune's default launches per tune ({len(rows)} scenarios; chooser's launcher, derived --max-trials):"]
    for where, group in (("one node", False), ("several nodes", True)):
        chosen = [r["tune_defaults"] for r in rows if bool(r.get("multi_node")) is group]
        if not chosen:
            continue
        launchers = " or ".join(sorted({d["launcher"] for d in chosen}))
        full = " full-allocation" if group else ""
        parts.append(
            f"{where} ({launchers}): median {median([d['launches'] for d in chosen]):g}{full} launches over"
            f" {len(chosen)};"
        )
    return " ".join(parts).rstrip(";")


def breakdown_table(rows: list[dict]) -> str:
    """Per scenario: where the fresh launcher's launches go (launch_breakdown), with the sums over scenarios."""
    names = list(rows[0]["autotune"]["launch_breakdown"]) if rows else []
    lines = ["| scenario | launches | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
    for r in rows:
        counts = r["autotune"]["launch_breakdown"]
        lines.append(
            f"| {r['scenario']} | {r['autotune']['launches'][Launcher.FRESH.value]} | "
            + " | ".join(str(counts[n]) for n in names)
            + " |"
        )
    sums = [sum(r["autotune"]["launch_breakdown"][n] for r in rows) for n in names]
    total = sum(r["autotune"]["launches"][Launcher.FRESH.value] for r in rows)
    lines.append(f"| **all {len(rows)}** | {total} | " + " | ".join(str(v) for v in sums) + " |")
    return "\n".join(lines)


# What `under_default` searches: the default's launcher and limits, with every mode this benchmark holds the search to
EVERY_MODE = (
    "every mode the simulator models, those that change the training included (as with --allow-approximate); the"
    " default's own, same-training modes: results/search_defaults.json"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    started = time.monotonic()
    rows = [run_scenario(s) for s in chosen]
    figures = {
        "headroom": HEADROOM,
        "default_launches": headline(rows).strip(),
        "multi_node_full_launch_medians": designs_medians(rows),
        "command_defaults": asdict(command_defaults()),
        "default_same_training_summary": summary_of({r["scenario"]: (r, r["default_same_training"]) for r in rows}),
        "under_default_modes": EVERY_MODE,
        "under_default_summary": {name: default_summary(rows, name) for name in (CODE_CHOOSER, WARM_CHOOSER)},
        "scenarios": rows,
    }
    write_result(args.out, "search quality on a simulated GPU cluster (benchmarks/gpu_sim)", started, figures)
    print(table(rows))
    print()
    print(breakdown_table(rows))
    print()
    print(same_training_table(rows))
    print(json.dumps(summary_of({r["scenario"]: (r, r["default_same_training"]) for r in rows})))
    for name in (CODE_CHOOSER, WARM_CHOOSER):
        print()
        print(f"modes: {EVERY_MODE}")
        print(default_table(rows, name))
        for setting, figures in default_summary(rows, name).items():
            print(f"{setting}: {json.dumps(figures)}")
    if any(r["multi_node"] for r in rows):
        print()
        print(designs_table(rows))
        medians = designs_medians(rows)
        print(
            "\nmedian full-allocation launches over the multi-node scenarios: "
            + ", ".join(f"{name} {value:g}" for name, value in medians.items())
        )


if __name__ == "__main__":
    main()
