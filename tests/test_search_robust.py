"""The search on a simulated GPU cluster built from published figures (benchmarks/gpu_sim), which does
not share the search's priors, and its handling of timeouts and out-of-memory seeds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.fakes.machines import GIB, LinearMachine, LinearMemory
from tests.fakes.searches import mode_search

from autotune.core.ladder import Candidate, Rung
from autotune.search.pick_decision import Pick
from autotune.search.records import SearchLimits, TrialRecord
from autotune.search.walk import Search
from autotune.trial.trial_types import TrialResult

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def _scenarios():
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    from gpu_sim.scenarios import SCENARIOS

    return SCENARIOS


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s.name)
def test_pick_within_3_percent_of_exhaustive_with_a_quarter_of_its_trials(scenario) -> None:
    from search_quality import run_scenario

    row = run_scenario(scenario)
    assert row["autotune"]["quality"] >= 0.97, row["autotune"]["tried"]
    assert row["autotune"]["trials"] <= row["exhaustive"]["trials"] / 4


def test_zero3_is_measured_after_zero2_offload_although_the_ladder_puts_it_later() -> None:
    """No A1 edge joins ZeRO-2 + offload and ZeRO-3: a measured ZeRO-2 + offload never drops ZeRO-3."""
    from gpu_sim.scenarios import SCENARIOS
    from search_quality import RUNGS, cluster, grid

    scenario = next(s for s in SCENARIOS if s.name == "zero3-vs-zero2-small-batches")
    machine, target, settings = cluster(scenario)
    Search(
        machine.model, target, settings, machine.run, rungs=RUNGS, micro_batches=grid(scenario, machine.world)
    ).run_search()
    rungs = [c.rung for c in machine.launched]
    assert Rung.Z2_OFFLOAD_OPT in rungs and Rung.Z3 in rungs
    assert rungs.index(Rung.Z2_OFFLOAD_OPT) < rungs.index(Rung.Z3)


def _machine(name: str, powers_of_two: bool = False):
    """A scenario's machine and grid; `powers_of_two` pins the grid as `--micro-batches 1,2,4,...` would."""
    from gpu_sim.scenarios import SCENARIOS
    from search_quality import RUNGS, cluster, grid

    scenario = next(s for s in SCENARIOS if s.name == name)
    machine, target, settings = cluster(scenario)
    micro_batches = grid(scenario, machine.world)
    if powers_of_two:
        micro_batches = [m for m in micro_batches if m & (m - 1) == 0]
    return machine, target, settings, RUNGS, micro_batches


def test_timeout_at_the_seed_retries_a_smaller_micro_batch_and_is_remembered() -> None:
    # a pinned power-of-two grid: one retry at half the micro-batch reaches one that runs within the timeout
    machine, target, settings, rungs, micro_batches = _machine("memory-not-binding", powers_of_two=True)
    calls: list[Candidate] = []

    def slow_above_2(candidate: Candidate) -> tuple[TrialResult, bool]:
        calls.append(candidate)
        if candidate.micro_batch > 2:
            return TrialResult(status="timeout", error="no result within the 900 s trial timeout"), False
        return machine.run(candidate)

    outcome = Search(
        machine.model, target, settings, slow_above_2, rungs=rungs, micro_batches=micro_batches
    ).run_search()
    assert outcome.best is not None and outcome.best.candidate.micro_batch <= 2
    first = calls[0]
    assert first.micro_batch > 2 and calls[1].rung is first.rung and calls[1].micro_batch < first.micro_batch
    assert len(set(calls)) == len(calls), "a timed-out candidate was launched twice"
    remembered = [t for t in outcome.trials if t.from_cache and t.result.status == "timeout"]
    assert all("timed out earlier" in (t.result.error or "") for t in remembered)


