"""The second point of a group's step-time line, timed in the same launch at half the micro-batch: where neither
micro-batch accumulates (no fixed global batch) as whole steps at the half, the point as the job would run it, with
no plain micro-steps at the trial's own micro-batch; otherwise from the parts, a plain micro-step at each and the
optimizer's share. Real CPU trials of both: tests/test_trial_two_points.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.fakes.machines import GIB, LinearMachine, LinearMemory
from tests.fakes.searches import mode_search
from tests.fakes.simulator import simulated_machine

from autotune.core.ladder import Candidate, Rung
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.search.records import TrialRecord
from autotune.trial.trial_types import TrialResult

CANDIDATE = Candidate(Rung.Z3, 8, False)


def test_the_spec_says_whether_the_global_batch_is_fixed() -> None:
    free = TuneContext.build(TuneRequest.of(model="gpt2", gpus=1, gpu_type="a100-80gb", seq_len=128), outputs=False)
    fixed = TuneContext.build(
        TuneRequest.of(model="gpt2", gpus=1, gpu_type="a100-80gb", seq_len=128, global_batch=64), outputs=False
    )
    assert free.spec(CANDIDATE).fixed_global_batch is False
    assert fixed.spec(CANDIDATE).fixed_global_batch is True
    assert free.spec(CANDIDATE).smaller_micro_batch == 4


def _record(result: TrialResult) -> TrialRecord:
    return TrialRecord(CANDIDATE, result, 0, 16 * GIB)


def _points(global_batch: int | None, result: TrialResult) -> tuple[tuple[int, float], ...]:
    search = mode_search(LinearMachine(memory_bytes=16 * GIB), LinearMemory(), {}, [Rung.Z3])
    search.global_batch = global_batch  # read when the state is first built
    state = search.state
    state.outcome.trials.append(_record(result))
    (group,) = state.measured_groups()
    return group.points


def test_a_whole_step_at_the_half_is_the_point_as_measured() -> None:
    # one rank, micro-batch 8 in 2.0 s a step; four samples in 1.2 s a whole step
    result = TrialResult(status="ok", samples_per_s=4.0, step_times_s=[2.0] * 5, smaller_micro_batch=4)
    assert _points(None, replace(result, smaller_step_s=1.2)) == ((8, 2.0), (4, 1.2))


@pytest.mark.parametrize(("global_batch", "expected"), [(None, 1.3), (8, 1.15)])
def test_the_parts_share_the_optimizer_step_out_over_the_half_s_accumulation(
    global_batch: int | None, expected: float
) -> None:
    """Plain micro-step 1.0 s at the half, 0.3 s of optimizer step: all of it where the half does not accumulate,
    half of it where a fixed global batch of 8 makes the half accumulate two micro-steps."""
    result = TrialResult(
        status="ok",
        samples_per_s=4.0,
        step_times_s=[2.0] * 5,
        micro_step_s=1.7,
        optimizer_step_s=0.3,
        smaller_micro_batch=4,
        smaller_micro_step_s=1.0,
    )
    assert _points(global_batch, result)[1] == pytest.approx((4, expected))


def test_the_simulator_times_whole_steps_at_the_half_without_a_fixed_global_batch() -> None:
    machine = simulated_machine("multi-node-infiniband")
    assert machine.global_batch is None
    candidate = Candidate(Rung.Z3, 10, True)
    half = Candidate(Rung.Z3, 5, True)
    result = machine.result(candidate)
    assert result.smaller_step_s == pytest.approx(machine.cycle_seconds(half))
    assert result.micro_step_s is None and result.smaller_micro_step_s is None
    parts = machine.steps_breakdown(candidate)["parts"]
    assert parts == pytest.approx(3 * machine.cycle_seconds(half))  # no plain micro-steps at 10
    assert machine.steps_breakdown(candidate, confirmation=True)["parts"] == 0.0


def test_the_simulator_builds_the_point_from_parts_with_a_fixed_global_batch() -> None:
    machine = simulated_machine("boundary-between-powers-fixed-batch")
    assert machine.global_batch is not None
    candidate = Candidate(Rung.Z2, 2, False)
    result = machine.result(candidate)
    assert result.smaller_step_s is None
    assert result.smaller_micro_step_s is not None and result.optimizer_step_s is not None
