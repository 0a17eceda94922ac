"""Peak memory of a user's job, measured from outside: the user's code is not touched.

CPU backend: host RSS. A rank is the top-most process of the trial that carries a rank in its environment
(`RANK`, set by torchrun / the deepspeed launcher for each rank, or by us for a one-process command); its
figure is its own RSS plus its descendants' (DataLoader workers, compile workers), summed at each sample,
and never below the rank process's own high-water mark (VmHWM, exact even between samples). Summing
RSS counts pages shared copy-on-write with forked workers more than once: an over- rather than an
under-estimate. Processes that are no rank (the launcher) count in the tree total only.

GPU: NVML's used memory of each of the trial's GPUs, sampled by the parent, minus its pre-trial level (other
tenants and the driver's reservation, which the limit it is compared with already excludes); the level is
kept beside it. Another tenant that grows during the trial still counts: from outside, the command's
processes have no pids NVML is sure to show (a container's pid namespace).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from autotune.trial.launch.gpus import nvml_used_bytes
from autotune.trial.launch.processes import TRIAL_TAG_ENV
from autotune.trial.trial_types import RankMetrics

GpuReader = Callable[[], "dict[int, int] | None"]


def _vm_hwm_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def visible_gpu_indices(env: Mapping[str, str], ranks_per_node: int) -> list[int]:
    """Physical NVML indices of local ranks 0..n-1 (CUDA_VISIBLE_DEVICES as indices; UUIDs fall back to order)."""
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible):
        return [int(v) for v in visible[:ranks_per_node]]
    return list(range(ranks_per_node))


@dataclass
class TreeMemorySampler:
    """Call sample() while the trial runs; peaks() afterwards. One sampler per trial."""

    tag: str
    device: str
    gpu_indices: list[int] = field(default_factory=list)
    read_gpus: GpuReader = nvml_used_bytes
    rank_peaks: dict[int, int] = field(default_factory=dict)
    tree_peak: int = 0
    gpu_peaks: dict[int, int] = field(default_factory=dict)
    gpu_baseline: dict[int, int] = field(default_factory=dict)
    _ranks_by_pid: dict[int, int | None] = field(default_factory=dict)

    def start(self) -> None:
        """The GPUs' use before the trial starts: what other tenants hold."""
        if self.device == "cuda":
            used = self.read_gpus() or {}
            self.gpu_baseline = {i: used[i] for i in self.gpu_indices if i in used}

    def sample(self) -> None:
        if self.device == "cuda":
            used = self.read_gpus() or {}
            for index in self.gpu_indices:
                if index in used:
                    self.gpu_peaks[index] = max(self.gpu_peaks.get(index, 0), used[index])
        processes = self._trial_processes()
        rss = {p.pid: _rss(p) for p in processes}
        self.tree_peak = max(self.tree_peak, sum(rss.values()))
        for process in processes:
            rank = self._rank_root(process, processes)
            if rank is None:
                continue
            total = rss[process.pid] + sum(rss.get(c.pid, 0) for c in _children(process))
            total = max(total, _vm_hwm_bytes(process.pid))
            self.rank_peaks[rank] = max(self.rank_peaks.get(rank, 0), total)

    def metrics(self, ranks: range) -> list[RankMetrics]:
        """Per rank; on the CPU backend a command whose ranks could not be told apart reports its tree as rank 0."""
        peaks = dict(self.rank_peaks) or ({0: self.tree_peak} if self.tree_peak else {})
        result = []
        for rank in ranks:
            gpu = self.gpu_indices[rank] if rank < len(self.gpu_indices) else None
            result.append(
                RankMetrics(
                    rank=rank,
                    host_rss_peak_bytes=peaks.get(rank),
                    device_used_bytes=self._gpu_growth(gpu),
                    device_used_baseline_bytes=self.gpu_baseline.get(gpu) if gpu is not None else None,
                )
            )
        return result

    def _gpu_growth(self, gpu: int | None) -> int | None:
        if gpu is None or gpu not in self.gpu_peaks:
            return None
        return max(0, self.gpu_peaks[gpu] - self.gpu_baseline.get(gpu, 0))

    def _trial_processes(self) -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter():
            try:
                ours = process.pid in self._ranks_by_pid or process.environ().get(TRIAL_TAG_ENV) == self.tag
                if ours and process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def _rank_of(self, process: psutil.Process) -> int | None:
        if process.pid not in self._ranks_by_pid:
            try:
                value = process.environ().get("RANK")
                self._ranks_by_pid[process.pid] = int(value) if value is not None and value.isdigit() else None
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                return None
        return self._ranks_by_pid[process.pid]

    def _rank_root(self, process: psutil.Process, processes: list[psutil.Process]) -> int | None:
        """The process's rank if it is the top-most process of that rank, else None."""
        rank = self._rank_of(process)
        if rank is None:
            return None
        try:
            parent = process.ppid()
        except psutil.NoSuchProcess:
            return None
        parent_process = next((p for p in processes if p.pid == parent), None)
        if parent_process is not None and self._rank_of(parent_process) == rank:
            return None
        return rank


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
