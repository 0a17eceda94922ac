"""Whether a measured figure is one the hardware could have produced: a speed above the machine's peak FLOP/s for
this model, or a memory peak below the model's own weights, is corrupt (a forged cache row, a broken timer), not
a measurement.

Both bounds are floors of the work and memory any training step needs, set generously so that no real trial is
refused:
- Compute: a training step runs at least the forward pass, 2 FLOPs per parameter per token (one multiply-add per
  weight; Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1: C_forward ~ 2N). Backward,
  attention and recomputation only add to it. So tokens/s x 2N cannot exceed the machine's peak FLOP/s.
- Peak FLOP/s: a GPU's dense 16-bit peak from its spec sheet (profiles/hardware), doubled for FP8/sparsity
  headroom; an unknown GPU gets the largest peak we know of, doubled. A CPU: every logical core at its highest
  clock (psutil; 6 GHz when unknown) times 2048 FLOP/cycle, twice Intel AMX's 1024 BF16 FLOP/cycle per core (Intel
  64 and IA-32 Architectures Optimization Reference Manual, AMX chapter), above any AVX-512 rate (2 FMA units x 16
  fp32 lanes x 2 = 64 FLOP/cycle).
- Memory: a rank holds at least its share of the weights in 16-bit (2 bytes per parameter, the narrowest training
  precision here), the whole model unless ZeRO-3 partitions it. Where parameters may live elsewhere (parameter
  offload to CPU or NVMe, a mode with partial offload) the device peak has no such floor and is not checked;
  on the CPU backend the peak is host RSS, which holds the CPU-offloaded weights too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from autotune.core.choices import Device
from autotune.core.ladder import Candidate, Mode
from autotune.core.units import format_bytes
from autotune.trial.trial_types import TrialResult

FORWARD_FLOPS_PER_PARAM_TOKEN = 2  # Kaplan et al. 2020, sec. 2.1
MIN_BYTES_PER_PARAM = 2  # 16-bit weights
GPU_PEAK_HEADROOM = 2.0  # FP8 / structured sparsity peaks are twice the dense 16-bit ones on the same card
CPU_FLOPS_PER_CYCLE = 2048  # twice AMX-BF16's 1024 FLOP/cycle/core (see above)
CPU_UNKNOWN_CLOCK_HZ = 6.0e9  # above any shipping server CPU's boost clock


def cpu_peak_flops() -> float:
    """Every logical core at its highest clock, at twice AMX's BF16 rate: a bound, not an estimate."""
    import psutil

    cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    frequency = psutil.cpu_freq() if hasattr(psutil, "cpu_freq") else None
    clock_hz = max(frequency.max, frequency.current) * 1e6 if frequency and frequency.max else CPU_UNKNOWN_CLOCK_HZ
    return cores * clock_hz * CPU_FLOPS_PER_CYCLE


def gpu_peak_flops(peak_tflops: float | None) -> float:
    """The card's dense peak, else the largest in the catalog, with FP8/sparsity headroom."""
    if not peak_tflops:
        from autotune.hardware.specs import gpu_types

        peaks = [max(g.peak_bf16_tflops or 0.0, g.peak_fp16_tflops or 0.0) for g in gpu_types()]
        peak_tflops = max(peaks, default=0.0) or 10_000.0
    return peak_tflops * 1e12 * GPU_PEAK_HEADROOM


@dataclass(frozen=True)
class Bounds:
    """What the hardware and the model allow one tuning run's trials to measure."""

    params: int  # the model's parameters (all of them: frozen weights are still computed through)
    world_size: int
    machine_peak_flops: float  # all ranks together
    device: Device  # "cpu": peaks are host RSS (hold offloaded weights too); else device memory
    # the fewest tokens a sample of this run holds (its sequence length; 1 where the user's own command decides),
    # so that a row with a speed in samples/s and none in tokens/s (a re-signed cache row) is bounded too
    tokens_per_sample: int = 1

    @classmethod
    def for_run(
        cls, params: int, world_size: int, device: Device, gpu_peak_tflops: float | None, tokens_per_sample: int = 1
    ) -> Bounds:
        peak = cpu_peak_flops() if device == "cpu" else gpu_peak_flops(gpu_peak_tflops) * world_size
        return cls(params, world_size, peak, device, max(tokens_per_sample, 1))

    def max_tokens_per_s(self) -> float:
        return self.machine_peak_flops / (FORWARD_FLOPS_PER_PARAM_TOKEN * max(self.params, 1))

    def min_peak_bytes(self, candidate: Candidate) -> int | None:
        """The least memory a rank can peak at for this candidate, or None where the weights may live elsewhere."""
        offloads_params = candidate.rung.offload_param is not None or candidate.mode != Mode()
        if offloads_params and (self.device != "cpu" or candidate.rung.offload_param == "nvme"):
            return None
        shards = self.world_size if candidate.rung.stage == 3 else 1
        return self.params * MIN_BYTES_PER_PARAM // shards

    def why_implausible(self, candidate: Candidate, result: TrialResult) -> str | None:
        """None for a figure the hardware could produce; else the reason, in words."""
        peaks = [r.device_used_bytes or r.max_reserved_bytes or r.host_rss_peak_bytes for r in result.ranks]
        # a failed trial may have stopped before its weights were loaded: only a finished one has a memory floor
        return self.why_implausible_figures(candidate, self.tokens_per_s_of(result), peaks if result.ok else [])

    def tokens_per_s_of(self, result: TrialResult) -> float | None:
        """The fastest token rate any of the result's speed figures claims: its tokens/s, or its samples/s (the
        pick's speed, and the engine's profiled one) times the fewest tokens a sample holds."""
        samples = [s for s in (result.samples_per_s, result.profiled_samples_per_s) if s]
        claims = [result.tokens_per_s or 0.0, *(s * self.tokens_per_sample for s in samples)]
        return max(claims) or None

    def why_implausible_figures(
        self, candidate: Candidate, tokens_per_s: float | None, rank_peaks: list[int | None]
    ) -> str | None:
        if tokens_per_s and tokens_per_s > self.max_tokens_per_s():
            return (
                f"{tokens_per_s:.3g} tokens/s would need {tokens_per_s * 2 * self.params:.3g} FLOP/s for the forward"
                f" pass alone, above this machine's peak of {self.machine_peak_flops:.3g}"
            )
        floor = self.min_peak_bytes(candidate)
        lowest = min((peak for peak in rank_peaks if peak is not None), default=None)
        if floor and lowest is not None and lowest < floor:
            return (
                f"a memory peak of {format_bytes(lowest)} is below the model's own 16-bit weights per rank"
                f" ({format_bytes(floor)})"
            )
        return None
