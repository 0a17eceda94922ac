"""Each scenario's search under what the default really is (issues 44 and 45), for search_quality.py.

The launcher: the one launcher chooser's answer for the scenario's job (gpu_sim/designs.py default_launcher), and
beside it the answer issue 44's design gives once several nodes run warm (designs.warm_across_nodes_chooser),
so the record shows what the new default will report. The limits, read from the commands' own defaults (commit
1abdede): `autotune tune` resolves its --time-budget by device (cli/tune.py, request/tune_request.py
with_tune_time_budget: CPU_TUNE_TIME_BUDGET_S on the CPU, none on GPUs) and derives --max-trials from the search
when not given (tuning/for_context.py trial_budget, search/trial_budget.py derived_max_trials); the hook has no
time budget by default (cli/hook.py: None). The derived trial budget is the caller's to compute per scenario, from
the rungs and mode options its Search is given. Each search runs against the simulated clock (gpu_sim/budget.py),
so a budget cuts it where the simulated walls say it would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from autotune.core.ladder import Candidate
from autotune.core.measurement import MIN_SLOW_STEPS
from autotune.search.records import SearchOutcome
from autotune.trial.launch.chooser import choose_launch
from gpu_sim.budget import ClockedTrials
from gpu_sim.designs import default_launcher, warm_across_nodes_chooser
from gpu_sim.machine import WORKER_TRIAL, Launcher, TrialShape
from gpu_sim.scale import gpu_hours
from gpu_sim.scenarios import Scenario

ClockedSearch = Callable[[Scenario, Launcher, float | None, int | None], tuple[ClockedTrials, SearchOutcome]]
CODE_CHOOSER, WARM_CHOOSER = "chooser in the code", "chooser answering warm across nodes + fresh confirmation"
UNLIMITED = "no time budget (the hook's default)"
CPU_BUDGET = "the CPU's default time budget, on GPUs"
TUNE_DEFAULTS = "tune's GPU defaults (no time budget, derived --max-trials)"
DERIVED = "derived"  # CommandDefaults.tune_max_trials when tune derives it (search/trial_budget.py)


@dataclass(frozen=True)
class CommandDefaults:
    """The defaults the commands give a user who sets nothing, read from their signatures and resolved as the tune
    command resolves them: its time budget per device, its trial budget DERIVED when the signature gives none."""

    gpu_tune_time_budget_s: float | None
    cpu_tune_time_budget_s: float | None
    hook_time_budget_s: float | None
    tune_max_trials: int | str  # an int, or DERIVED

    def tune_trials(self, derived: int) -> int:
        """tune's --max-trials for a search whose derived trial budget is `derived`."""
        return derived if self.tune_max_trials == DERIVED else int(self.tune_max_trials)


def command_defaults() -> CommandDefaults:
    from autotune.cli.hook import hook_command
    from autotune.cli.tune import tune_command

    tune = inspect.signature(tune_command).parameters
    hook = inspect.signature(hook_command).parameters
    given = tune["time_budget"].default
    max_trials = tune["max_trials"].default
    return CommandDefaults(
        gpu_tune_time_budget_s=tune_time_budget(given, device="cuda"),
        cpu_tune_time_budget_s=tune_time_budget(given, device="cpu"),
        hook_time_budget_s=hook["time_budget"].default,
        tune_max_trials=DERIVED if max_trials is None else max_trials,
    )


def tune_time_budget(given: float | None, *, device: str) -> float | None:
    """The time budget `autotune tune` runs with on `device` when the option is left at `given` (cli/tune.py)."""
    from autotune.request.tune_request import TuneRequest, with_tune_time_budget

    request = TuneRequest.of(model="gpt2", device=device, time_budget_s=given)
    return with_tune_time_budget(request).search.time_budget_s


