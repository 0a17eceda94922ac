"""Stand-ins for what a GPU's driver and runtime report, for tests that run without a GPU: NVML (`pynvml`, read by
autotune.hardware.machine_probe and the trial's MemoryTracker), torch.cuda's caching allocator, and DeepNVMe's aio
handle.

They hold only what the real part would report (totals, used bytes, processes, reserved bytes); what autotune makes
of it is what the tests check. None of them models the real part's timing or its errors beyond what is said below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

from autotune.core.units import GiB, MiB

if TYPE_CHECKING:
    import torch

# An 80 GiB card as the tests see it (the figures are the fake's, chosen to be told apart in assertions):
CARD_TOTAL = 80 * GiB  # NVML's total
CUDA_TOTAL = 79 * GiB  # cudaMemGetInfo's total: the driver keeps a reservation NVML counts in total
DRIVER_RESERVED = 600 * MiB  # what NVML's used shows on an idle card
OTHER_TENANT = 10 * GiB  # another job's process on the same card
CONTEXT = 500 * MiB  # our CUDA context, outside the allocator


@dataclass
class FakeCard:
    """One GPU as NVML shows it: processes by pid with their device bytes; used = the driver's reservation + every
    process; free = total - used. `per_process_visible=False` is a container whose pids NVML does not show (one
    process, pid 1, holding everything)."""

    processes: dict[int, int] = field(default_factory=lambda: {999_999: OTHER_TENANT})
    per_process_visible: bool = True
    total_bytes: int = CARD_TOTAL
    driver_reserved_bytes: int = DRIVER_RESERVED
    name: str = "NVIDIA A100-SXM4-80GB"
    compute_capability: tuple[int, int] = (8, 0)

    def used(self) -> int:
        return self.driver_reserved_bytes + sum(self.processes.values())


class FakeNvml:
    """The `pynvml` module over a list of FakeCards (handle = the card's index, UUID "GPU-<index>"): installed in
    sys.modules["pynvml"] for hardware.probe, or passed as MemoryTracker's `nvml`. Every card reports all NVLinks
    active (4), PCIe gen 5 x16 and driver `driver_version`. Not modelled: NVML errors, MIG, clocks, utilization."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4

    def __init__(self, *cards: FakeCard, driver_version: str = "550.54") -> None:
        self.cards = list(cards)
        self.driver_version = driver_version

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return [self.nvmlDeviceGetUUID(i) for i in range(len(self.cards))].index(uuid)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.cards[handle].name

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return self.cards[handle].compute_capability

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        card = self.cards[handle]
        used = card.used()
        return SimpleNamespace(total=card.total_bytes, used=used, free=card.total_bytes - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        card = self.cards[handle]
        if not card.per_process_visible:
            return [SimpleNamespace(pid=1, usedGpuMemory=sum(card.processes.values()))]
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in card.processes.items()]


class FakeAllocator:
    """torch.cuda's caching allocator for this process on a FakeCard: its reserved bytes (plus `outside`, the CUDA
    context) are this pid's process on the card; reserving past `set_per_process_memory_fraction` of CUDA_TOTAL
    raises CUDA's out-of-memory. Allocated equals reserved (no caching slack, no fragmentation modelled)."""

    def __init__(self, card: FakeCard, outside: int = CONTEXT) -> None:
        self.card = card
        self.outside = outside
        self.reserved = 0
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.fraction = 1.0
        self._sync()

    def _sync(self) -> None:
        self.card.processes[os.getpid()] = self.outside + self.reserved

    def reserve(self, size: int) -> None:
        if self.reserved + size > self.fraction * CUDA_TOTAL:
            raise RuntimeError("CUDA out of memory")
        self.reserved += size
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self.allocated_peak = max(self.allocated_peak, self.reserved)
        self._sync()

    def release(self, size: int) -> None:
        self.reserved -= size
        self._sync()

    def reset_peak_memory_stats(self, device: int) -> None:
        self.reserved_peak = self.reserved
        self.allocated_peak = self.reserved

    def memory_reserved(self, device: int) -> int:
        return self.reserved

    def max_memory_reserved(self, device: int) -> int:
        return self.reserved_peak

    def max_memory_allocated(self, device: int) -> int:
        return self.allocated_peak

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return CUDA_TOTAL - self.card.used(), CUDA_TOTAL

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        self.fraction = fraction


@dataclass
class FakeAioHandle:
    """DeepNVMe's aio handle as the NVMe parameter swapper uses it: `free_cpu_locked_tensor` frees only the buffers
    its own page-locked allocator handed out (`managed`, by data pointer) and records them in `freed`. Not
    modelled: reads, writes, the allocation itself."""

    managed: set[int]
    freed: list[int] = field(default_factory=list)

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        if tensor.data_ptr() not in self.managed:
            return False
        self.managed.discard(tensor.data_ptr())
        self.freed.append(tensor.data_ptr())
        return True
