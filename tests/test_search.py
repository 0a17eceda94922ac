"""The search against a simulated machine: same best config as exhaustive search, with fewer trials.

The simulated GPU's true memory is the memory model distorted (activations 30% heavier, a fixed
overhead the model does not know), so the search must learn from its trials; its speed follows the
ladder's order with a per-step fixed cost, so larger micro-batches help.
"""

from dataclasses import replace

import pytest

from autotune.estimate import estimate
from autotune.estimate.types import Calibration, EstimateSettings
from autotune.hardware import Target, generic_gpu
from autotune.ladder import Candidate, Rung
from autotune.models import resolve_model, summarize
from autotune.search import Search, SearchLimits
from autotune.speed import PRIOR_CHECKPOINTING_SPEED, PRIOR_RUNG_SPEED
from autotune.stop import StopReason
from autotune.trial.types import RankMetrics, TrialResult

GIB = 2**30
TRUTH = Calibration(activation_scale=1.3, overhead_bytes=300 * 2**20)
GRID = [1, 2, 4, 8, 16, 32, 64]
RUNGS = [Rung.Z0, Rung.Z1, Rung.Z2, Rung.Z2_OFFLOAD_OPT, Rung.Z3, Rung.Z3_OFFLOAD_OPT, Rung.Z3_OFFLOAD_ALL]


class SimulatedMachine:
    def __init__(
        self, model, target: Target, settings: EstimateSettings, headroom: float, fixed_s: float = 0.2
    ) -> None:
        self.model, self.target, self.settings, self.fixed_s = model, target, settings, fixed_s
        self.limit = int(headroom * target.free_memory_bytes)
        self.launched: list[Candidate] = []

    def true_peak(self, candidate: Candidate) -> int:
        return estimate(self.model, self.target, candidate, self.settings, TRUTH).gpu_peak_bytes

    def step_seconds(self, candidate: Candidate) -> float:
        per_sample = 0.05 / PRIOR_RUNG_SPEED[candidate.rung.value]
        if candidate.grad_checkpointing:
            per_sample /= PRIOR_CHECKPOINTING_SPEED
        return self.fixed_s + per_sample * candidate.micro_batch

    def result(self, candidate: Candidate) -> TrialResult:
        peak = self.true_peak(candidate)
        if peak > self.target.free_memory_bytes:
            return TrialResult(status="oom_gpu", error="torch.OutOfMemoryError: CUDA out of memory")
        step = self.step_seconds(candidate)
        samples = candidate.micro_batch * self.target.world_size / step
        return TrialResult(
            status="ok", ranks=[RankMetrics(0, device_used_bytes=peak)], step_times_s=[step] * 3, samples_per_s=samples
        )

    def run(self, candidate: Candidate) -> tuple[TrialResult, bool]:
        self.launched.append(candidate)
        return self.result(candidate), False

    def exhaustive_best(self) -> Candidate | None:
        fitting = [
            Candidate(rung, mb, ckpt)
            for rung in RUNGS
            for ckpt in (False, True)
            for mb in GRID
            if self.result(Candidate(rung, mb, ckpt)).ok and self.true_peak(Candidate(rung, mb, ckpt)) <= self.limit
        ]
        return max(fitting, key=lambda c: self.result(c).samples_per_s or 0.0, default=None)


def _setup(model_name: str, memory_gib: float, gpus: int, seq_len: int):
    model = summarize(resolve_model(model_name))
    memory = int(memory_gib * GIB)
    target = Target(generic_gpu(memory), gpus, 1, memory, host_ram_bytes=512 * GIB, measured=True)
    settings = EstimateSettings(seq_len=seq_len, precision="bf16")
    return model, target, settings


@pytest.mark.parametrize(
    ("model_name", "memory_gib", "gpus", "seq_len"),
    [
        ("gpt2", 80, 1, 1024),
        ("gpt2-medium", 16, 4, 1024),
        ("gpt2-large", 24, 8, 1024),
        ("gpt2-xl", 24, 8, 1024),
        ("opt-1.3b", 12, 4, 512),
        ("t5-large", 24, 2, 512),
    ],
)
def test_search_matches_exhaustive_with_fewer_trials(model_name, memory_gib, gpus, seq_len) -> None:
    model, target, settings = _setup(model_name, memory_gib, gpus, seq_len)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    expected = machine.exhaustive_best()
    outcome = Search(model, target, settings, machine.run, RUNGS, GRID, SearchLimits(max_trials=40)).run_search()
    assert outcome.best is not None and expected is not None
    assert outcome.best.candidate == expected, [t.candidate.key for t in outcome.trials]
    exhaustive_trials = len(RUNGS) * 2 * len(GRID)
    assert len(machine.launched) < exhaustive_trials / 4
    assert outcome.calibration.samples >= 1  # it learned from what it measured


@pytest.mark.parametrize(("model_name", "memory_gib"), [("gpt2-large", 80), ("opt-1.3b", 40), ("t5-large", 80)])
def test_typical_model_needs_few_trials(model_name, memory_gib) -> None:
    """Compute-bound steps (fixed cost ~5% of a micro-batch-8 step): a small fraction of the grid is tried."""
    model, target, settings = _setup(model_name, memory_gib, 8, 1024 if model_name != "t5-large" else 512)
    machine = SimulatedMachine(model, target, settings, headroom=0.9, fixed_s=0.02)
    outcome = Search(model, target, settings, machine.run, RUNGS, GRID).run_search()
    assert outcome.best is not None and outcome.best.candidate == machine.exhaustive_best()
    exhaustive_trials = len(RUNGS) * 2 * len(GRID)
    assert len(machine.launched) <= exhaustive_trials / 8, [c.key for c in machine.launched]


