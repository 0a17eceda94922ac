"""The FLOP arithmetic behind TFLOP/s and MFU (no torch import: the parent uses it)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class FlopsPerToken:
    hardware: float  # what the GPU executes, activation recompute included
    model: float  # what the model needs: the numerator of MFU (PaLM, appendix B)


def flops_per_token(
    params: int, num_layers: int, hidden_size: int, seq_len: int, grad_checkpointing: bool
) -> FlopsPerToken:
    """6N per token for forward + backward, plus 12·L·h·s for attention scores (PaLM's formula).

    Gradient checkpointing re-runs the forward during backward: 8N and 16·L·h·s are executed,
    but MFU keeps counting 6N so that recompute does not look like useful work.
    """
    dense = 2 * params
    attention = 4 * num_layers * hidden_size * seq_len
    passes_model = 3  # forward + backward (2x forward)
    passes_hardware = 4 if grad_checkpointing else 3
    return FlopsPerToken(
        hardware=float(passes_hardware * (dense + attention)),
        model=float(passes_model * (dense + attention)),
    )


@dataclass(frozen=True)
class Throughput:
    samples_per_s: float
    tokens_per_s: float
    tflops_per_gpu: float | None
    mfu: float | None


def throughput(
    step_times_s: list[float],
    train_batch_size: int,
    seq_len: int,
    world_size: int,
    flops: FlopsPerToken | None,
    peak_tflops: float | None,
) -> Throughput | None:
    """Rates from the median measured step: one step is one optimizer step over train_batch_size samples."""
    if not step_times_s:
        return None
    step_s = statistics.median(step_times_s)
    samples_per_s = train_batch_size / step_s
    tokens_per_s = samples_per_s * seq_len
    if flops is None:
        return Throughput(samples_per_s, tokens_per_s, None, None)
    tflops_per_gpu = flops.hardware * tokens_per_s / world_size / 1e12
    mfu = flops.model * tokens_per_s / world_size / 1e12 / peak_tflops if peak_tflops else None
    return Throughput(samples_per_s, tokens_per_s, tflops_per_gpu, mfu)