def limit_settings(defaults: CommandDefaults, *, derived: int) -> dict[str, tuple[float | None, int | None]]:
    """Per setting: the time budget and --max-trials (None: the simulator's trial budget, search_quality.py);
    `derived`: the scenario's derived trial budget (search/trial_budget.py derived_max_trials)."""
    return {
        UNLIMITED: (defaults.hook_time_budget_s, None),
        CPU_BUDGET: (defaults.cpu_tune_time_budget_s, None),
        TUNE_DEFAULTS: (defaults.gpu_tune_time_budget_s, defaults.tune_trials(derived)),
    }


def under_default(
    scenario: Scenario,
    *,
    best_speed: float,
    ds_speed: float,
    search: ClockedSearch,
    speed_of: Callable[[Candidate], float],
    defaults: CommandDefaults,
    derived: int,
) -> dict:
    """Per chooser (the code's, the injected warm-across-nodes one; one node: the same answer, run once) and per
    limit setting: the pick, its quality against the exhaustive best and DeepSpeed Autotuning's, launches, wall,
    GPU-hours (every launch holds the whole allocation) and why the search stopped. `derived`: the scenario's
    derived trial budget."""
    rows: dict[str, dict] = {}
    for name, chooser in ((CODE_CHOOSER, None), (WARM_CHOOSER, warm_across_nodes_chooser)):
        launcher = default_launcher(scenario.nodes, choose=chooser or choose_launch)
        if rows and launcher.value == rows[CODE_CHOOSER]["launcher"]:
            rows[name] = {"same_as": CODE_CHOOSER, "launcher": launcher.value}
            continue
        limits = limit_settings(defaults, derived=derived)
        settings = {
            setting: limits_row(
                scenario,
                launcher,
                limits[setting],
                best_speed=best_speed,
                ds_speed=ds_speed,
                search=search,
                speed_of=speed_of,
            )
            for setting in limits
        }
        rows[name] = {"launcher": launcher.value, "limits": settings}
    return rows


def limits_row(
    scenario: Scenario,
    launcher: Launcher,
    limits: tuple[float | None, int | None],
    *,
    best_speed: float,
    ds_speed: float,
    search: ClockedSearch,
    speed_of: Callable[[Candidate], float],
) -> dict:
    """One search under `launcher` and `limits` (time budget, --max-trials), against the simulated clock."""
    budget, max_trials = limits
    trials, outcome = search(scenario, launcher, budget, max_trials)
    pick = outcome.best.candidate if outcome.best else None
    speed = speed_of(pick) if pick else 0.0
    figures = trials.figures()
    world = scenario.nodes * scenario.node.gpus_per_node
    return {
        "time_budget_s": budget,
        "max_trials": max_trials,
        "pick": pick.key if pick else None,
        "quality": speed / best_speed if best_speed else 0.0,
        "vs_ds_autotuning": speed / ds_speed if ds_speed else None,
        **figures,
        "gpu_hours": round(gpu_hours(figures["simulated_wall_s"], world), 1),
        "stop_reason": getattr(outcome.stop_reason, "value", outcome.stop_reason),
    }


def _settings_of(row: dict, chooser: str) -> dict[str, dict]:
    entry = row["under_default"][chooser]
    return row["under_default"][entry["same_as"]]["limits"] if "same_as" in entry else entry["limits"]


