"""Which default --max-trials and --time-budget keep the simulated search within 0.99 of the exhaustive best (issue 45).

For every scenario of `gpu_sim/scenarios.py` and every candidate rule of `gpu_sim/default_rules.py`, autotune's
search runs against the simulated clock (gpu_sim/budget.py) under the launcher the default gives the job
(trial/launch/chooser.py, and beside it the "warm across nodes" answer issue 44 designs), with the modes a GPU tune
really gets: by default no mode that changes the training (`--allow-approximate` off: no partial offload, no ZeRO++
quantization, no ZenFlow; modes/applies.py `_same_training_only`), and the exhaustive best it is held to is the
best over that same set. The `--allow-approximate` search (all modes, the reference of
records/search-quality_sim_2026-11-29.md) is run too. Per rule: scenarios under 0.99, the lowest quality, the
median and worst simulated wall, launches; per scenario, the smallest --max-trials from which every larger one keeps
0.99 (`max_trials_needed`) beside what each derived rule gives. The rule `autotune tune` applies on GPUs since
commit 1abdede is gpu_sim/default_rules.py DERIVED (src's derived_max_trials, no time budget).

    python benchmarks/search_defaults.py        # writes results/search_defaults.json, prints the tables
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.fakes (gpu_sim)

from autotune.core.ladder import Candidate, Rung
from autotune.modes.applies import ModeOption
from autotune.search.records import LaunchPurpose, SearchLimits, SearchOutcome
from autotune.search.relations import same_group
from autotune.search.walk import Search
from gpu_sim.budget import ClockedTrials, SimClock
from gpu_sim.budget_report import QUALITY_BAR, holds_from
from gpu_sim.default_rules import DERIVED, RULES, Rule, SearchShape, scenario_shape
from gpu_sim.designs import default_launcher, warm_across_nodes_chooser
from gpu_sim.machine import Launcher
from gpu_sim.results import write_result
from gpu_sim.scenarios import SCENARIOS, Scenario
from search_quality import HEADROOM, RUNGS, cluster, exhaustive, grid, mode_grid, mode_options, offload_ratios

RESULTS = Path(__file__).resolve().parent / "results" / "search_defaults.json"
DEFAULT_MODES, APPROXIMATE_MODES = "default (same training)", "--allow-approximate"
CODE, WARM_ACROSS = "chooser in the code", "warm across nodes + fresh confirmation (injected)"
PROBE_MAX_TRIALS = tuple(range(2, 41))


def clocked(
    scenario: Scenario,
    launcher: Launcher,
    modes: dict[Rung, list[ModeOption]],
    limits: tuple[int | None, float | None, bool],
) -> tuple[ClockedTrials, SearchOutcome]:
    """The search against the simulated clock; `limits`: --max-trials (None: none), --time-budget (None: none),
    and whether the trial running at the deadline is cut there (tuning/trials.py budgeted_spec does today)."""
    max_trials, budget, cut = limits
    machine, target, settings = cluster(scenario)
    clock = SimClock()
    trials = ClockedTrials(machine, launcher, clock, deadline_s=budget if cut else None)
    search = Search(
        machine.model,
        target,
        settings,
        trials.run,
        rungs=RUNGS,
        micro_batches=grid(scenario, machine.world),
        limits=SearchLimits(max_trials=max_trials or 10**6, time_budget_s=budget, headroom=HEADROOM),
        global_batch=scenario.global_batch,
        modes=lambda rung: modes[rung],
        offload_ratios=offload_ratios(),
        confirm_fresh=trials.run_fresh if launcher is Launcher.WARM_CONFIRMED else None,
        clock=clock,
    )
    return trials, search.run_search()


def rule_row(
    scenario: Scenario,
    launcher: Launcher,
    modes: dict[Rung, list[ModeOption]],
    *,
    rule: Rule,
    first_trial_s: float,
    best_speed: float,
) -> dict:
    """One rule's search: its limits, the pick's quality against the exhaustive best, launches, trials, wall."""
    shape = scenario_shape(RUNGS, modes)
    max_trials, budget = rule.max_trials(shape), rule.budget_s(shape, first_trial_s)
    trials, outcome = clocked(scenario, launcher, modes, (max_trials, budget, rule.cut_at_deadline))
    pick = outcome.best.candidate if outcome.best else None
    speed = trials.machine.samples_per_s(pick) if pick else 0.0
    figures = trials.figures()
    return {
        "max_trials": max_trials,
        "time_budget_s": None if budget is None else round(budget, 1),
        "pick": pick.key if pick else None,
        "quality": round(speed / best_speed, 4) if best_speed else 0.0,
        "launches": figures["launches"],
        "trials": figures["trials"],
        "simulated_wall_s": figures["simulated_wall_s"],
        "confirmation_s": figures["confirmation_s"],
        "cut_at_deadline": figures["cut_at_deadline"],
        "stop_reason": getattr(outcome.stop_reason, "value", outcome.stop_reason),
    }


def launchers(scenario: Scenario) -> dict[str, Launcher]:
    """The code's chooser's launcher, and the warm-across-nodes answer where it differs (several nodes)."""
    code = default_launcher(scenario.nodes)
    warm = default_launcher(scenario.nodes, choose=warm_across_nodes_chooser)
    return {CODE: code} if warm is code else {CODE: code, WARM_ACROSS: warm}


def scenario_rows(scenario: Scenario) -> dict:
    """Per mode setting and launcher: every rule's row and the smallest --max-trials that holds."""
    machine, _, _ = cluster(scenario)
    out: dict = {"scenario": scenario.name, "machine": f"{scenario.nodes} x {scenario.node.name}", "settings": {}}
    for name, approximate in ((DEFAULT_MODES, False), (APPROXIMATE_MODES, True)):
        modes = mode_options(scenario, approximate=approximate)
        best, best_speed, _ = exhaustive(machine, grid(scenario, machine.world), mode_grid(modes))
        shape = scenario_shape(RUNGS, modes)
        per_launcher = {}
        for chooser, launcher in launchers(scenario).items():
            unlimited, free = clocked(scenario, launcher, modes, (None, None, True))
            first = unlimited.events[0].seconds if unlimited.events else 0.0
            rows = {
                rule.name: rule_row(scenario, launcher, modes, rule=rule, first_trial_s=first, best_speed=best_speed)
                for rule in RULES
            }
            per_launcher[chooser] = {
                "launcher": launcher.value,
                "first_trial_s": round(first, 1),
                "max_trials_needed": trials_needed(scenario, launcher, modes, best_speed),
                "walk_trials_per_group": walk_trials_per_group(free),
                "rules": rows,
            }
        out["settings"][name] = {
            "exhaustive_best": best.key if best else None,
            "shape": asdict(shape),
            "launchers": per_launcher,
        }
    return out


