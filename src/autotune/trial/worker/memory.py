"""Peak memory of one rank during one trial: torch's allocator, this process's device memory, and host RSS.

The three GPU figures differ on purpose: max allocated is what tensors needed, max reserved adds the
caching allocator's slack, and the process's device memory adds what lives outside the allocator (CUDA
context, NCCL buffers, lazily loaded kernels), i.e. what the next tenant of the card actually loses.

The device figure is this process's own, never the card's `used`: that counts the driver's reservation and
every other tenant, while the limit it is compared with (NVML `free`, target.free_memory_bytes) already
excludes them. NVML's compute-process list gives it per pid; where our pid is not in it (a container's pid
namespace: NVML reports host pids), `used` minus the level before our CUDA context stands in.

A step's peak can be brief: under a set_per_process_memory_fraction cap the allocator frees its cache and
retries inside the step, so a reading at step ends alone is low exactly near the cap. Two readings cover it: a
sampler thread polls the process's figure while the trial runs, and torch's max_memory_reserved (exact, kept
by the allocator itself) plus the memory outside the allocator as measured at step ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune.hardware.machine_probe import visible_selection
from autotune.infra.allocator_env import allocator_settings
from autotune.trial.trial_types import SAMPLE_PERIOD_S, RankMetrics
from autotune.trial.worker.peak_sites import PeakSiteRecorder

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


# How far VmHWM may sit above VmRSS, read together straight after a reset, for the reset to count as done: a choice,
# not a measurement. After the write VmHWM equals the resident set of that moment (proc(5)); what is freed in the
# microseconds before the read is far below it. A kernel that accepts the write but ignores it (a sandbox's /proc)
# leaves VmHWM at the process's lifetime high, which a warm worker's earlier trials put far above it.
_RESET_SLACK_BYTES = 4 * 2**20


def _status_kib(text: str, field: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def reset_host_rss_peak(status: Path = _PROC_STATUS, clear_refs: Path = _PROC_CLEAR_REFS) -> bool:
    """Reset VmHWM to the current RSS and check that it took: False where the write fails or VmHWM stayed above
    VmRSS (a silent no-op would make every warm trial's host peak the worker's lifetime high)."""
    try:
        clear_refs.write_text(_RESET_PEAK_RSS)
        text = status.read_text()
    except OSError:
        return False
    high, resident = _status_kib(text, "VmHWM"), _status_kib(text, "VmRSS")
    if high is None or resident is None:
        return False
    return (high - resident) * 1024 <= _RESET_SLACK_BYTES


def empty_host_cache() -> str | None:
    """Return the pinned host blocks torch's host caching allocator keeps after they are freed (they stay
    page-locked, in RSS, until this call: estimate/buffers.py), so a warm worker's next trial does not carry them.

    The API's name depends on the release: `torch.accelerator.empty_host_cache` (pytorch#171270, merged 2026-03;
    torch 2.13 has it and no longer has the older name, checked here), else `torch._C._host_emptyCache`
    (pytorch#134919, torch 2.5 on). Returns the name called, None where neither exists."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    for owner, name, shown in (
        (accelerator, "empty_host_cache", "torch.accelerator.empty_host_cache"),
        (torch._C, "_host_emptyCache", "torch._C._host_emptyCache"),
    ):
        call = getattr(owner, name, None)
        if callable(call):
            call()
            return shown
    return None


def pinned_host_bytes() -> int | None:
    """Bytes of pinned host blocks torch's host allocator owns now (in use and cached); None where it cannot say."""
    try:
        import torch

        return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))
    except Exception:  # an older torch, or no CUDA: the figure is optional
        return None


