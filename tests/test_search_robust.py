"""The search on a simulated GPU cluster built from published figures (benchmarks/gpu_sim), which does
not share the search's priors, and its handling of timeouts and out-of-memory seeds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.core.ladder import Candidate, Rung
from autotune.search.records import SearchLimits
from autotune.search.walk import Search
from autotune.trial.types import TrialResult

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
    Search(machine.model, target, settings, machine.run, RUNGS, grid(scenario, machine.world)).run_search()
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

    outcome = Search(machine.model, target, settings, slow_above_2, rungs, micro_batches).run_search()
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

    outcome = Search(machine.model, target, settings, heavy, rungs, micro_batches, SearchLimits(40)).run_search()
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
    from autotune.search.close_call import simplicity

    machine, target, settings, rungs, micro_batches = _machine("memory-not-binding")
    order: list[Candidate] = []

    def noisy(candidate: Candidate) -> tuple[TrialResult, bool]:
        order.append(candidate)
        result, _ = machine.run(candidate)
        if not result.ok:
            return result, False
        step = result.step_times_s[0]
        return replace(result, step_times_s=[step * f for f in (0.7, 0.85, 1.0, 1.15, 1.3)]), False

    outcome = Search(machine.model, target, settings, noisy, rungs, micro_batches, SearchLimits(40)).run_search()
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
    outcome = Search(machine.model, target, settings, machine.run, rungs, micro_batches).run_search()
    assert not outcome.remeasured and outcome.noise == 0.0 and outcome.margin is not None
    assert outcome.verdict is not None and not outcome.verdict.tie and outcome.margin > 0
    assert len(set(machine.launched)) == len(machine.launched)


def test_offload_rungs_over_the_host_ram_headroom_are_not_chosen() -> None:
    """GPU trials: the node's host RSS peak is held to the headroom too (offload pins host buffers)."""
    from autotune.estimate.types import EstimateSettings
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
    target = Target(node.gpu, node.gpus_per_node, 1, node.gpu.memory_bytes, node.host_ram_bytes, None, True)
    settings = EstimateSettings(seq_len=scenario.seq_len, precision="bf16")
    outcome = Search(model, target, settings, machine.run, RUNGS, grid(scenario, 4), SearchLimits(40)).run_search()
    assert outcome.best is None or outcome.best.candidate.rung.offload_optimizer is None
    assert any("host RAM peak" in s.reason for s in outcome.skipped)


def test_a_warm_worker_launch_ends_only_at_a_failure_and_pays_its_start_once() -> None:
    """The simulator's launch model: a fresh process per trial (autotune's GPU launcher) launches once per trial; a
    warm worker (its CPU launcher, trial/warm.py) keeps its process until a trial fails. The start-up is charged once
    per launch, the build and steps per trial."""
    from gpu_sim.machine import STARTUP

    machine = _machine("checkpointing-wins")[0]
    fits, too_big = Candidate(Rung.Z3, 4, False), Candidate(Rung.Z3, 40, False)
    assert machine.result(fits).ok and machine.result(too_big).status == "oom_gpu"
    for candidate in (fits, fits, too_big, fits, too_big):
        machine.run(candidate)
    assert [len(launch) for launch in machine.launches(warm=False)] == [1, 1, 1, 1, 1]
    assert [len(launch) for launch in machine.launches(warm=True)] == [3, 2]  # a new process after the first OOM
    saved = machine.tune_seconds(warm=False) - machine.tune_seconds(warm=True)
    per_warm_trial = STARTUP.process_start_s + STARTUP.cold_build_s - STARTUP.warm_build_s
    assert saved == pytest.approx(3 * per_warm_trial)  # five trials, two launches


def test_every_launch_says_why_it_was_made() -> None:
    """Every trial run now carries why the search launched it; the outcome (and the tune report) counts them."""
    machine, target, settings, rungs, micro_batches = _machine("boundary-at-11")
    limits = SearchLimits(max_trials=28, headroom=0.9)
    outcome = Search(machine.model, target, settings, machine.run, rungs, micro_batches, limits).run_search()
    purposes = outcome.to_dict()["launches_by_purpose"]
    assert sum(purposes.values()) == outcome.trials_launched == len(machine.launched)
    assert "" not in purposes and purposes["first of a group"] >= 1
    assert purposes.get("boundary walk", 0) >= 1  # the boundary falls between powers of two: walked to
