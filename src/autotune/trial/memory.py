"""Peak memory of one rank during one trial: torch's allocator, NVML's device view, and host RSS.

The three GPU figures differ on purpose: max allocated is what tensors needed, max reserved adds the
caching allocator's slack, and NVML's used adds the CUDA context and NCCL buffers, i.e. what the next
tenant of the card actually loses.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
from pathlib import Path
from typing import Any

from autotune.trial.peak_sites import PeakSiteRecorder
from autotune.trial.types import RankMetrics

_PROC_STATUS = Path("/proc/self/status")
_PROC_CLEAR_REFS = Path("/proc/self/clear_refs")
_RESET_PEAK_RSS = "5"  # proc(5): writing 5 to clear_refs resets VmHWM to the current RSS


def host_rss_peak_bytes() -> int:
    """VmHWM when /proc has it (resettable between warm trials), else ru_maxrss (KiB on Linux)."""
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_rss_bytes() -> int:
    """This process's resident set now."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def reset_host_rss_peak() -> bool:
    try:
        _PROC_CLEAR_REFS.write_text(_RESET_PEAK_RSS)
        return True
    except OSError:
        return False


def release_host_memory() -> None:
    """Give freed heap pages back to the OS so the next warm trial's RSS starts from the baseline."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _nvml_handle(local_rank: int) -> Any | None:
    """NVML handle of this rank's GPU, found without touching CUDA so the baseline is taken before our context.

    NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES (indices or UUIDs) says which one local_rank means.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        ident = visible[local_rank] if visible else str(local_rank)
        if ident.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(ident))
        return pynvml.nvmlDeviceGetHandleByUUID(ident)
    except Exception:  # no NVML, no such device, MIG without access: the figure is optional
        return None


def _nvml_used(handle: Any | None) -> int | None:
    if handle is None:
        return None
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


class MemoryTracker:
    """Call reset() when the trial starts, sample() after every step, metrics() at the end.

    reset(record_sites=True) also records every allocation until metrics(), which then says whose memory the
    peak was (trial/peak_sites.py).
    """

    def __init__(self, device: str, local_rank: int) -> None:
        self.device = device
        self.local_rank = local_rank
        self._nvml = _nvml_handle(local_rank) if device == "cuda" else None
        self._baseline_used = _nvml_used(self._nvml)
        self._peak_used: int | None = None
        self._sites: PeakSiteRecorder | None = None

    def reset(self, record_sites: bool = False) -> None:
        if self._sites is not None:  # a trial that ended before metrics(): stop its recording
            self._sites.stop()
            self._sites = None
        if record_sites:
            self._sites = PeakSiteRecorder(self.device, self.local_rank)
        reset_host_rss_peak()
        self._peak_used = None
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.local_rank)
        self.sample()
        if self._sites is not None:
            self._sites.start()

    def sample(self) -> None:
        used = _nvml_used(self._nvml)
        if used is not None:
            self._peak_used = max(used, self._peak_used or 0)

    def metrics(self, rank: int) -> RankMetrics:
        measured = self._measured(rank)  # before the sites are worked out: that costs host memory of its own
        if self._sites is None:
            return measured
        sites, self._sites = self._sites.finish(), None
        return dataclasses.replace(measured, peak_sites=sites)

    def _measured(self, rank: int) -> RankMetrics:
        self.sample()
        if self.device != "cuda":
            return RankMetrics(rank=rank, host_rss_peak_bytes=host_rss_peak_bytes())
        import torch

        return RankMetrics(
            rank=rank,
            max_allocated_bytes=int(torch.cuda.max_memory_allocated(self.local_rank)),
            max_reserved_bytes=int(torch.cuda.max_memory_reserved(self.local_rank)),
            device_used_bytes=self._peak_used,
            host_rss_peak_bytes=host_rss_peak_bytes(),
            device_used_baseline_bytes=self._baseline_used,
        )
