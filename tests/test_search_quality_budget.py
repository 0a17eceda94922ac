"""The simulated search under the default's clock (benchmarks/gpu_sim/budget.py, budget_report.py) and a trial's
steps as the worker takes them (gpu_sim/machine.py): issue 45's "quality under the default budget" and issue 44's
walls rest on this accounting."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.simulator import scenario_named, simulated_machine

from autotune.core.ladder import Candidate, Rung
from autotune.core.measurement import MAX_MEASURE_S, MIN_SLOW_STEPS, MIN_STEPS
from autotune.core.stop import StopReason
from autotune.request.tune_request import CPU_TUNE_TIME_BUDGET_S
from autotune.search.records import TIME_BUDGET_CUT

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from gpu_sim import budget_report  # noqa: E402
from gpu_sim.budget import ClockedTrials, SimClock  # noqa: E402
from gpu_sim.ds_autotuning import EXPERIMENT_STEPS, experiment_seconds  # noqa: E402
from gpu_sim.machine import PART_STEPS, STARTUP, TRIAL_STARTUP_S, WARMUP_STEPS, Launcher, StepCost  # noqa: E402
from gpu_sim.scale import launch_costs, launches_seconds  # noqa: E402


@pytest.mark.parametrize("launcher", list(Launcher))
def test_the_clock_without_a_budget_adds_up_to_the_launch_accounting(launcher: Launcher) -> None:
    """The clock charges each trial as SimulatedCluster.launches groups them: the same wall as launches_seconds."""
    from search_quality import clocked_search

    trials, outcome = clocked_search(scenario_named("memory-not-binding"), launcher, None)
    machine = trials.machine
    assert outcome.best is not None and not any(event.cut for event in trials.events)
    assert trials.clock.now == pytest.approx(launches_seconds(machine, machine.launches(launcher)))
    assert trials.launches == len(machine.launches(launcher))
    assert [event.candidate for event in trials.events] == machine.launched


def test_a_budget_stops_the_search_and_cuts_the_trial_running_at_it() -> None:
    """No trial starts after the deadline; the one running there ends at it as a budget cut; the pick's fresh
    confirmation runs after it, whole (outside the budget, tuning/trials.py)."""
    from search_quality import clocked_search

    scenario = scenario_named("zero3-beats-zero2-offload")
    unlimited, _ = clocked_search(scenario, Launcher.WARM_CONFIRMED, None)
    budget = unlimited.clock.now / 4
    trials, outcome = clocked_search(scenario, Launcher.WARM_CONFIRMED, budget)
    assert outcome.stop_reason == StopReason.TIME_BUDGET
    started, searched = 0.0, [e for e in trials.events if not (e.fresh and not e.cut)]
    for event in searched:
        assert started < budget
        started += event.seconds
    (cut,) = [event for event in trials.events if event.cut]
    assert cut is searched[-1] and started == pytest.approx(budget)
    record = next(t for t in outcome.trials if t.candidate == cut.candidate and t.result.status == "timeout")
    assert TIME_BUDGET_CUT in (record.result.error or "")
    confirmation = trials.events[-1]
    assert confirmation.fresh and not confirmation.cut and confirmation.candidate == outcome.best.candidate
    assert trials.clock.now == pytest.approx(budget + confirmation.seconds)
    assert trials.clock.now < unlimited.clock.now


def test_a_trial_cut_at_the_deadline_ends_the_warm_process() -> None:
    machine = simulated_machine("memory-not-binding")
    clock = SimClock()
    trials = ClockedTrials(machine, Launcher.WARM, clock, deadline_s=1.0)
    candidate = Candidate(Rung.Z2, 4, False)
    result, cached = trials.run(candidate)
    assert result.status == "timeout" and not cached
    assert clock.now == pytest.approx(1.0)  # stopped at the deadline (budgeted_spec: at least 1 s)
    trials.deadline_s = None
    trials.run(candidate)
    assert [event.new_process for event in trials.events] == [True, True]
    assert trials.events[1].seconds == pytest.approx(
        launch_costs(machine).fresh_trial_s + machine.steps_seconds(candidate)
    )


def _step_cost(monkeypatch: pytest.MonkeyPatch, machine, micro_s: float, optimizer_s: float = 0.0) -> None:
    monkeypatch.setattr(machine, "step_cost", lambda candidate: StepCost(micro_s * candidate.micro_batch, optimizer_s))


def test_a_trial_measures_min_steps_of_fast_steps_and_fewer_of_slow_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = simulated_machine("memory-not-binding")
    candidate = Candidate(Rung.Z2, 1, False)
    _step_cost(monkeypatch, machine, micro_s=1.0)
    assert machine.measured_steps(candidate) == MIN_STEPS
    _step_cost(monkeypatch, machine, micro_s=MAX_MEASURE_S / MIN_SLOW_STEPS)
    assert machine.measured_steps(candidate) == MIN_SLOW_STEPS
    _step_cost(monkeypatch, machine, micro_s=MAX_MEASURE_S / 4)
    assert machine.measured_steps(candidate) == 4


def test_a_trials_steps_are_warm_up_measured_and_the_step_line_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up steps are single boundary micro-steps; the second point comes after the measured steps, only where the
    trial has a half: whole steps at the half where nothing accumulates (no fixed global batch), else plain
    micro-steps at the micro-batch and half of it, those at the micro-batch also where it accumulates
    (train_steps.py timed_steps)."""
    machine = simulated_machine("memory-not-binding")
    _step_cost(monkeypatch, machine, micro_s=1.0, optimizer_s=0.5)
    one, four = Candidate(Rung.Z2, 1, False), Candidate(Rung.Z2, 4, False)
    monkeypatch.setattr(machine, "accumulation", lambda candidate: 1)
    assert machine.global_batch is None
    assert machine.steps_breakdown(one) == {"warmup": WARMUP_STEPS * 1.5, "measured": MIN_STEPS * 1.5, "parts": 0.0}
    assert machine.steps_breakdown(four)["parts"] == pytest.approx(PART_STEPS * (2.0 + 0.5))  # whole steps at 2
    monkeypatch.setattr(machine, "global_batch", 64)  # fixed: the half would accumulate more, so the plain parts
    assert machine.steps_breakdown(four)["parts"] == pytest.approx(PART_STEPS * 4.0 + PART_STEPS * 2.0)
    monkeypatch.setattr(machine, "accumulation", lambda candidate: 3)
    assert machine.steps_breakdown(one) == {
        "warmup": WARMUP_STEPS * 1.5,
        "measured": MIN_STEPS * (3 * 1.0 + 0.5),
        "parts": PART_STEPS * 1.0,
    }


