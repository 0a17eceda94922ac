"""A trial over the search's limit after its warm-up stops there (TrialSpec.stop_over_bytes): its speed would never
be used, so it times nothing, reports over_budget with the warm-up's peak, and leaves a warm worker healthy.

Real DeepSpeed trials on the CPU backend: there the peak is host RSS (on GPUs the device's), and the limit is set
here by hand (the tuner sets it on GPUs only: the CPU backend's budget watch stops its trials as they pass theirs).
"""

from __future__ import annotations

import pytest
from tests.fakes.trials import (
    assert_measured,
    cpu_ops_built,  # noqa: F401 (an autouse fixture: every trial here needs the ops)
    marked_env,
    survivors,
    tiny_spec,
)

from autotune.core.ladder import Rung
from autotune.trial import LocalLauncher, WarmWorkerPool, run_trial

LOW = 1 << 20  # 1 MiB: every trial's peak is over it after its warm-up
HIGH = 1 << 40  # 1 TiB: none is


def _stopped(result, limit: int) -> None:
    assert result.status == "over_budget", result.error
    assert "stopped before timing" in (result.error or "") and "1.0 MiB" in (result.error or "")
    assert not result.step_times_s and result.samples_per_s is None
    assert result.peak_memory_bytes and result.peak_memory_bytes > limit  # the warm-up's own peak, reported
    assert "warmup" in result.phases and "measured" not in result.phases


def test_a_cold_trial_over_the_limit_after_warm_up_times_nothing() -> None:
    mark, env = marked_env()
    result = run_trial(tiny_spec(stop_over_bytes=LOW), LocalLauncher(env=env))
    _stopped(result, LOW)
    assert not survivors(mark)


def test_a_warm_worker_that_stopped_over_the_limit_runs_the_next_trial() -> None:
    mark, env = marked_env()
    with WarmWorkerPool(env=env) as pool:
        over = run_trial(tiny_spec(stop_over_bytes=LOW), pool)
        under = run_trial(tiny_spec(stop_over_bytes=HIGH), pool)
        assert pool.restarts == 1  # the same workers: stopping over the limit is not a failure
    _stopped(over, LOW)
    assert_measured(under)
    assert not survivors(mark)


@pytest.mark.slow
def test_every_rank_stops_together() -> None:
    """The worst rank's peak decides for all (an all-reduce): no rank waits in a collective for one that stopped."""
    mark, env = marked_env()
    result = run_trial(tiny_spec(Rung.Z2, nprocs=2, stop_over_bytes=LOW), LocalLauncher(env=env))
    _stopped(result, LOW)
    assert len(result.ranks) == 2
    assert not survivors(mark)
