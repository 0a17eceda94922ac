"""zero.Init's per-parameter pinned partitions stay cached in torch's host allocator (estimate/buffers.py
zero_init_pinned_partitions): counted in host RAM exactly where DeepSpeed pins them through CUDA."""

from __future__ import annotations

from dataclasses import replace

from tests.fakes.models import LLAMA_70B, target

from autotune.core.ladder import Candidate, Rung
from autotune.estimate import EstimateSettings, estimate
from autotune.estimate.buffers import zero_init_pinned_partitions
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.pinned import pinned_host_bytes, power_of_two_ceil
from autotune.estimate.stage3_retention import weight_matrices

NAME = "zero_init_pinned_partitions"


def _host(rung: Rung, gpus: int = 8, **knobs: object) -> dict[str, int]:
    settings = EstimateSettings(seq_len=1024, precision="bf16", knobs=ZeroKnobs(**knobs))
    return estimate(LLAMA_70B, target(gpus), Candidate(rung, 1, True), settings).host_components


def test_each_partition_costs_its_own_power_of_two_block() -> None:
    sizes = weight_matrices(LLAMA_70B)
    assert sum(sizes) <= LLAMA_70B.total_params  # norms left out, nothing counted twice
    assert sum(sizes) > 0.999 * LLAMA_70B.total_params
    settings = EstimateSettings(seq_len=1024, precision="bf16")
    expected = sum(power_of_two_ceil(2 * -(-size // 8)) for size in sizes)
    assert zero_init_pinned_partitions(LLAMA_70B, target(8), settings) == expected
    assert expected > 2 * LLAMA_70B.total_params // 8  # the rounding is most of the point: a 70B's are not powers of 2


def test_counted_only_with_parameters_pinned_on_the_host_under_zero_init() -> None:
    host = _host(Rung.Z3_OFFLOAD_ALL)
    assert host[NAME] == 8 * zero_init_pinned_partitions(LLAMA_70B, target(8), EstimateSettings(seq_len=1024))
    assert pinned_host_bytes(host) >= host[NAME]  # reported as page-locked
    assert NAME in _host(Rung.Z3_OFFLOAD_ALL, zero_init=None)  # unknown: as HF Trainer builds it
    assert NAME not in _host(Rung.Z3_OFFLOAD_ALL, zero_init=False)  # built whole, then partitioned by the engine
    assert NAME not in _host(Rung.Z3_OFFLOAD_ALL, pin_memory=False)  # pageable partitions go back when freed
    assert NAME not in _host(Rung.Z3_OFFLOAD_OPT)  # parameters stay on the GPU
    settings = replace(EstimateSettings(seq_len=1024, precision="bf16"), device="cpu")
    cpu = estimate(LLAMA_70B, target(8), Candidate(Rung.Z3_OFFLOAD_ALL, 1, True), settings)
    assert NAME not in cpu.gpu_components  # the CPU backend's pin_memory is a no-op: nothing stays locked
