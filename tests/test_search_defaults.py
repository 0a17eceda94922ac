"""The candidate default limits of issue 45 (benchmarks/gpu_sim/default_rules.py, benchmarks/search_defaults.py):
the derived rule is src's own (autotune.search.trial_budget), the comparisons are built on its constants, and the
simulated figures the record reports come out of the rules as written."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fakes.simulator import scenario_named

from autotune.core.ladder import Rung
from autotune.request.tune_request import CPU_TUNE_TIME_BUDGET_S, default_of
from autotune.search.mode_walk import RATIO_MICRO_BATCHES, RATIO_TRIES
from autotune.search.pick_decision import ROUNDS
from autotune.search.trial_budget import derived_max_trials

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from gpu_sim import default_rules  # noqa: E402
from gpu_sim.default_rules import DERIVED, FORMER, RULES, SearchShape, one_per_group  # noqa: E402
from gpu_sim.machine import Launcher  # noqa: E402


def _rule(name: str):
    return next(rule for rule in RULES if rule.name == name)


def test_the_terms_are_the_search_s_own() -> None:
    """Seven rungs without modes: 14 groups; one per group + 1 boundary + 2 x ROUNDS close call, and twice the
    groups for the derived rule; partial offload adds its own cap per rung and checkpointing setting."""
    plain = SearchShape(rungs=7, mode_groups=0, ratio_modes=0)
    assert one_per_group(plain) == 14 + 1 + 2 * ROUNDS
    assert derived_max_trials(plain) == 28 + 1 + 2 * ROUNDS
    ratio = SearchShape(rungs=7, mode_groups=0, ratio_modes=1)
    assert one_per_group(ratio) - one_per_group(plain) == 2 * RATIO_MICRO_BATCHES * RATIO_TRIES


def test_the_derived_rule_is_the_code_s_default() -> None:
    """The rule the simulator measures as tune's GPU default is src's derived_max_trials with no time budget, and
    the code's --max-trials default is "derive it" (None); the former rule restates commit 90893db."""
    rule = _rule(DERIVED)
    assert rule.max_trials is derived_max_trials and rule.time_budget_s is None
    assert default_of("max_trials") is None
    former = _rule(FORMER)
    assert former.max_trials(SearchShape(rungs=7, mode_groups=0, ratio_modes=0)) == default_rules.FORMER_MAX_TRIALS
    assert former.time_budget_s == default_rules.FORMER_TIME_BUDGET_S == CPU_TUNE_TIME_BUDGET_S


def test_the_shape_counts_only_modes_that_apply_and_run() -> None:
    """Several nodes by default (same training): ZeRO++ hpZ on z3 and z3 + optimizer offload, nothing else; with
    --allow-approximate the quantized variants and partial offload join."""
    from search_quality import RUNGS, mode_options

    scenario = scenario_named("multi-node-infiniband")
    default = default_rules.scenario_shape(RUNGS, mode_options(scenario, approximate=False))
    assert default == SearchShape(rungs=7, mode_groups=2, ratio_modes=0)
    assert derived_max_trials(default) == 41  # the figure commit 1abdede states for hpZ on several nodes
    approximate = default_rules.scenario_shape(RUNGS, mode_options(scenario, approximate=True))
    assert approximate.mode_groups > default.mode_groups and approximate.ratio_modes == 1
    one_node_modes = mode_options(scenario_named("memory-not-binding"), approximate=False)
    one_node = default_rules.scenario_shape(RUNGS, one_node_modes)
    assert derived_max_trials(one_node) == 33


def test_a_budget_of_first_trial_walls_is_never_below_the_floor() -> None:
    rule = _rule("derived as first-trial walls")
    shape = SearchShape(rungs=7, mode_groups=0, ratio_modes=0)
    assert rule.budget_s(shape, first_trial_s=1.0) == default_rules.FORMER_TIME_BUDGET_S
    assert rule.budget_s(shape, first_trial_s=100.0) == 33 * 100.0


def test_twelve_trials_miss_the_pick_that_the_derived_budget_keeps() -> None:
    """offload-buys-micro-batch under the same-training modes: 12 trials stop short of the pick (0.898 of the
    exhaustive best), the derived budget lets the search end by itself on the best (1.000)."""
    from search_defaults import clocked, rule_row
    from search_quality import cluster, exhaustive, grid, mode_grid, mode_options

    scenario = scenario_named("offload-buys-micro-batch")
    modes = mode_options(scenario, approximate=False)
    machine, _, _ = cluster(scenario)
    _, best_speed, _ = exhaustive(machine, grid(scenario, machine.world), mode_grid(modes))
    unlimited, _ = clocked(scenario, Launcher.WARM_CONFIRMED, modes, (None, None, True))
    first = unlimited.events[0].seconds

    def row(name: str) -> dict:
        rule = _rule(name)
        return rule_row(scenario, Launcher.WARM_CONFIRMED, modes, rule=rule, first_trial_s=first, best_speed=best_speed)

    twelve, derived = row("12 trials"), row(DERIVED)
    assert twelve["quality"] < 0.99 and twelve["stop_reason"] == "trial_budget"
    assert derived["quality"] == 1.0 and derived["stop_reason"] != "trial_budget"
    assert derived["trials"] < derived["max_trials"]


def test_walk_trials_are_counted_per_group() -> None:
    """The histogram the record quotes for the two-per-group rule: first and boundary-walk trials per group."""
    from search_defaults import clocked, walk_trials_per_group
    from search_quality import mode_options

    scenario = scenario_named("memory-not-binding")
    modes = mode_options(scenario, approximate=False)
    _, outcome = clocked(scenario, Launcher.WARM_CONFIRMED, modes, (None, None, True))
    counts = walk_trials_per_group(outcome)
    walk = [t for t in outcome.trials if t.purpose in ("first of a group", "boundary walk")]
    assert sum(int(n) * groups for n, groups in counts.items()) == len(walk)
    assert sum(counts.values()) == sum(t.purpose == "first of a group" for t in outcome.trials)
    assert Rung.Z3 in {t.candidate.rung for t in walk}