WALK = (LaunchPurpose.FIRST, LaunchPurpose.BOUNDARY)


def walk_trials_per_group(outcome: SearchOutcome) -> dict[str, int]:
    """How many groups the unbounded walk gave 1, 2, 3... trials (its first trial and the boundary walk; the pick's
    confirmations, ratio trials and close calls apart): what the derived rule's two per group assumes
    (autotune.search.trial_budget)."""
    walked: list[list[Candidate]] = []
    for record in outcome.trials:
        if record.from_cache or record.purpose not in WALK:
            continue
        group = next((g for g in walked if same_group(g[0], record.candidate)), None)
        if group is None:
            walked.append([record.candidate])
        else:
            group.append(record.candidate)
    counts: dict[str, int] = {}
    for group in walked:
        counts[str(len(group))] = counts.get(str(len(group)), 0) + 1
    return dict(sorted(counts.items()))


def trials_needed(
    scenario: Scenario, launcher: Launcher, modes: dict[Rung, list[ModeOption]], best_speed: float
) -> int | None:
    """The smallest probed --max-trials (no time budget) from which every larger probe keeps QUALITY_BAR."""
    quality = {}
    for n in PROBE_MAX_TRIALS:
        trials, outcome = clocked(scenario, launcher, modes, (n, None, True))
        pick = outcome.best.candidate if outcome.best else None
        quality[n] = trials.machine.samples_per_s(pick) / best_speed if pick and best_speed else 0.0
    return holds_from(quality)