def test_oom_with_nothing_run_jumps_by_the_memory_model() -> None:
    """The first trial OOMs because the machine needs far more than predicted: the next trial is chosen by
    the memory model recalibrated on that failure, not one grid step down."""
    machine, target, settings, rungs, micro_batches = _machine("checkpointing-wins")
    extra = 6 * 2**30  # memory the search's model does not know about
    launched: list[Candidate] = []

    def heavy(candidate: Candidate) -> tuple[TrialResult, bool]:
        launched.append(candidate)
        peak = (
            machine.gpu_bytes(candidate)
            + extra
            + machine.gpu_bytes(candidate)
            - machine.gpu_bytes(Candidate(candidate.rung, 1, candidate.grad_checkpointing))
        )
        if peak > machine.gpu.memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory."), False
        return machine.run(candidate)

    outcome = Search(
        machine.model, target, settings, heavy, rungs=rungs, micro_batches=micro_batches, limits=SearchLimits(40)
    ).run_search()
    assert outcome.best is not None
    statuses: dict[tuple, list[str]] = {}
    for t in outcome.trials:
        statuses.setdefault((t.candidate.rung, t.candidate.grad_checkpointing), []).append(t.result.status)
    for group in statuses.values():  # never walks down the grid one OOM at a time
        first_success = group.index("ok") if "ok" in group else len(group)
        assert first_success <= 2, statuses


def test_two_close_configs_are_remeasured_interleaved_and_a_tie_goes_to_the_simpler() -> None:
    """Candidates within each other's noise (steps spread +-10%): re-measured interleaved (A, B, A, B), and
    with the spread still wider than the margin the pick is the simpler config, said to be a tie."""
    from autotune.search.pick_decision import simplicity

    machine, target, settings, rungs, micro_batches = _machine("memory-not-binding")
    order: list[Candidate] = []

    def noisy(candidate: Candidate) -> tuple[TrialResult, bool]:
        order.append(candidate)
        result, _ = machine.run(candidate)
        if not result.ok:
            return result, False
        step = result.step_times_s[0]
        return replace(result, step_times_s=[step * f for f in (0.7, 0.85, 1.0, 1.15, 1.3)]), False

    outcome = Search(
        machine.model, target, settings, noisy, rungs=rungs, micro_batches=micro_batches, limits=SearchLimits(40)
    ).run_search()
    verdict = outcome.verdict
    assert outcome.remeasured and verdict is not None and verdict.tie and verdict.remeasured
    a, b = order[-4], order[-3]
    assert order[-4:] == [a, b, a, b] and a != b  # interleaved, not A, A, B, B
    assert {a, b} == {verdict.pick, verdict.runner_up}
    assert simplicity(verdict.pick) < simplicity(verdict.runner_up)
    assert outcome.best.candidate == verdict.pick and outcome.noise == pytest.approx(verdict.spread)
    assert outcome.to_dict()["verdict"]["tie"] is True


def test_a_clear_winner_is_not_remeasured() -> None:
    machine, target, settings, rungs, micro_batches = _machine("memory-not-binding")
    outcome = Search(
        machine.model, target, settings, machine.run, rungs=rungs, micro_batches=micro_batches
    ).run_search()
    assert not outcome.remeasured and outcome.noise == 0.0 and outcome.margin is not None
    assert outcome.verdict is not None and not outcome.verdict.tie and outcome.margin > 0
    assert len(set(machine.launched)) == len(machine.launched)