def test_a_trial_that_runs_out_of_memory_is_charged_its_first_step() -> None:
    machine = simulated_machine("memory-not-binding")
    huge = Candidate(Rung.Z0, 128, False)
    assert machine.result(huge).status == "oom_gpu"
    cost = machine.step_cost(huge)
    assert machine.steps_seconds(huge) == pytest.approx(cost.micro_s + cost.optimizer_s)
    fits = Candidate(Rung.Z3, 1, True)
    assert machine.steps_seconds(fits) == pytest.approx(sum(machine.steps_breakdown(fits).values()))
    assert machine.trial_seconds(fits) == pytest.approx(TRIAL_STARTUP_S + machine.steps_seconds(fits))


def test_a_ds_autotuning_experiment_runs_its_profile_steps() -> None:
    machine = simulated_machine("memory-not-binding")
    fits = Candidate(Rung.Z3, 1, True)
    assert EXPERIMENT_STEPS == 6
    expected = STARTUP.fresh_trial_s + EXPERIMENT_STEPS * machine.cycle_seconds(fits)
    assert experiment_seconds(machine, fits) == pytest.approx(expected)


def test_the_defaults_are_read_from_the_commands() -> None:
    """Since commit 1abdede: no time budget on GPUs, the CPU's 600 s, --max-trials derived per search."""
    defaults = budget_report.command_defaults()
    assert defaults.gpu_tune_time_budget_s is None
    assert defaults.cpu_tune_time_budget_s == CPU_TUNE_TIME_BUDGET_S
    assert defaults.hook_time_budget_s is None
    assert defaults.tune_max_trials == budget_report.DERIVED
    settings = budget_report.limit_settings(defaults, derived=33)
    assert settings[budget_report.UNLIMITED] == (None, None)
    assert settings[budget_report.CPU_BUDGET] == (CPU_TUNE_TIME_BUDGET_S, None)
    assert settings[budget_report.TUNE_DEFAULTS] == (None, 33)
    pinned = replace(defaults, tune_max_trials=12)
    assert budget_report.limit_settings(pinned, derived=33)[budget_report.TUNE_DEFAULTS] == (None, 12)