def test_rungs_ruled_out_by_the_model_are_skipped_with_a_reason() -> None:
    model, target, settings = _setup("llama-2-7b", 24, 8, 2048)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    outcome = Search(model, target, settings, machine.run, RUNGS, GRID).run_search()
    ruled_out = {(s.rung, s.grad_checkpointing) for s in outcome.skipped if "ruled out by the memory model" in s.reason}
    assert {(Rung.Z0, False), (Rung.Z1, False)} <= ruled_out
    assert all((t.candidate.rung, t.candidate.grad_checkpointing) not in ruled_out for t in outcome.trials)


def test_budget_stops_the_search_and_says_why() -> None:
    model, target, settings = _setup("gpt2-xl", 24, 8, 1024)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    outcome = Search(model, target, settings, machine.run, RUNGS, GRID, SearchLimits(max_trials=1)).run_search()
    assert len(machine.launched) == 1 and outcome.stop_reason is StopReason.TRIAL_BUDGET


def test_nothing_fits() -> None:
    model, target, settings = _setup("llama-2-70b", 16, 1, 4096)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    outcome = Search(model, target, settings, machine.run, RUNGS[:5], GRID).run_search()
    assert outcome.best is None and not machine.launched
    assert len(outcome.skipped) == 10


def test_failed_trials_are_not_mistaken_for_memory_limits() -> None:
    model, target, settings = _setup("gpt2", 80, 1, 1024)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)

    def broken_z0(candidate: Candidate):
        if candidate.rung is Rung.Z0:
            return TrialResult(status="error", error="RuntimeError: boom"), False
        return machine.run(candidate)

    outcome = Search(model, target, settings, broken_z0, RUNGS, GRID).run_search()
    assert any(s.rung is Rung.Z0 and "boom" in s.reason for s in outcome.skipped)
    assert outcome.best is not None and outcome.best.candidate.rung is not Rung.Z0
    assert replace(outcome.best.candidate, rung=Rung.Z0) != outcome.best.candidate


@pytest.mark.parametrize(
    ("model_name", "memory_gib", "gpus", "seq_len"), [("gpt2-large", 24, 8, 1024), ("opt-1.3b", 12, 4, 512)]
)
def test_integer_grid_ends_on_the_integer_boundary_a_trial_confirmed(model_name, memory_gib, gpus, seq_len) -> None:
    """Every integer micro-batch eligible: the pick is the exhaustive integer best, the next micro-batch up in its
    group is a trial that did not fit, and no more trials ran than the powers-of-two search was allowed."""
    model, target, settings = _setup(model_name, memory_gib, gpus, seq_len)
    machine = SimulatedMachine(model, target, settings, headroom=0.9)
    grid = list(range(1, 129))
    fitting = [
        Candidate(rung, mb, ckpt)
        for rung in RUNGS
        for ckpt in (False, True)
        for mb in grid
        if machine.result(Candidate(rung, mb, ckpt)).ok
        and machine.true_peak(Candidate(rung, mb, ckpt)) <= machine.limit
    ]
    expected = max(fitting, key=lambda c: machine.result(c).samples_per_s or 0.0)
    assert expected.micro_batch & (expected.micro_batch - 1) != 0  # the case this test is about
    outcome = Search(model, target, settings, machine.run, RUNGS, grid, SearchLimits(max_trials=40)).run_search()
    assert outcome.best is not None and outcome.best.candidate == expected, [c.key for c in machine.launched]
    above = replace(expected, micro_batch=expected.micro_batch + 1)
    assert any(t.candidate == above and not t.within_headroom for t in outcome.trials)
    # no more than the old budget: a quarter of the powers-of-two grid (1..128) over every rung and checkpointing
    assert len(machine.launched) <= len(RUNGS) * 2 * 8 / 4, [c.key for c in machine.launched]


class HalfBatchPeaksMachine(SimulatedMachine):
    """Its trials also measure their half micro-batch's plain micro-steps in the same launch, each with its own
    peak, as the real worker does (trial/training.py timed_steps); this machine's peak lies in those steps."""

    def result(self, candidate: Candidate) -> TrialResult:
        result = super().result(candidate)
        if not result.ok or candidate.micro_batch < 2:
            return result
        smaller = candidate.micro_batch // 2
        rank = replace(
            result.ranks[0],
            micro_peak_bytes=self.true_peak(candidate),
            smaller_micro_peak_bytes=self.true_peak(replace(candidate, micro_batch=smaller)),
        )
        return replace(result, ranks=[rank], smaller_micro_batch=smaller)


def test_a_trial_that_measures_its_half_micro_batch_saves_boundary_trials() -> None:
    """Two points of a group's memory line from its first trial: the same picks on an integer grid, fewer launches."""
    setups = [("gpt2-medium", 16, 4, 1024), ("opt-1.3b", 12, 4, 512), ("gpt2-large", 24, 8, 1024)]
    runs = {}
    for machine_type in (SimulatedMachine, HalfBatchPeaksMachine):
        picks, launched = [], 0
        for setup in setups:
            model, target, settings = _setup(*setup)
            machine = machine_type(model, target, settings, headroom=0.9)
            search = Search(model, target, settings, machine.run, RUNGS, list(range(1, 65)), SearchLimits(80))
            outcome = search.run_search()
            picks.append(outcome.best.candidate if outcome.best else None)
            launched += len(machine.launched)
        runs[machine_type] = picks, launched
    (plain_picks, plain_launched), (half_picks, half_launched) = runs[SimulatedMachine], runs[HalfBatchPeaksMachine]
    assert half_picks == plain_picks and None not in half_picks
    assert half_launched < plain_launched, (half_launched, plain_launched)