def summary(rows: list[dict], setting: str, chooser: str) -> dict[str, dict]:
    """Per rule over the scenarios (the code's launcher where `chooser` gives none of its own): scenarios under
    QUALITY_BAR, the lowest quality, median and worst wall, median and total launches."""
    found: dict[str, dict] = {}
    for rule in RULES:
        per = {}
        for row in rows:
            launchers_ = row["settings"][setting]["launchers"]
            per[row["scenario"]] = (launchers_.get(chooser) or launchers_[CODE])["rules"][rule.name]
        walls = [d["simulated_wall_s"] for d in per.values()]
        worst = min(per, key=lambda name: per[name]["quality"])
        found[rule.name] = {
            "under_bar": sorted(name for name, d in per.items() if d["quality"] < QUALITY_BAR),
            "lowest_quality": [worst, per[worst]["quality"]],
            "median_wall_min": round(statistics.median(walls) / 60, 1),
            "worst_wall_min": [max(per, key=lambda n: per[n]["simulated_wall_s"]), round(max(walls) / 60, 1)],
            "median_launches": statistics.median(d["launches"] for d in per.values()),
            "launches": sum(d["launches"] for d in per.values()),
        }
    return found


def summary_table(found: dict[str, dict], title: str) -> str:
    lines = [
        title,
        "| rule | under 0.99 | lowest quality | median wall | worst wall | median launches | launches, all |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        d = found[rule.name]
        under = f"{len(d['under_bar'])}" + (f" ({', '.join(d['under_bar'])})" if d["under_bar"] else "")
        lines.append(
            f"| {rule.name} | {under} | {d['lowest_quality'][1]:.3f} ({d['lowest_quality'][0]})"
            f" | {d['median_wall_min']} min | {d['worst_wall_min'][1]} min ({d['worst_wall_min'][0]})"
            f" | {d['median_launches']:g} | {d['launches']} |"
        )
    return "\n".join(lines)


def needed_table(rows: list[dict], setting: str) -> str:
    """Per scenario and launcher: trials the unbounded search launches, the smallest that holds, the rules' counts."""
    lines = [
        f"--max-trials needed ({setting}):",
        "| scenario | launcher | shape (rungs, mode groups, ratio) | unbounded: trials, wall | needed"
        " | one per group | derived (two per group) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        entry = row["settings"][setting]
        shape = SearchShape(**entry["shape"])
        for d in entry["launchers"].values():
            free = d["rules"]["unbounded"]
            lines.append(
                f"| {row['scenario']} | {d['launcher']} | {shape.rungs}, {shape.mode_groups}, {shape.ratio_modes}"
                f" | {free['trials']}, {free['simulated_wall_s'] / 60:.1f} min | {d['max_trials_needed']}"
                f" | {d['rules']['one per group']['max_trials']} | {d['rules'][DERIVED]['max_trials']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    started = time.monotonic()
    rows = [scenario_rows(s) for s in chosen]
    summaries = {
        setting: {chooser: summary(rows, setting, chooser) for chooser in (CODE, WARM_ACROSS)}
        for setting in (DEFAULT_MODES, APPROXIMATE_MODES)
    }
    figures = {
        "quality_bar": QUALITY_BAR,
        "rules": [{"name": r.name, "why": r.why} for r in RULES],
        "summary": summaries,
        "scenarios": rows,
    }
    write_result(args.out, "default search limits on the simulated GPU cluster (benchmarks/gpu_sim)", started, figures)
    for setting, by_chooser in summaries.items():
        for chooser, found in by_chooser.items():
            print(summary_table(found, f"\n{setting}, {chooser}:"))
        print()
        print(needed_table(rows, setting))


if __name__ == "__main__":
    main()