def test_the_derived_trial_budget_is_src_s_over_the_search_s_modes() -> None:
    """search_quality.py's Search gets every mode (mode_options): one node 33 + the offload ratio's cap; several
    nodes also the ZeRO++ variants' groups."""
    from autotune.search.trial_budget import derived_max_trials, search_shape
    from search_quality import RUNGS, derived_trials, mode_options

    for name in ("memory-not-binding", "zeropp-wins-across-nodes"):
        options = [option for rung in RUNGS for option in mode_options(scenario_named(name))[rung]]
        assert derived_trials(scenario_named(name)) == derived_max_trials(search_shape(RUNGS, options))
    assert derived_trials(scenario_named("memory-not-binding")) > 33
    assert derived_trials(scenario_named("zeropp-wins-across-nodes")) > derived_trials(
        scenario_named("memory-not-binding")
    )


def _row(name: str) -> dict:
    from search_quality import clocked_search

    machine = simulated_machine(name)
    return budget_report.under_default(
        scenario_named(name),
        best_speed=1.0,
        ds_speed=2.0,
        search=clocked_search,
        speed_of=machine.samples_per_s,
        defaults=budget_report.command_defaults(),
        derived=40,
    )


def test_one_node_gets_the_same_answer_from_both_choosers() -> None:
    rows = _row("memory-not-binding")
    assert rows[budget_report.WARM_CHOOSER] == {
        "same_as": budget_report.CODE_CHOOSER,
        "launcher": Launcher.WARM_CONFIRMED.value,
    }
    assert set(rows[budget_report.CODE_CHOOSER]["limits"]) == {
        budget_report.UNLIMITED,
        budget_report.CPU_BUDGET,
        budget_report.TUNE_DEFAULTS,
    }
    tune = rows[budget_report.CODE_CHOOSER]["limits"][budget_report.TUNE_DEFAULTS]
    assert (tune["time_budget_s"], tune["max_trials"]) == (None, 40)


def test_several_nodes_are_run_under_each_choosers_launcher() -> None:
    rows = _row("zeropp-wins-across-nodes")
    code, warm = rows[budget_report.CODE_CHOOSER], rows[budget_report.WARM_CHOOSER]
    # the chooser in the code now gives warm workers across nodes, as the injected answer does (issue 44)
    assert (code["launcher"], warm["launcher"]) == (Launcher.WARM_CONFIRMED.value, Launcher.WARM_CONFIRMED.value)
    assert warm["same_as"] == budget_report.CODE_CHOOSER  # one answer: reported once
    pooled = code["limits"][budget_report.UNLIMITED]
    assert pooled["launches"] < pooled["trials"] and pooled["confirmation_s"] > 0
    assert pooled["vs_ds_autotuning"] == pytest.approx(pooled["quality"] / 2.0)


def test_the_scaled_budget_proposal_covers_max_trials_first_trials() -> None:
    from search_quality import clocked_search

    name = "offload-buys-micro-batch"
    machine = simulated_machine(name)
    defaults = budget_report.command_defaults()
    proposal = budget_report.proposals(
        scenario_named(name),
        Launcher.WARM_CONFIRMED,
        best_speed=1.0,
        search=clocked_search,
        speed_of=machine.samples_per_s,
        defaults=replace(defaults, cpu_tune_time_budget_s=10.0),
        derived=12,
    )
    scaled = proposal["scaled_budget"]["time_budget_s"]
    # first_trial_s is rounded to 0.1 s: 12 of it to 0.6 s
    assert proposal["scaled_budget"]["max_trials"] == 12
    assert scaled == pytest.approx(12 * proposal["first_trial_s"], abs=0.6)
    assert proposal["scaled_budget"]["quality"] > 0 and proposal["max_trials_needed"] is not None