def test_offload_rungs_over_the_host_ram_headroom_are_not_chosen() -> None:
    """GPU trials: the node's host RSS peak is held to the headroom too (offload pins host buffers)."""
    from autotune.estimate.estimate_types import EstimateSettings
    from autotune.hardware.specs import Target
    from autotune.models import resolve_model, summarize
    from gpu_sim.machine import SimulatedCluster
    from gpu_sim.scenarios import SCENARIOS
    from search_quality import RUNGS, grid

    scenario = next(s for s in SCENARIOS if s.name == "offload-and-checkpointing")  # only offload rungs fit
    model = summarize(resolve_model(scenario.model))
    probe = SimulatedCluster(model, scenario.node, 1, scenario.seq_len)
    needed = probe.host_bytes_per_node(Candidate(Rung.Z3_OFFLOAD_OPT, 1))
    node = replace(scenario.node, host_ram_bytes=int(needed / 0.95))  # fits the RAM, not the 90% headroom
    machine = SimulatedCluster(model, node, 1, scenario.seq_len)
    target = Target(
        node.gpu,
        node.gpus_per_node,
        1,
        node.gpu.memory_bytes,
        host_ram_bytes=node.host_ram_bytes,
        nvme_free_bytes=None,
        measured=True,
    )
    settings = EstimateSettings(seq_len=scenario.seq_len, precision="bf16")
    outcome = Search(
        model, target, settings, machine.run, rungs=RUNGS, micro_batches=grid(scenario, 4), limits=SearchLimits(40)
    ).run_search()
    assert outcome.best is None or outcome.best.candidate.rung.offload_optimizer is None
    assert any("host RAM peak" in s.reason for s in outcome.skipped)


def test_a_warm_worker_launch_ends_only_at_a_failure_and_pays_its_start_once() -> None:
    """The simulator's launch model: a fresh process per trial (`--trial-workers fresh`) launches once per trial; a
    warm worker (trial/launch/warm.py: the CPU default, `--trial-workers warm`) keeps its process until a trial fails.
    The
    start-up is charged once per launch, the build and steps per trial. With no trial run fresh, the GPU default's
    launches are the warm ones."""
    from gpu_sim.machine import STARTUP, Launcher

    machine = _machine("checkpointing-wins")[0]
    fits, too_big = Candidate(Rung.Z3, 4, False), Candidate(Rung.Z3, 40, False)
    assert machine.result(fits).ok and machine.result(too_big).status == "oom_gpu"
    for candidate in (fits, fits, too_big, fits, too_big):
        machine.run(candidate)
    assert [len(launch) for launch in machine.launches(Launcher.FRESH)] == [1, 1, 1, 1, 1]
    assert [len(launch) for launch in machine.launches(Launcher.WARM)] == [3, 2]  # a new process after the first OOM
    assert machine.launches(Launcher.WARM_CONFIRMED) == machine.launches(Launcher.WARM)
    saved = machine.tune_seconds(Launcher.FRESH) - machine.tune_seconds(Launcher.WARM)
    per_warm_trial = STARTUP.process_start_s + STARTUP.cold_build_s - STARTUP.warm_build_s
    assert saved == pytest.approx(3 * per_warm_trial)  # five trials, two launches


def test_a_fresh_run_is_a_launch_of_its_own_and_the_next_warm_trial_starts_a_new_process() -> None:
    """FreshAfterWarm stops the warm pool before its trial: a fresh run splits the warm worker it interrupts, is a
    launch of one (start, cold build, steps), and is run by the GPU default alone: the other two launchers confirm
    nothing, so they run the trials before it."""
    from gpu_sim.machine import STARTUP, Launcher

    machine = _machine("checkpointing-wins")[0]
    first, second, third = (Candidate(Rung.Z3, m, False) for m in (2, 3, 4))
    machine.run(first)
    machine.run(second)
    machine.run_fresh(second)
    machine.run(third)
    launches = machine.launches(Launcher.WARM_CONFIRMED)
    assert launches == [[first, second], [second], [third]]
    assert [launch.confirmation for launch in launches] == [False, True, False]
    assert machine.launches(Launcher.WARM) == [[first, second]]
    assert machine.launches(Launcher.FRESH) == [[first], [second]]
    launch = STARTUP.process_start_s + STARTUP.cold_build_s
    extra = machine.tune_seconds(Launcher.WARM_CONFIRMED) - machine.tune_seconds(Launcher.WARM)
    # the fresh run is a launch of its own, timing no smaller micro-batch (TuneContext.confirmation_spec); the third
    # trial, which the warm worker would have run after a warm build, pays a process start and a cold build
    confirmation = machine.steps_seconds(second, confirmation=True)
    assert confirmation < machine.steps_seconds(second)
    assert extra == pytest.approx(launch + confirmation + launch + machine.steps_seconds(third))
    assert machine.fresh_result(second).smaller_micro_batch is None


