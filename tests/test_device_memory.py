"""The tuner's GPU memory figures without a GPU: a fake NVML (the card as the driver shows it, with another
tenant on it) and a fake torch.cuda allocator (reserved grows and shrinks as a step runs), from tests/fakes/devices.py.

The fakes hold only what the driver and the allocator would report; what the tracker makes of it is checked.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from tests.fakes.devices import (
    CARD_TOTAL,
    CONTEXT,
    CUDA_TOTAL,
    DRIVER_RESERVED,
    OTHER_TENANT,
    FakeAllocator,
    FakeCard,
    FakeNvml,
)

from autotune.core.units import GiB, MiB
from autotune.trial.trial_types import RankMetrics, TrialResult
from autotune.trial.worker.memory import MemoryTracker, PeakSampler, allocator_fraction


def _tracker(card: FakeCard) -> tuple[MemoryTracker, FakeAllocator]:
    tracker = MemoryTracker("cuda", 0, nvml=FakeNvml(card), allocator=None)  # baseline: before our context
    allocator = FakeAllocator(card)
    tracker._allocator = allocator
    return tracker, allocator


@pytest.mark.parametrize("per_process_visible", [True, False])
def test_another_tenants_10_gib_are_not_counted_in_our_peak(
    monkeypatch: pytest.MonkeyPatch, per_process_visible: bool
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    card = FakeCard(per_process_visible=per_process_visible)
    tracker, allocator = _tracker(card)
    tracker.reset()
    allocator.reserve(6 * GiB)
    tracker.sample()
    metrics = tracker.metrics(0)
    assert metrics.device_used_bytes == CONTEXT + 6 * GiB  # neither the other tenant nor the driver's share
    assert metrics.device_used_baseline_bytes == DRIVER_RESERVED + OTHER_TENANT
    assert metrics.device_memory_source == ("nvml_process" if per_process_visible else "nvml_used_minus_baseline")
    assert metrics.device_outside_allocator_bytes == CONTEXT
    assert TrialResult("ok", ranks=[metrics]).peak_memory_bytes == CONTEXT + 6 * GiB


def test_a_peak_inside_a_step_is_caught_though_every_step_end_is_low(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    card = FakeCard()
    tracker, allocator = _tracker(card)
    tracker.reset()
    allocator.reserve(2 * GiB)
    tracker.sample()
    allocator.reserve(9 * GiB)  # the step's transient peak: freed (empty_cache on retry) before the step ends
    allocator.release(9 * GiB)
    tracker.sample()
    metrics = tracker.metrics(0)
    assert metrics.device_used_bytes == CONTEXT + 11 * GiB  # max_reserved + outside, not the step ends' 2.5 GiB


def test_the_sampler_thread_keeps_the_highest_reading() -> None:
    readings = iter([1, 5, 3] + [2] * 10_000)
    sampler = PeakSampler(lambda: next(readings, 2), period_s=0.0005)
    sampler.start()
    deadline = time.monotonic() + 5
    while sampler.peak != 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    sampler.stop()
    assert sampler.peak == 5


def test_an_emulated_card_caps_the_whole_process_not_only_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    card = FakeCard()
    tracker, allocator = _tracker(card)
    tracker.reset()
    fraction = 24 * GiB / CARD_TOTAL
    tracker.limit_device(fraction)
    card_bytes = int(fraction * CARD_TOTAL)
    assert tracker.metrics(0).emulated_card_bytes == card_bytes
    # what the allocator may hold: the card less the context, as a share of CUDA's total (torch's base)
    assert allocator.fraction * CUDA_TOTAL == pytest.approx(card_bytes - CONTEXT, abs=1)
    allocator.outside += 300 * MiB  # NCCL's buffers arrive with the first collective
    allocator.reserve(GiB)
    tracker.sample()
    assert allocator.fraction * CUDA_TOTAL == pytest.approx(card_bytes - CONTEXT - 300 * MiB, abs=1)
    with pytest.raises(RuntimeError, match="out of memory"):
        allocator.reserve(card_bytes - CONTEXT - 300 * MiB)  # would put the process past 24 GiB
    tracker.limit_device(None)
    assert allocator.fraction == 1.0


def test_allocator_fraction_is_of_cuda_total_and_never_negative() -> None:
    assert allocator_fraction(24 * GiB, GiB, 46 * GiB) == pytest.approx(0.5)
    assert allocator_fraction(GiB, 2 * GiB, 80 * GiB) == 0.0
    assert allocator_fraction(100 * GiB, 0, 80 * GiB) == 1.0


def test_cpu_tracker_reports_host_rss_only() -> None:
    metrics = MemoryTracker("cpu", 0).metrics(0)
    assert metrics.host_rss_peak_bytes and metrics.device_used_bytes is None
    assert RankMetrics(**metrics.__dict__) == metrics


def test_each_phase_measures_its_own_peak_and_the_trials_peak_carries_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain micro-steps at two micro-batches each get their own peak, from where memory stands when they start;
    resetting the allocator's counters for them must not lose the optimizer step's higher peak before them."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    tracker, allocator = _tracker(FakeCard())
    tracker.reset()
    allocator.reserve(4 * GiB)  # model states
    allocator.reserve(3 * GiB)  # an optimizer step's temporaries: the trial's peak
    allocator.release(3 * GiB)
    with tracker.phase("micro"):
        allocator.reserve(2 * GiB)  # activations of the trial's micro-batch
        allocator.release(2 * GiB)
    with tracker.phase("smaller_micro"):
        allocator.reserve(1 * GiB)  # half of them
        allocator.release(1 * GiB)
    metrics = tracker.metrics(0)
    assert (metrics.micro_peak_bytes, metrics.smaller_micro_peak_bytes) == (6 * GiB, 5 * GiB)
    assert metrics.max_allocated_bytes == metrics.max_reserved_bytes == 7 * GiB  # the optimizer step's, kept
    tracker.reset()  # a warm worker's next trial starts without the last one's phases or carried peaks
    assert tracker.metrics(0).micro_peak_bytes is None and tracker.metrics(0).max_allocated_bytes == 4 * GiB


def _ranked(peak: int, micro: int | None, smaller: int | None) -> RankMetrics:
    return RankMetrics(rank=0, device_used_bytes=peak, micro_peak_bytes=micro, smaller_micro_peak_bytes=smaller)


def test_one_launch_implies_the_peak_at_its_smaller_micro_batch() -> None:
    result = TrialResult("ok", ranks=[_ranked(10 * GiB, 9 * GiB, 7 * GiB)], smaller_micro_batch=4)
    assert result.smaller_peak_point == (4, 8 * GiB)  # the trial's peak less what the micro-batch added
    two_ranks = [_ranked(10 * GiB, 9 * GiB, 7 * GiB), dataclasses.replace(_ranked(9 * GiB, 9 * GiB, 6 * GiB), rank=1)]
    assert TrialResult("ok", ranks=two_ranks, smaller_micro_batch=4).smaller_peak_point == (4, 7 * GiB)  # steepest
    for unknown in (
        TrialResult("ok", ranks=[_ranked(10 * GiB, None, None)], smaller_micro_batch=4),  # not measured apart
        TrialResult("ok", ranks=[_ranked(10 * GiB, 9 * GiB, 9 * GiB)], smaller_micro_batch=4),  # no difference
        TrialResult("ok", ranks=[_ranked(10 * GiB, 9 * GiB, 7 * GiB)], smaller_micro_batch=None),
        TrialResult("oom_gpu", ranks=[_ranked(10 * GiB, 9 * GiB, 7 * GiB)], smaller_micro_batch=4),
    ):
        assert unknown.smaller_peak_point is None
