"""What a CUDA training process holds beyond its tensors, as a function of the stack the probe sees.

Each figure is (central, uncertainty) in bytes and cites where it comes from. The stack is what
`autotune probe` reports (torch / CUDA / NCCL versions, GPU compute capability); a field left None means
"not known" and widens the uncertainty instead of guessing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from autotune.core.units import GiB, MiB
from autotune.core.versions import installed as _installed
from autotune.core.versions import version_tuple


@dataclass(frozen=True)
class RuntimeStack:
    torch_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    compute_capability: str | None = None
    transformers_version: str | None = None  # decides the causal-LM loss path (estimate/activations.py)
    deepspeed_version: str | None = None  # decides the offload gradient check's transient (estimate/buffers.py)


# pip packages that carry NCCL with the CUDA builds of torch, newest first.
_NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def local_stack(compute_capability: str | None = None) -> RuntimeStack:
    """The stack this machine would train with, read from package metadata (no torch import, no CUDA context).

    torch's local version names its CUDA build ("2.13.0+cu130" -> CUDA 13.0); a CPU build or a missing torch
    leaves CUDA unknown. compute_capability comes from the probe (NVML).
    """
    torch_version = _installed("torch")
    cuda = None
    if torch_version and "+cu" in torch_version:
        digits = torch_version.split("+cu", 1)[1]
        if digits.isdigit() and len(digits) >= 3:
            cuda = f"{int(digits[:-1])}.{digits[-1]}"
    nccl = next((version for version in map(_installed, _NCCL_PACKAGES) if version), None)
    return RuntimeStack(
        torch_version,
        cuda,
        nccl,
        compute_capability,
        transformers_version=_installed("transformers"),
        deepspeed_version=_installed("deepspeed"),
    )


@dataclass(frozen=True)
class Overhead:
    central: int
    uncertainty: int
    source: str


# --- CUDA context -------------------------------------------------------------------------------------
# With lazy module loading (PyTorch sets CUDA_MODULE_LOADING=LAZY since 1.13, pytorch/pytorch PR #86509; the
# driver supports it from CUDA 11.7): 287,047,680 B measured in that PR (CUDA 11.7), "around 400MB"
# (ptrblck, pytorch/pytorch#109888), 426 MiB by nvidia-smi for PyTorch 2.10+cu130 on an RTX 6000 Ada
# (unslothai/unsloth-zoo PR #1053). Eager loading (older stacks): 666,632,192 B in PR #86509, ">1000MB"
# before CUDA 11.7 (ptrblck, pytorch/pytorch#107667). Training loads more kernels than those one-tensor
# probes, so the central value is the largest lazy figure and the spread reaches the eager one.
CONTEXT_LAZY = 426 * MiB
CONTEXT_LAZY_LOW = 287_047_680
CONTEXT_EAGER = 1000 * 10**6
CONTEXT_EAGER_LOW = 666_632_192


def lazy_loading(stack: RuntimeStack) -> bool | None:
    torch_version, cuda_version = version_tuple(stack.torch_version), version_tuple(stack.cuda_version)
    if torch_version is None or cuda_version is None:
        return None
    return torch_version >= (1, 13) and cuda_version >= (11, 7)


def cuda_context(stack: RuntimeStack) -> Overhead:
    lazy = lazy_loading(stack)
    if lazy is True:
        return Overhead(CONTEXT_LAZY, CONTEXT_LAZY - CONTEXT_LAZY_LOW, "lazy module loading")
    if lazy is False:
        return Overhead(CONTEXT_EAGER, CONTEXT_EAGER - CONTEXT_EAGER_LOW, "eager module loading")
    return Overhead(CONTEXT_LAZY, CONTEXT_EAGER - CONTEXT_LAZY, "stack unknown: lazy assumed, eager in the margin")


# --- NCCL --------------------------------------------------------------------------------------------
# Per communicator after its first collective: 544 MB in a 2-rank group, 688 MB in larger groups, 4x A100
# with NVLink (NVIDIA/nccl issue #964). DeepSpeed 0.19.8 runs its collectives on a clone of the world group
# (deepspeed/utils/groups.py:723-734, `_clone_world_group` -> dist.new_group) while torch.distributed's default
# group carries the barriers (e.g. runtime/zero/stage3.py:774) and HF/accelerate's own collectives: two
# communicators per rank. NCCL >= 2.22 connects lazily (NCCL_RUNTIME_CONNECT=1 by default, NCCL 2.22 release
# notes), so a communicator that only runs barriers sets up few channels: the second one is then margin, not
# central. Hopper's NVLink SHARP buffers are counted apart (nvls_buffers below).
NCCL_TWO_RANKS = 544 * 10**6
NCCL_MORE_RANKS = 688 * 10**6


def nccl_buffers(world_size: int, stack: RuntimeStack) -> Overhead:
    if world_size <= 1:
        return Overhead(0, 0, "single rank: no communicator")
    one = NCCL_TWO_RANKS if world_size == 2 else NCCL_MORE_RANKS
    nccl = version_tuple(stack.nccl_version)
    if nccl is None:
        central, margin, note = one, one, "NCCL version unknown: second communicator in the margin"
    elif nccl >= (2, 22):
        central, margin, note = one, one // 2, "lazy connect (NCCL>=2.22): second communicator mostly idle"
    else:
        central, margin, note = 2 * one, one // 2, "eager connect (NCCL<2.22): two communicators"
    return Overhead(central, margin, note)


# --- NCCL NVLink SHARP (NVLS) --------------------------------------------------------------------------
# NCCL (>= 2.17) gives every communicator on a node of more than two multicast-capable GPUs (Hopper and later,
# compute capability >= 9.0) its own NVLS buffer: src/transport/nvls.cc `ncclNvlsInit` returns early for
# gpuCount <= 2, and `nvlsAllocateMem` backs nvlsTotalSize = nChannels x 2 x buffSize x nHeads (one head per
# local GPU) with physical device memory (`cuMemCreate`, "Alloc local physical mem for this NVLS group"),
# outside PyTorch's allocator. Logged on 8 x H200 (vllm-project/vllm#9699, NCCL of torch 2.4/2.5): "NVLS comm ...
# nHeads 8 buffSize 4194304 memSize 2097152 nvlsPerRankSize 301989888 nvlsTotalSize 2415919104", i.e.
# 301,989,888 B per head (2.25 GiB per communicator at 8 GPUs). Before NCCL 2.22 the buffer is set up when the
# communicator is created, so both of DeepSpeed's communicators (see above) hold one; from 2.22 (runtime connect)
# it is set up at the first NVLS collective: DeepSpeed's gathers and reductions make one central, the barrier-only
# communicator the margin. A PCIe Hopper card without NVSwitch has no multicast: this over-counts there.
NVLS_BYTES_PER_HEAD = 301_989_888
NVLS_FIRST_NCCL = (2, 17)


def nvls_buffers(gpus_per_node: int, stack: RuntimeStack) -> Overhead:
    capability, nccl = version_tuple(stack.compute_capability), version_tuple(stack.nccl_version)
    if gpus_per_node <= 2 or capability is None or capability < (9,):
        return Overhead(0, 0, "no NVLS: two GPUs or fewer per node, or not Hopper (or GPU unknown)")
    if nccl is not None and nccl < NVLS_FIRST_NCCL:
        return Overhead(0, 0, "no NVLS before NCCL 2.17")
    one = NVLS_BYTES_PER_HEAD * gpus_per_node
    if nccl is not None and nccl < (2, 22):
        return Overhead(2 * one, 0, "NVLS buffers set up with both communicators (NCCL<2.22)")
    return Overhead(one, one, "NVLS buffers on the communicator that runs NVLS collectives; second in the margin")


# --- caching allocator ---------------------------------------------------------------------------------
# reserved / allocated at the point of failure, read from published OOM messages of DeepSpeed and HF runs
# (allocated GiB, reserved GiB, source). Blocks round up to 512 B / 2 MiB and large allocations are carved from
# 20 MiB segments (c10/cuda/CUDACachingAllocator.cpp), so reserved exceeds allocated by a few percent; the
# outlier is the HF blog's fragmentation example.
ALLOCATOR_OBSERVATIONS: tuple[tuple[float, float, str], ...] = (
    (73.95, 76.80, "Instruction-Tuning-with-GPT-4/GPT-4-LLM#16, ZeRO-3, 2x A100 80GB"),
    (76.68, 77.24, "deepspeedai/DeepSpeed#2899, ZeRO-3, A100 80GB"),
    (30.25, 30.67, "Lightning-AI/pytorch-lightning#18134, ZeRO-3 offload, V100 32GB"),
    (13.30, 13.65, "deepspeedai/DeepSpeed#3208, 16 GB card"),
    (77.08, 77.54, "deepseek-ai/DeepSeek-Coder#78, ZeRO-3, A800 80GB"),
    (73.28, 74.87, "hiyouga/LlamaFactory#7532, ZeRO-3 offload, 80 GB"),
    (29.07, 30.34, "Lightning-AI/pytorch-lightning#20299, DeepSpeed, V100 32GB"),
    (21.37, 22.05, "huggingface/blog zero-deepspeed-fairscale.md, t5-3b, RTX 3090"),
    (12.80, 12.97, "huggingface/transformers#10011, ZeRO-2, 16 GB card"),
    (16.22, 22.52, "huggingface/blog zero-deepspeed-fairscale.md, fragmentation example"),
)


def _reserve_fractions() -> list[float]:
    return sorted(reserved / allocated - 1 for allocated, reserved, _ in ALLOCATOR_OBSERVATIONS)


def allocator_reserve_fraction() -> float:
    """Median reserved-over-allocated of the observations (about 2.4%)."""
    return statistics.median(_reserve_fractions())


def allocator_reserve_margin_fraction() -> float:
    """Spread kept as margin: the 80th percentile minus the median (the fragmentation outlier is beyond it)."""
    fractions = _reserve_fractions()
    index = min(len(fractions) - 1, round(0.8 * (len(fractions) - 1)))
    return fractions[index] - allocator_reserve_fraction()


# Away from the limit the allocator keeps what it has cached: the reserved high-water mark that nvidia-smi and
# torch.cuda.max_memory_reserved report exceeds the allocated peak by more than at an OOM (where the allocator
# has just released its cache and retried, c10/cuda/CUDACachingAllocator.cpp `release_cached_blocks`). Pairs of
# (max allocated GiB, reserved GiB, source) from runs that fitted:
UNPRESSURED_OBSERVATIONS: tuple[tuple[float, float, str], ...] = (
    (5.55, 6.39, "deepspeedai/DeepSpeed#522, ZeRO-2 + checkpointing, see_memory_usage Max_MA / CA"),
    (47.0, 55.0, "meta-llama/llama-cookbook PR #206, 'Max CUDA memory allocated / reserved'"),
    # memory_status after a training step, peaks since the start (13B on 8 x A100-80GB as the issue tells it);
    # a maintainer got ZeRO-3's peak down to ZeRO-2's with HfDeepSpeedConfig, the cache pair is still what ran
    (52.3739, 57.1406, "deepspeedai/DeepSpeed#3734, ZeRO-2, 'MEMSTATS ... after training step' max alloc / cache"),
    (56.1189, 69.2051, "deepspeedai/DeepSpeed#3734, ZeRO-3, 'MEMSTATS ... after training step' max alloc / cache"),
    # Megatron-DeepSpeed report_memory after iteration 1, rank 0: ZeRO-2, TP 2, mb 8, seq 4096, flash-attn v2
    (22332.37 / 1024, 32994.0 / 1024, "saforem2/Megatron-DeepSpeed ALCF/README.md (Polaris), max allocated / reserved"),
    # see_memory_usage 'Engine after backward' of a ZeRO-3 + CPU offload micro-step (Mistral-7B, 2 x A100-80GB);
    # CA (65.09) taken, as Max_CA is printed rounded to a whole GB
    (62.2, 65.09, "cloneofsimo/reverse_eng_deepspeed_study day3/README.md, ZeRO-3 offload, Max_MA / CA"),
)


def unpressured_reserve_fraction() -> float:
    """Reserved over allocated peak in runs with room to spare (about 16%): what nvidia-smi shows then."""
    return statistics.median(reserved / allocated - 1 for allocated, reserved, _ in UNPRESSURED_OBSERVATIONS)


# --- memory outside PyTorch during training ------------------------------------------------------------
# "Including non-PyTorch memory, this process has X in use ... Y allocated by PyTorch, and Z reserved by PyTorch
# but unallocated": X - Y - Z is the context, NCCL, cuBLAS/cuDNN workspaces and kernels loaded during
# training. 2.05 GiB (hiyouga/LlamaFactory#7532, 48 GPUs on 6 nodes, ZeRO-3 offload), 0.63 GiB
# (Lightning-AI/pytorch-lightning#20299, V100 32GB). Used to bound the runtime margin, not as a central value.
NON_PYTORCH_OBSERVED_MAX = round(2.05 * GiB)