def _confirmed_search(name: str, fresh_extra_bytes: int = 0):
    """A scenario's search as the GPU default runs it: warm trials, the pick confirmed fresh (`run_fresh`)."""
    from gpu_sim.machine import SimulatedCluster

    base, target, settings, rungs, micro_batches = _machine(name)
    machine = SimulatedCluster(
        base.model, base.node, base.nodes, base.seq_len, base.global_batch, fresh_extra_bytes=fresh_extra_bytes
    )
    limits = SearchLimits(max_trials=28, headroom=0.9)
    search = Search(
        machine.model,
        target,
        settings,
        machine.run,
        rungs=rungs,
        micro_batches=micro_batches,
        limits=limits,
        confirm_fresh=machine.run_fresh,
    )
    return search.run_search(), machine, (target, settings, rungs, micro_batches, limits)


def _each_fresh_run_alone_and_followed_by_a_new_process(machine) -> None:
    from gpu_sim.machine import Launcher

    starts, position = set(), 0
    for launch in machine.launches(Launcher.WARM_CONFIRMED):
        starts.add(position)
        position += len(launch)
    for index in machine.fresh_runs:
        assert index in starts  # its own process...
        assert index + 1 in starts or index + 1 == len(machine.launched)  # ...alone, and the next trial starts anew


def test_the_gpu_default_launches_the_warm_launches_plus_one_per_fresh_confirmation() -> None:
    """On the published scenario (warm and fresh measure the same here) the pick fits fresh at once: one
    confirmation, last, a launch of its own beside the warm workers' launches; without the confirmation the search
    runs exactly the trials before it, which the other two launchers' accounting counts on."""
    from gpu_sim.machine import Launcher

    outcome, machine, (target, settings, rungs, micro_batches, limits) = _confirmed_search("boundary-at-11")
    assert outcome.best is not None and outcome.fresh_confirmation is not None
    assert machine.fresh_runs == {len(machine.launched) - 1}
    assert machine.launched[-1] == outcome.best.candidate
    warm = machine.launches(Launcher.WARM)
    assert len(warm) >= 2  # an OOM ended a warm worker: the count is not trivially 1
    assert machine.launches(Launcher.WARM_CONFIRMED) == [*warm, [outcome.best.candidate]]
    _each_fresh_run_alone_and_followed_by_a_new_process(machine)

    alone = _machine("boundary-at-11")[0]
    unconfirmed = Search(
        alone.model, target, settings, alone.run, rungs=rungs, micro_batches=micro_batches, limits=limits
    ).run_search()
    assert alone.launched == [c for c, _ in machine.trials(Launcher.WARM)]
    assert unconfirmed.best is not None and unconfirmed.best.candidate == outcome.best.candidate


def test_a_confirmation_that_does_not_fit_is_a_launch_and_the_next_one_confirms_another_pick() -> None:
    """A test's own difference (no published scenario has one: no measurement exists): a fresh process needs just
    enough more than the warm worker measured that the warm pick goes over the headroom fresh. Each confirmation is
    a launch of its own; the picks after the first come from what was measured (the simulator's speeds have no
    spread to re-measure), so the GPU default's launches are the warm workers' plus one per confirmation."""
    from gpu_sim.machine import Launcher

    warm_outcome, warm_machine, _ = _confirmed_search("checkpointing-wins")
    assert warm_outcome.best is not None
    warm_pick = warm_outcome.best.candidate
    limit = 0.9 * warm_machine.gpu.memory_bytes
    extra = int(limit - warm_machine.gpu_bytes(warm_pick)) + 1
    outcome, machine, _ = _confirmed_search("checkpointing-wins", fresh_extra_bytes=extra)
    assert outcome.best is not None and outcome.best.candidate != warm_pick
    confirmed = [machine.launched[i] for i in sorted(machine.fresh_runs)]
    assert confirmed[0] == warm_pick and confirmed[-1] == outcome.best.candidate and len(confirmed) >= 2
    assert machine.gpu_bytes(outcome.best.candidate) + extra <= limit
    assert machine.launched[-len(confirmed) :] == confirmed  # no warm trial between or after them
    launches = machine.launches(Launcher.WARM_CONFIRMED)
    assert launches == [*machine.launches(Launcher.WARM), *([c] for c in confirmed)]
    _each_fresh_run_alone_and_followed_by_a_new_process(machine)


