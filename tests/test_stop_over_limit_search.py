"""What the tuner makes of a GPU trial that stopped over the search's limit after its warm-up (over_budget with the
warm-up's peak: tests/test_trial_stop_over_limit.py runs real ones): the spec asks it on GPUs only; the search takes
its peak as measured (the walk's memory line, "cannot fit" for whatever needs at least its memory); the cache keeps
it only for runs whose limit it is over; the progress line and the report call it over headroom; the simulator
charges its warm-up alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.fakes.machines import GIB, LinearMachine, LinearMemory
from tests.fakes.searches import mode_search
from tests.fakes.simulator import simulated_machine

from autotune.core.ladder import Candidate, Rung
from autotune.report.pick import trial_status
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.search.cache import ResultsCache
from autotune.search.records import TrialRecord
from autotune.trial.plausible import Bounds
from autotune.trial.trial_types import RankMetrics, TrialResult
from autotune.tuning.trials import believed_trials

STOPPED = TrialResult(
    status="over_budget",
    error="peak 14.0 GiB after 2 warm-up steps, over the search's limit of 12.0 GiB: stopped before timing",
    ranks=[RankMetrics(rank=0, device_used_bytes=14 * GIB)],
)


def test_the_spec_asks_gpu_trials_to_stop_over_the_search_s_limit() -> None:
    gpu = TuneContext.build(TuneRequest.of(model="gpt2", gpus=1, gpu_type="a100-80gb", seq_len=128), outputs=False)
    assert gpu.spec(Candidate(Rung.Z0, 2)).stop_over_bytes == gpu.limit_bytes
    assert gpu.confirmation_spec(Candidate(Rung.Z0, 2)).stop_over_bytes == gpu.limit_bytes
    cpu = TuneContext.build(TuneRequest.of(model="tiny-gpt2", device="cpu", memory_budget="2GiB"), outputs=False)
    assert cpu.spec(Candidate(Rung.Z0, 2)).stop_over_bytes is None  # the CPU backend's budget watch does it


def _gpu_state():
    state = mode_search(LinearMachine(memory_bytes=16 * GIB), LinearMemory(), {}, [Rung.Z3]).state
    assert state.settings.device != "cpu"
    return state


def test_the_search_takes_the_stopped_trial_s_peak_as_measured() -> None:
    state = _gpu_state()
    stopped = Candidate(Rung.Z3, 8, False)
    state.outcome.trials.append(TrialRecord(stopped, STOPPED, 0, state.limit_bytes))
    assert state.measured_true_peak(STOPPED) and state.modelled_memory_failed(STOPPED)
    assert state.measured_over(Candidate(Rung.Z3, 9, False)) == stopped  # needs at least its memory: cannot fit
    assert state.measured_over(Candidate(Rung.Z3, 4, False)) is None
    ran = TrialResult(status="ok", samples_per_s=1.0, ranks=[RankMetrics(rank=0, device_used_bytes=10 * GIB)])
    state.outcome.trials.append(TrialRecord(Candidate(Rung.Z3, 4, False), ran, 0, state.limit_bytes))
    line = state.peak_line(Candidate(Rung.Z3, 6, False))
    assert line is not None and line.seconds(8) == 14 * GIB  # the stopped trial is a point of the memory line


def test_a_cpu_trial_over_budget_reports_a_cap_not_its_peak() -> None:
    state = _gpu_state()
    state.settings = replace(state.settings, device="cpu")
    assert not state.measured_true_peak(STOPPED)


def test_the_cache_keeps_a_stopped_trial_only_where_it_is_over_the_limit(tmp_path: Path) -> None:
    cache = ResultsCache(tmp_path / "results.sqlite")
    candidate = Candidate(Rung.Z3, 8, False)
    cache.put_trial("k", candidate, STOPPED)
    bounds = Bounds.for_run(124_000_000, 1, "cuda", 312.0)
    assert believed_trials(cache, "k", bounds, limit_bytes=12 * GIB) == {candidate: STOPPED}
    # a run whose limit (same key: its bucket) lets 14 GiB fit: the trial says nothing there, so it runs again
    assert believed_trials(cache, "k", bounds, limit_bytes=15 * GIB) == {}
    assert cache.trials("k") == {}


def test_it_reads_as_over_headroom() -> None:
    assert trial_status(STOPPED, within_headroom=False) == "over headroom"
    ran = TrialResult(status="ok", samples_per_s=1.0)
    assert trial_status(ran, within_headroom=False) == "over headroom"
    assert trial_status(ran, within_headroom=True) == "ok"
    assert trial_status(TrialResult(status="oom_gpu"), within_headroom=False) == "oom_gpu"


def test_the_simulator_charges_a_stopped_trial_its_warm_up() -> None:
    machine = simulated_machine("multi-node-infiniband")
    over, under = Candidate(Rung.Z3, 12, True), Candidate(Rung.Z3, 11, True)
    assert machine.stops_over(over) and not machine.stops_over(under)
    assert machine.steps_seconds(over) == machine.steps_breakdown(over)["warmup"] > 0
    assert machine.steps_seconds(under) == sum(machine.steps_breakdown(under).values())
    result, _ = machine.run(over)
    assert result.status == "over_budget" and result.peak_memory_bytes == machine.gpu_bytes(over)
    assert machine.result(over).ok  # the truth the exhaustive reference and DeepSpeed Autotuning see