def default_table(rows: list[dict], chooser: str = CODE_CHOOSER) -> str:
    """Per scenario and limit setting, under `chooser`'s launcher: pick, quality, launches, wall, GPU-hours."""
    lines = [
        f"under the default ({chooser}):",
        "| scenario | launcher | limits | pick | quality vs exhaustive | vs DS Autotuning | launches | simulated wall"
        " (of it confirmation) | GPU-hours | stopped by | cut at the deadline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        launcher = row["under_default"][chooser]["launcher"]
        for setting, d in _settings_of(row, chooser).items():
            versus = d["vs_ds_autotuning"]
            lines.append(
                f"| {row['scenario']} | {launcher} | {setting} | {d['pick']} | {d['quality']:.3f}"
                f" | {'-' if versus is None else f'{versus:.3f}'} | {d['launches']}"
                f" | {d['simulated_wall_s'] / 60:.1f} min ({d['confirmation_s'] / 60:.1f}) | {d['gpu_hours']:.1f}"
                f" | {d['stop_reason']} | {d['cut_at_deadline'] or '-'} |"
            )
    return "\n".join(lines)


def default_summary(rows: list[dict], chooser: str) -> dict[str, dict]:
    """Per limit setting, under `chooser`: the lowest quality (and where), scenarios under 0.99 of the exhaustive
    best or under DeepSpeed Autotuning's pick, and over the multi-node scenarios the median launches and the
    2-node walls."""
    settings = list(_settings_of(rows[0], chooser)) if rows else []
    return {
        setting: summary_of({row["scenario"]: (row, _settings_of(row, chooser)[setting]) for row in rows})
        for setting in settings
    }


def summary_of(per: dict[str, tuple[dict, dict]]) -> dict:
    """Over scenarios (name -> (its row, its `limits_row`)): the lowest quality (and where), scenarios under 0.99 of
    the exhaustive best or under DeepSpeed Autotuning's pick, and over the multi-node ones the median launches, the
    2-node walls and the GPU-hours."""
    multi = {name: d for name, (row, d) in per.items() if row["multi_node"]}
    worst = min(per, key=lambda name: per[name][1]["quality"])
    return {
        "lowest_quality": [worst, round(per[worst][1]["quality"], 4)],
        "under_0.99": sorted(name for name, (_, d) in per.items() if d["quality"] < 0.99),
        "under_ds_autotuning": sorted(
            name for name, (_, d) in per.items() if d["vs_ds_autotuning"] is not None and d["vs_ds_autotuning"] < 1
        ),
        "multi_node_median_launches": _median([d["launches"] for d in multi.values()]) if multi else None,
        "two_node_walls_min": {
            name: round(d["simulated_wall_s"] / 60, 1)
            for name, (row, d) in per.items()
            if row["multi_node"] and row["machine"].startswith("2 x")
        },
        "gpu_hours": {name: d["gpu_hours"] for name, d in multi.items()},
    }


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# Budgets probed for the smallest that keeps the pick within 0.99 of the exhaustive best (issue 45's bar), and the
# --max-trials values probed likewise; a probe grid, not a claim (the answer is "at most the next probe").
PROBE_BUDGETS_S = (
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    420.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    2400.0,
    3600.0,
    4800.0,
    7200.0,
)
PROBE_MAX_TRIALS = tuple(range(6, 41, 2))
QUALITY_BAR = 0.99


def proposals(
    scenario: Scenario,
    launcher: Launcher,
    *,
    best_speed: float,
    search: ClockedSearch,
    speed_of: Callable[[Candidate], float],
    defaults: CommandDefaults,
    derived: int,
) -> dict:
    """What default would keep the pick within QUALITY_BAR here, measured on the simulated clock:
    - `budget_needed_s`: the smallest probed --time-budget from which every larger probe does (the simulator's
      trial budget);
    - `max_trials_needed`: the smallest probed --max-trials from which every larger probe does (no time budget);
    - `scaled_budget`: the proposal "the budget never binds before --max-trials trials as long as the first would":
      max(the CPU's default budget, tune's default --max-trials x the first trial's wall; `derived` where tune
      derives it). The search decides nothing
      on the budget before its first trial ends, so this is the budget the tuner could set then.
    """

    def quality(budget: float | None, max_trials: int | None) -> tuple[float, ClockedTrials]:
        trials, outcome = search(scenario, launcher, budget, max_trials)
        pick = outcome.best.candidate if outcome.best else None
        return (speed_of(pick) / best_speed if pick and best_speed else 0.0), trials

    _, unlimited = quality(None, None)
    first = unlimited.events[0].seconds if unlimited.events else 0.0
    probes = {budget: quality(budget, None) for budget in PROBE_BUDGETS_S}
    by_budget = {budget: found for budget, (found, _) in probes.items()}
    by_trials = {n: quality(None, n)[0] for n in PROBE_MAX_TRIALS}
    max_trials = defaults.tune_trials(derived)
    scaled = max(defaults.cpu_tune_time_budget_s or 0.0, max_trials * first)
    scaled_quality, scaled_trials = quality(scaled, None)
    with_trials_quality, with_trials = quality(scaled, max_trials)
    return {
        "launcher": launcher.value,
        "first_trial_s": round(first, 1),
        # the smallest probe from which every larger probe keeps QUALITY_BAR, and each probe's quality
        "budget_needed_s": holds_from(by_budget),
        "max_trials_needed": holds_from(by_trials),
        "quality_by_budget_s": {str(int(b)): round(q, 4) for b, q in by_budget.items()},
        "wall_s_by_budget_s": {str(int(b)): trials.figures()["simulated_wall_s"] for b, (_, trials) in probes.items()},
        "quality_by_max_trials": {str(n): round(q, 4) for n, q in by_trials.items()},
        "scaled_budget": {
            "time_budget_s": round(scaled, 1),
            "max_trials": max_trials,
            "quality": scaled_quality,
            "simulated_wall_s": scaled_trials.figures()["simulated_wall_s"],
            "quality_with_default_max_trials": with_trials_quality,
            "simulated_wall_s_with_default_max_trials": with_trials.figures()["simulated_wall_s"],
        },
    }


# The proposal "fewer steps per trial at scale": one warm-up step instead of TrialSpec's two, and the measured steps
# stopped at MIN_SLOW_STEPS instead of MIN_STEPS (what enough_steps already allows slow steps). The parts stay: the
# search's step-time line reads them. The simulator's steps have no spread, so it shows only what this saves; on a
# real machine three steps give the median's interval [min, max] at 75% coverage (core/measurement.py), so more
# ties, and a tie costs interleaved re-measurements the simulator never needs.
SHORTER_TRIAL = TrialShape(warmup_steps=1, min_steps=MIN_SLOW_STEPS)
SHORTER_PROBE_BUDGETS_S = (600.0, 660.0, 720.0, 780.0, 840.0, 900.0, 1200.0)


def shorter_trials(
    scenario: Scenario,
    *,
    best_speed: float,
    ds_speed: float,
    search: Callable[..., tuple[ClockedTrials, SearchOutcome]],
    speed_of: Callable[[Candidate], float],
    defaults: CommandDefaults,
    derived: int,
) -> dict:
    """SHORTER_TRIAL under the warm-across-nodes answer, without a budget and with the CPU's default budget."""
    launcher = default_launcher(scenario.nodes, choose=warm_across_nodes_chooser)
    shaped = partial(search, shape=SHORTER_TRIAL)
    limits = limit_settings(defaults, derived=derived)
    probes = {}
    for name, shape in (("worker", WORKER_TRIAL), ("shorter", SHORTER_TRIAL)):
        probes[name] = {}
        for budget in SHORTER_PROBE_BUDGETS_S:
            trials, outcome = search(scenario, launcher, budget, None, shape=shape)
            pick = outcome.best.candidate if outcome.best else None
            quality = speed_of(pick) / best_speed if pick and best_speed else 0.0
            probes[name][str(int(budget))] = [round(quality, 4), trials.figures()["simulated_wall_s"]]
    return {
        "shape": asdict(SHORTER_TRIAL),
        "launcher": launcher.value,
        # per trial shape and budget: [quality, simulated wall s], the budgets around the CPU's default
        "quality_and_wall_by_budget_s": probes,
        "limits": {
            setting: limits_row(
                scenario,
                launcher,
                limits[setting],
                best_speed=best_speed,
                ds_speed=ds_speed,
                search=shaped,
                speed_of=speed_of,
            )
            for setting in (UNLIMITED, CPU_BUDGET)
        },
    }


def holds_from(quality_by_probe: dict) -> float | int | None:
    """The smallest probe from which every larger probe keeps QUALITY_BAR (probes in ascending order)."""
    found = None
    for probe, quality in reversed(list(quality_by_probe.items())):
        if quality < QUALITY_BAR:
            break
        found = probe
    return found