def test_a_pick_whose_own_trial_was_first_in_its_process_is_not_launched_again() -> None:
    """multi-node-infiniband: the ZeRO-3 group's first trial runs out of memory, the pool replaces the workers, and
    the pick is the new workers' first trial: measured from a fresh process's state, it is its own confirmation, and
    the GPU default launches exactly what the warm workers did."""
    from gpu_sim.machine import Launcher

    outcome, machine, _ = _confirmed_search("multi-node-infiniband")
    best = outcome.best
    assert best is not None and best.result.first_in_process and not best.from_cache
    assert outcome.fresh_confirmation is best
    assert machine.fresh_runs == set()
    assert machine.launches(Launcher.WARM_CONFIRMED) == machine.launches(Launcher.WARM)
    assert best.candidate in [launch[0] for launch in machine.launches(Launcher.WARM)]  # first of a launch


def test_a_warm_launch_s_first_trial_measures_what_a_fresh_process_does() -> None:
    """The simulator's own difference between fresh and warm peaks (a test's, `fresh_extra_bytes`) is on a warm
    launch's first trial too: it starts from a fresh process's state. Later trials of that launch measure without it."""
    from gpu_sim.machine import SimulatedCluster

    base = _machine("checkpointing-wins")[0]
    extra = 2**30
    machine = SimulatedCluster(
        base.model, base.node, base.nodes, base.seq_len, base.global_batch, fresh_extra_bytes=extra
    )
    first, second = Candidate(Rung.Z3, 2, False), Candidate(Rung.Z3, 3, False)
    one, _ = machine.run(first)
    two, _ = machine.run(second)
    assert one.first_in_process and not two.first_in_process
    assert one.peak_memory_bytes == machine.gpu_bytes(first) + extra
    assert two.peak_memory_bytes == machine.gpu_bytes(second)


def test_a_cached_first_trial_confirms_nothing() -> None:
    """A result from the cache was measured by another run: only this run's first-in-process trial stands in for
    the confirmation launch."""
    search = mode_search(LinearMachine(memory_bytes=16 * GIB), LinearMemory(), {}, [Rung.Z3])
    candidate = Candidate(Rung.Z3, 4, False)
    result = TrialResult(status="ok", samples_per_s=4.0, step_times_s=[1.0] * 5, first_in_process=True)
    pick = Pick(search.state, search.ladder)
    search.state.outcome.trials.append(TrialRecord(candidate, result, 0, 16 * GIB, from_cache=True))
    assert pick._first_in_process(candidate) is None
    search.state.outcome.trials.append(mine := TrialRecord(candidate, result, 0, 16 * GIB))
    assert pick._first_in_process(candidate) is mine
    search.state.outcome.trials.append(TrialRecord(candidate, replace(result, first_in_process=False), 0, 16 * GIB))
    assert pick._first_in_process(candidate) is mine  # a later warm trial does not take its place


def test_every_launch_says_why_it_was_made() -> None:
    """Every trial run now carries why the search launched it; the outcome (and the tune report) counts them."""
    machine, target, settings, rungs, micro_batches = _machine("boundary-at-11")
    limits = SearchLimits(max_trials=28, headroom=0.9)
    outcome = Search(
        machine.model, target, settings, machine.run, rungs=rungs, micro_batches=micro_batches, limits=limits
    ).run_search()
    purposes = outcome.to_dict()["launches_by_purpose"]
    assert sum(purposes.values()) == outcome.trials_launched == len(machine.launched)
    assert "" not in purposes and purposes["first of a group"] >= 1
    assert purposes.get("boundary walk", 0) >= 1  # the boundary falls between powers of two: walked to