def release_host_memory() -> None:
    """Give freed heap pages back to the OS so the next warm trial's RSS starts from the baseline."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# The sampler thread's period is TrialSpec.sample_period_s (trial/trial_types.py says why 10 ms); peaks shorter than it
# are
# still covered by max_memory_reserved + the memory outside the allocator (see the module docstring).


def _load_nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no NVML (CPU machines, MIG without access): the device figures are optional
        return None


def _nvml_handle(nvml: Any | None, local_rank: int) -> Any | None:
    """NVML handle of this rank's GPU, found without touching CUDA so the baseline is taken before our context.

    NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES (indices, UUIDs or UUID prefixes) says which one local_rank
    means, read as the probe reads it (hardware/machine_probe.py visible_selection).
    """
    if nvml is None:
        return None
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return nvml.nvmlDeviceGetHandleByIndex(local_rank)
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        selected = visible_selection(visible, uuids) or []  # indices or UUID prefixes, as CUDA and the probe read it
        return handles[selected[local_rank]] if local_rank < len(selected) else None
    except Exception:  # no such device
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclasses.dataclass(frozen=True)
class DeviceView:
    """NVML's view of one GPU, for one process: the card's used/total and this process's own bytes."""

    nvml: Any | None
    handle: Any | None
    pid: int

    def card_used(self) -> int | None:
        if self.nvml is None or self.handle is None:  # a handle comes only from an NVML (_nvml_handle)
            return None
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except Exception:
            return None

    def card_total(self) -> int | None:
        if self.nvml is None or self.handle is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).total)
        except Exception:
            return None

    def own_bytes(self) -> int | None:
        """This pid's device memory from NVML's compute-process list; None where the list does not show it
        (pid namespaces, no per-process accounting) or the driver cannot say (usedGpuMemory unavailable)."""
        if self.nvml is None or self.handle is None:
            return None
        try:
            processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:
            return None
        for process in processes:
            used = getattr(process, "usedGpuMemory", None)
            if process.pid == self.pid and used is not None and used < 2**63:  # NVML_VALUE_NOT_AVAILABLE is ~0
                return int(used)
        return None


class PeakSampler:
    """A daemon thread that keeps the highest value read() returned between start() and stop()."""

    def __init__(self, read: Callable[[], int | None], period_s: float = SAMPLE_PERIOD_S) -> None:
        self._read = read
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak: int | None = None

    def offer(self, value: int | None) -> None:
        if value is not None and (self.peak is None or value > self.peak):
            self.peak = value

    def start(self) -> None:
        self.stop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="device-memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.offer(self._read())
            self._stop.wait(self.period_s)


def allocator_fraction(card_bytes: int, outside_bytes: int, cuda_total_bytes: int) -> float:
    """The set_per_process_memory_fraction that keeps the whole process inside an emulated card of card_bytes.

    torch caps the caching allocator at fraction x the device total as CUDA reports it, not as NVML does
    (c10/cuda/CUDACachingAllocator.cpp setMemoryFraction: `fraction * device_total` from cudaMemGetInfo, in
    torch 2.4+ `device_prop.totalGlobalMem`, the same figure; NVML's total is larger by the driver's
    reservation). What lives outside the allocator (CUDA context, NCCL buffers, lazily loaded kernels) counts
    against a real card too, so it comes off the allocator's share.
    """
    return max(0.0, min(1.0, (card_bytes - outside_bytes) / cuda_total_bytes))


