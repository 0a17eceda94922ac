"""Two points per launch, and trials that time whole accumulation cycles as one optimizer step
(real DeepSpeed on the CPU backend)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.trial import LocalLauncher, TrialSpec, WarmWorkerPool, run_trial
from autotune.trial.launch.ops import prebuild_ops
from autotune.trial.launch.warm import WARM_GROWTH_LIMIT_BYTES

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}


@pytest.fixture(scope="module", autouse=True)
def cpu_ops_built() -> None:
    prebuild_ops("cpu")


@pytest.mark.slow  # about 80 s per stage on the shared 2-core machine
@pytest.mark.parametrize("rung", [Rung.Z0, Rung.Z2, Rung.Z3])
def test_one_launch_times_two_micro_batches_and_splits_the_optimizer_step(rung: Rung) -> None:
    settings = TrainSettings(world_size=1, precision="bf16", global_batch=16, hidden_size=64)
    spec = TrialSpec(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(rung, micro_batch=4), settings),
        seq_len=64,
        device="cpu",
        warmup_steps=1,
        max_steps=4,
        timeout_s=600.0,
        smaller_micro_batch=2,
    )
    result = run_trial(spec, LocalLauncher(env={"OMP_NUM_THREADS": "1"}))
    assert result.status == "ok", result.error
    assert result.accumulation == 4
    assert result.smaller_micro_batch == 2 and result.smaller_micro_step_s and result.smaller_micro_step_s > 0
    assert result.micro_step_s and result.micro_step_s > 0 and result.optimizer_step_s is not None
    # a whole cycle is timed as one step: 4 micro-steps cost 4 x one, plus the optimizer; a cycle timed as one
    # micro-step would be ~1 x. The median cycle against 2 x keeps that distinction with room for the shared
    # machine's noise (one cycle once measured 2.95 x the median micro-step under CI's load).
    cycles = sorted(result.step_times_s)
    assert cycles[len(cycles) // 2] > 2 * result.micro_step_s
    assert result.samples_per_s == pytest.approx(
        16 / sorted(result.step_times_s)[len(result.step_times_s) // 2], rel=0.3
    )


def _group_spec(micro_batch: int) -> TrialSpec:
    """ZeRO-2 without checkpointing at `micro_batch`, sequence 256: the logits alone grow by 1 MiB a sample."""
    settings = TrainSettings(world_size=1, precision="bf16", hidden_size=64)
    return TrialSpec(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(Rung.Z2, micro_batch=micro_batch), settings),
        seq_len=256,
        device="cpu",
        warmup_steps=1,
        max_steps=3,
        timeout_s=600.0,
    )


@pytest.mark.slow  # about 60-90 s on the shared 2-core machine (one warm launch of two points, one cold trial)
def test_one_warm_launch_measures_two_micro_batches_of_a_group_each_with_its_own_peak() -> None:
    """Two points of one (rung, checkpointing) in one process: the warm worker builds a fresh model and engine per
    point and resets the RSS high-water mark between them (/proc/self/clear_refs, trial/worker/memory.py). The larger
    micro-batch goes first, so a peak that was not reset would show up as the smaller one's: it must not; and the
    smaller one's warm peak must be what a fresh process measures, within the growth the pool tolerates."""
    env = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}  # the tuner's CPU pool environment
    with WarmWorkerPool(env=env) as pool:
        large, small = run_trial(_group_spec(32), pool), run_trial(_group_spec(4), pool)
        assert pool.restarts == 1  # one launch, two points
    cold_small = run_trial(_group_spec(4), LocalLauncher(env=env))
    for result in (large, small, cold_small):
        assert result.status == "ok", result.error
    # the workers' first trial starts from a fresh process's state, as a fresh launch's does; their second does not
    assert large.first_in_process and not small.first_in_process and cold_small.first_in_process
    large_peak, small_peak, cold_peak = (r.peak_memory_bytes or 0 for r in (large, small, cold_small))
    assert small_peak < large_peak - 16 * 2**20  # 28 samples x 1 MiB of logits and more: the reset took
    assert abs(small_peak - cold_peak) <= WARM_GROWTH_LIMIT_BYTES


@pytest.mark.slow  # about 40-60 s per case on the shared 2-core machine (two fresh trials)
@pytest.mark.parametrize("whole_steps", [False, True], ids=["plain-parts", "whole-steps"])
def test_one_launch_implies_the_peak_its_half_micro_batch_measures_on_its_own(whole_steps: bool) -> None:
    """A trial at micro-batch 32 measures the forward/backward at 32 and 16 each from its own start: the peak it
    implies at 16 is what a trial at 16 measures, so the search's line for the group stands after one trial. With a
    fixed global batch (or one warm-up step) from plain micro-steps at both; without, and with two warm-up steps, from
    whole steps at 16 against a warm-up step's forward/backward at 32, the half's time then a whole step's."""
    env = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}  # the tuner's CPU environment
    spec = dataclasses.replace(_group_spec(32), smaller_micro_batch=16, warmup_steps=2 if whole_steps else 1)
    large = run_trial(dataclasses.replace(spec, fixed_global_batch=not whole_steps), LocalLauncher(env=env))
    half = run_trial(_group_spec(16), LocalLauncher(env=env))
    assert large.status == half.status == "ok", (large.error, half.error)
    if whole_steps:
        assert large.micro_step_s is None and large.smaller_micro_step_s is None
        assert large.smaller_step_s and large.smaller_step_s > 0
    else:
        assert large.smaller_step_s is None and large.smaller_micro_step_s and large.micro_step_s
    implied = large.smaller_peak_point
    assert implied is not None and implied[0] == 16
    large_peak, half_peak = large.peak_memory_bytes or 0, half.peak_memory_bytes or 0
    assert half_peak < large_peak - 8 * 2**20  # 16 samples x 1 MiB of logits and more: a slope to find
    # within a tenth of what the 16 extra samples add: the line's error, not the model's
    assert abs(implied[1] - half_peak) <= (large_peak - half_peak) / 10, (implied[1], half_peak, large_peak)
