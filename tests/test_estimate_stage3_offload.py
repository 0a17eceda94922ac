"""Stage 3 with an offloaded optimizer: the largest gradient's partition on its way to the host (buffers.py).

Arithmetic on hand-built summaries: the figure follows deepspeed's `partition_grads` (a 16-bit device copy of the
rank's partition, then its fp64 norm taken in chunks of 250M elements, or 0.19.8's fp32 conversion if larger), not
a conversion of the whole gradient.
"""

from __future__ import annotations

from tests.fakes.models import summary, target

from autotune.core.ladder import Rung
from autotune.estimate.buffers import (
    NORM_BYTES,
    NORM_CHUNK_ELEMENTS,
    deepspeed_buffers,
    offload_gradient_check_bytes,
    stage3_offload_grad_transient,
)
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.runtime import RuntimeStack

LARGEST = 525_336_576  # Llama-3-8B's embedding: 128256 x 4096


def _transient(rung: Rung, gpus: int, device: str = "cuda", largest: int = LARGEST, precision: str = "fp16") -> int:
    model = summary(total_params=8_030_261_248, trainable_params=8_030_261_248, largest_layer_params=largest)
    settings = EstimateSettings(seq_len=1024, precision=precision, device=device)
    return deepspeed_buffers(model, target(gpus=gpus), rung, settings).device_components["weight_grad_transient"]


def test_stage3_offload_counts_the_partition_not_the_whole_gradient():
    partition = LARGEST // 8
    expected = 2 * partition + NORM_BYTES * partition  # 16-bit device copy + its fp64 norm
    assert _transient(Rung.Z3_OFFLOAD_OPT, 8) == expected
    assert _transient(Rung.Z3_OFFLOAD_ALL, 8) == expected
    # the whole-gradient fp32 copy it replaces was 4 B x largest: 3.2 x more at 8 ranks
    assert expected < 4 * LARGEST


def test_stage3_offload_partition_rounds_up_and_follows_precision():
    largest = 100_000_001
    partition = -(-largest // 3)
    assert _transient(Rung.Z3_OFFLOAD_OPT, 3, largest=largest) == 2 * partition + NORM_BYTES * partition
    assert _transient(Rung.Z3_OFFLOAD_OPT, 3, largest=largest, precision="fp32") == 4 * partition + 8 * partition


def test_norm_chunk_bounds_the_fp64_copy_and_the_fp32_conversion_takes_over():
    largest = 2_000_000_000  # one rank: a partition of 2e9 elements, 8 chunks for the norm
    model = summary(total_params=largest, trainable_params=largest, largest_layer_params=largest)
    settings = EstimateSettings(seq_len=128, precision="bf16")
    figure = stage3_offload_grad_transient(model, target(gpus=1), settings)
    assert figure == 2 * largest + max(NORM_BYTES * NORM_CHUNK_ELEMENTS, 4 * largest) == 6 * largest


def test_cpu_backend_and_other_stages_keep_their_figure():
    # CPU backend: the "device copy" of the partition is the host buffer itself; stages 1-2 take the whole
    # gradient through their own offload path (stage_1_and_2.py; tests/test_estimate_offload_check.py)
    assert _transient(Rung.Z3_OFFLOAD_OPT, 8, device="cpu") == 4 * LARGEST
    assert _transient(Rung.Z2_OFFLOAD_OPT, 8) == 2 * LARGEST + offload_gradient_check_bytes(LARGEST, RuntimeStack())[0]
    assert _transient(Rung.Z3, 8) == 0