class MemoryTracker:
    """Call reset() when the trial starts, sample() after every step, metrics() at the end.

    reset(record_sites=True) also records every allocation until metrics(), which then says whose memory the
    peak was (trial/worker/peak_sites.py). limit_device() emulates a smaller card for the whole process.

    nvml and allocator are swappable for tests (a fake NVML, a fake torch.cuda); the real ones are the default.
    """

    def __init__(self, device: str, local_rank: int, nvml: Any | None = None, allocator: Any | None = None) -> None:
        self.device = device
        self.local_rank = local_rank
        if device == "cuda":
            nvml = nvml if nvml is not None else _load_nvml()
            self._view = DeviceView(nvml, _nvml_handle(nvml, local_rank), os.getpid())
        else:
            self._view = DeviceView(None, None, os.getpid())
        self._allocator = allocator
        self._baseline_used = self._view.card_used()  # before our CUDA context: what others (and the driver) hold
        self._sampler = PeakSampler(self.process_device_bytes)
        self._outside: int | None = None  # this process's device memory outside torch's allocator, at step ends
        self._card_bytes: int | None = None  # the emulated card, when limit_device() set one
        self._sites: PeakSiteRecorder | None = None
        self._carried: dict[str, int] = {}  # the trial's peaks before a phase reset the counters (phase())
        self._phase_peaks: dict[str, int | None] = {}
        self.host_peak_reset = True  # whether the last reset() reset VmHWM (reset_host_rss_peak)

    @property
    def cuda(self) -> Any:
        if self._allocator is None:
            import torch

            self._allocator = torch.cuda
        return self._allocator

    def process_device_bytes(self) -> int | None:
        """This process's device memory: NVML's per-process figure, else card used minus the pre-context level."""
        own = self._view.own_bytes()
        if own is not None:
            return own
        used = self._view.card_used()
        if used is None or self._baseline_used is None:
            return None
        return max(0, used - self._baseline_used)

    def held_after_trial_bytes(self) -> int | None:
        """Device memory this process holds between trials: NVML's figure (NCCL's buffers and the CUDA context
        included), else what torch's allocator keeps reserved; None on the CPU backend."""
        if self.device != "cuda":
            return None
        held = self.process_device_bytes()
        return held if held is not None else int(self.cuda.memory_reserved(self.local_rank))

    def source(self) -> str | None:
        if self._view.handle is None:
            return None
        return "nvml_process" if self._view.own_bytes() is not None else "nvml_used_minus_baseline"

    def reset(self, record_sites: bool = False, sample_period_s: float = SAMPLE_PERIOD_S) -> None:
        """Start a trial's measurement: peaks cleared (VmHWM too: `host_peak_reset` says whether that took) and the
        device sampler started at sample_period_s."""
        if self._sites is not None:  # a trial that ended before metrics(): stop its recording
            self._sites.stop()
            self._sites = None
        if record_sites:
            self._sites = PeakSiteRecorder(self.device, self.local_rank)
        self.host_peak_reset = reset_host_rss_peak()
        self._carried, self._phase_peaks = {}, {}
        self._sampler.stop()
        self._sampler.peak = None
        self._sampler.period_s = sample_period_s
        self._outside = None
        if self.device == "cuda":
            self.cuda.reset_peak_memory_stats(self.local_rank)
            if self._view.handle is not None:
                self._sampler.start()
        self.sample()
        if self._sites is not None:
            self._sites.start()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the peak of one phase of the trial on its own (GPU: allocated; CPU: host RSS), from where memory
        stands when it starts; the trial's own peaks carry over. Read back in metrics() as `<name>_peak_bytes`; a
        phase entered again (one step at a time) keeps the largest, unknown once any entry's is."""
        self._carry_peaks()
        if self.device == "cuda":
            self.cuda.reset_peak_memory_stats(self.local_rank)
            yield
            self._keep_phase_peak(name, int(self.cuda.max_memory_allocated(self.local_rank)))
            return
        reset = reset_host_rss_peak()  # where VmHWM cannot be reset, the phase's own peak is unknown
        yield
        self._keep_phase_peak(name, host_rss_peak_bytes() if reset else None)

    def _keep_phase_peak(self, name: str, peak: int | None) -> None:
        if name not in self._phase_peaks:
            self._phase_peaks[name] = peak
            return
        before = self._phase_peaks[name]
        self._phase_peaks[name] = None if before is None or peak is None else max(before, peak)

    def _carry_peaks(self) -> None:
        now = {"host": host_rss_peak_bytes()}
        if self.device == "cuda":
            now["allocated"] = int(self.cuda.max_memory_allocated(self.local_rank))
            now["reserved"] = int(self.cuda.max_memory_reserved(self.local_rank))
        self._carried = {key: max(value, self._carried.get(key, 0)) for key, value in now.items()}

    def _peak(self, key: str, now: int) -> int:
        return max(now, self._carried.get(key, 0))

    def limit_device(self, fraction_of_card: float | None) -> None:
        """Emulate a card of fraction_of_card x this card's total (NVML's, as the tuner's limit is computed) for
        the whole process; None lifts a cap a warm worker's earlier trial set."""
        if self.device != "cuda":
            return
        total = self._view.card_total()
        if fraction_of_card is None or total is None:
            self._card_bytes = None
            self.cuda.set_per_process_memory_fraction(fraction_of_card or 1.0, self.local_rank)
            return
        self._card_bytes = int(fraction_of_card * total)
        self._apply_cap()

    def _apply_cap(self) -> None:
        if self._card_bytes is None:
            return
        _free, cuda_total = self.cuda.mem_get_info(self.local_rank)
        outside = self._outside_now() or 0
        self._outside = max(self._outside or 0, outside)
        fraction = allocator_fraction(self._card_bytes, self._outside, int(cuda_total))
        self.cuda.set_per_process_memory_fraction(fraction, self.local_rank)

    def _outside_now(self) -> int | None:
        own = self.process_device_bytes()
        if own is None:
            return None
        return max(0, own - int(self.cuda.memory_reserved(self.local_rank)))

    def sample(self) -> None:
        """At a step end: the process's figure, and what lives outside the allocator now (NCCL's buffers and
        cuBLAS's kernels arrive with the first collective and matmul, so an emulated card's cap follows them)."""
        if self.device != "cuda":
            return
        self._sampler.offer(self.process_device_bytes())
        outside = self._outside_now()
        if outside is not None:
            self._outside = max(self._outside or 0, outside)
        if self._card_bytes is not None:
            self._apply_cap()

    def metrics(self, rank: int) -> RankMetrics:
        measured = self._measured(rank)  # before the sites are worked out: that costs host memory of its own
        if self._sites is None:
            return measured
        sites, self._sites = self._sites.finish(), None
        return dataclasses.replace(measured, peak_sites=sites)

    def so_far(self, rank: int) -> RankMetrics:
        """The peaks up to now, the trial still running (the sampler keeps sampling): what the stop over the limit
        after warm-up judges (trial/worker/train_steps.py timed_steps)."""
        return self._measured(rank, stop_sampler=False)

    def _measured(self, rank: int, stop_sampler: bool = True) -> RankMetrics:
        self.sample()
        if stop_sampler:
            self._sampler.stop()
        micro_peak, smaller_micro_peak = self._phase_peaks.get("micro"), self._phase_peaks.get("smaller_micro")
        if self.device != "cuda":
            return RankMetrics(
                rank=rank,
                host_rss_peak_bytes=self._peak("host", host_rss_peak_bytes()),
                micro_peak_bytes=micro_peak,
                smaller_micro_peak_bytes=smaller_micro_peak,
                host_peak_reset=self.host_peak_reset,
            )
        max_reserved = self._peak("reserved", int(self.cuda.max_memory_reserved(self.local_rank)))
        readings = [self._sampler.peak]
        if self._outside is not None:
            readings.append(max_reserved + self._outside)
        known = [r for r in readings if r is not None]
        return RankMetrics(
            rank=rank,
            max_allocated_bytes=self._peak("allocated", int(self.cuda.max_memory_allocated(self.local_rank))),
            max_reserved_bytes=max_reserved,
            device_used_bytes=max(known) if known else None,
            host_rss_peak_bytes=self._peak("host", host_rss_peak_bytes()),
            device_used_baseline_bytes=self._baseline_used,
            device_outside_allocator_bytes=self._outside,
            device_sampled_peak_bytes=self._sampler.peak,
            device_memory_source=self.source(),
            emulated_card_bytes=self._card_bytes,
            micro_peak_bytes=micro_peak,
            smaller_micro_peak_bytes=smaller_micro_peak,
            allocator_settings=allocator_settings(),
            host_peak_reset=self.host_peak_reset,
        )
