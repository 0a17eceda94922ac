"""Page-locked (pinned) host memory as torch allocates it: each pinned tensor costs the next power of two.

DeepSpeed pins its offload buffers with `get_accelerator().pin_memory(tensor)` (deepspeed 0.19.8
accelerator/abstract_accelerator.py:328-339 -> `tensor.pin_memory()`), which on CUDA goes through torch's
CachingHostAllocator. Its `allocate` rounds every request up: `size_t roundSize = c10::llvm::PowerOf2Ceil(size)`
(pytorch aten/src/ATen/core/CachingHostAllocator.h, `CachingHostAllocatorImpl::allocate`, "Round up the
allocation to the nearest power of two to improve reuse"), and cudaHostAlloc locks the whole rounded block in
RAM. Measured by others: a 2.25 GiB pin_memory() took 4.008 GiB of RssShmem on torch 2.13.0+cu130
(wtdcode/vllm-backport#67); a 20.4 GiB request pinned exactly 2^35 bytes (sgl-project/sglang#36562); a 129.5 MB
weight pinned 256 MB (pytorch/pytorch#150517, open). So a 28 GB fp32 partition pins 32 GiB.
Not rounded: the CPU backend (its accelerator's pin_memory is a no-op, accelerator/cpu_accelerator.py:281-283),
pin_memory false, and DeepSpeed's opt-in DS_PIN_MEMORY_BACKEND=native (utils/pin_memory.py:195-199, mlock of
the exact size), which a job's environment would have to set; the torch backend is DeepSpeed's default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.estimate.estimate_types import EstimateSettings


def power_of_two_ceil(nbytes: int) -> int:
    """The smallest power of two >= nbytes (c10::llvm::PowerOf2Ceil); 0 stays 0."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def pins_through_cuda(settings: EstimateSettings) -> bool:
    """Offload buffers are pinned by torch's CUDA host allocator: a GPU run whose offload sets pin_memory."""
    return settings.device != "cpu" and settings.knobs.pin_memory


def pinned_bytes(nbytes: int, rounded: bool) -> int:
    """Host RAM one pinned tensor of `nbytes` takes: rounded up to a power of two when torch's CUDA host
    allocator pins it (`rounded`), else its size."""
    return power_of_two_ceil(nbytes) if rounded else nbytes


# Host components (estimate.MemoryEstimate.host_components) that DeepSpeed page-locks when the offload section
# sets pin_memory: the offloaded fp32 master/gradient/16-bit buffers (model_states.py; at stage 3 the whole
# offloaded figure, as DeepSpeed's estimator gives it), the 16-bit gradient staging buffer
# (stage_1_and_2.py:656-658), a partial-offload ratio's share (negative: kept on the GPU, estimate/mode_terms.py) and
# zero.Init's per-parameter partitions that torch's host allocator keeps cached.
PINNED_WITH_PIN_MEMORY = (
    "offloaded_states",
    "offload_grad_staging",
    "partial_offload_host_saving",
    "zero_init_pinned_partitions",  # buffers.zero_init_pinned_partitions
)
# The NVMe swap buffers are pinned whatever the section says (swap_tensor/).
ALWAYS_PINNED = ("optimizer_swap_buffers", "param_swap_buffers")


def pinned_host_bytes(host_components: dict[str, int], pin_memory: bool = True) -> int:
    """Page-locked share of a prediction's host RAM (per node, as host_components are)."""
    names = ALWAYS_PINNED + (PINNED_WITH_PIN_MEMORY if pin_memory else ())
    return sum(host_components.get(name, 0) for name in names)


# What RLIMIT_MEMLOCK (`ulimit -l`) limits: memory locked with mlock(2), per process, unless the process holds
# CAP_IPC_LOCK (man 2 mlock: "ENOMEM ... the caller was not privileged (CAP_IPC_LOCK)"). DeepSpeed mlocks
# - the NVMe swap buffers, always: the aio handle's new_cpu_locked_tensor -> ds_page_aligned_alloc(size, lock=true)
#   (deepspeed 0.19.8 ops/csrc/pin_memory/page_alloc.cpp:24, deepspeed_pin_tensor.cpp:47);
# - the offload buffers that pin_memory pins, when the job sets DS_PIN_MEMORY_BACKEND=native (utils/pin_memory.py,
#   NativePinnedMemory -> the same page_alloc.cpp mlock), on any accelerator, the CPU backend included
#   (accelerator/cpu_accelerator.py pin_memory routes to it).
# Measured here (CPU backend, deepspeed 0.19.8): under `ulimit -l 64` without CAP_IPC_LOCK, native-pinning 1 MiB
# prints "mlock failed ... Cannot allocate memory" and aborts the process (SIGABRT, deepspeed_pin_tensor.cpp:48);
# 32 KiB pins; as root with CAP_IPC_LOCK the same 1 MiB pins under the same limit.
# Not counted: torch's default pin path (cudaHostAlloc, allocated by the NVIDIA driver, not mlock); whether a
# driver charges it to RLIMIT_MEMLOCK is not measured here (no GPU on this project's machine).
NATIVE_PIN_BACKEND = "native"


def native_pinning(environ: dict[str, str] | None = None) -> bool:
    """Whether DeepSpeed pins offload buffers with mlock in this environment (DS_PIN_MEMORY_BACKEND=native),
    read as utils/pin_memory.py get_active_native_pinned_memory reads it."""
    import os

    env = os.environ if environ is None else environ
    return env.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() == NATIVE_PIN_BACKEND


def mlocked_bytes(per_rank_host: dict[str, int], pin_memory: bool, native: bool) -> int:
    """Bytes one rank locks with mlock(2), the share of its host memory that RLIMIT_MEMLOCK limits (see above)."""
    names = ALWAYS_PINNED + (PINNED_WITH_PIN_MEMORY if pin_memory and native else ())
    return sum(max(0, per_rank_host.get(name, 0)) for name in names)
