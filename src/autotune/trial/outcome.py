"""From exceptions, exit codes and rank reports to one TrialResult.

Runs in the worker (classify_exception) and in the parent (everything else); imports no torch, so the
tuner's process stays free of CUDA.
"""

from __future__ import annotations

import re
import signal
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeGuard

from autotune.core.units import format_bytes
from autotune.trial.rank_report import RankReport
from autotune.trial.throughput import FlopsPerToken, throughput
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec, TrialStatus

# Every allocation failure on the GPU side is an OOM, whichever library hit it. Texts and where they come from:
_GPU_OOM_MESSAGES = (
    "cuda out of memory",  # torch.OutOfMemoryError from the caching allocator (c10/cuda/CUDACachingAllocator.cpp)
    "cuda error: out of memory",  # C10_CUDA_CHECK on cudaErrorMemoryAllocation (c10/cuda/CUDAException.cpp)
    # C10_CUDA_DRIVER_CHECK: "CUDA driver error: " + cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY), which is
    # "out of memory" (torch/include/c10/cuda/driver_api.h:19, ATen/cuda/Exceptions.h:193): expandable segments'
    # cuMemCreate, NVLS/symmetric memory
    "cuda driver error: out of memory",
    "cudaerrormemoryallocation",  # the CUDA runtime's enum name, printed by some extensions
    # cuBLAS: "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" (torch's
    # TORCH_CUDABLAS_CHECK in ATen/cuda/Exceptions.h; cublasLt handles the same way)
    "cublas_status_alloc_failed",
    # cuDNN: "cuDNN error: CUDNN_STATUS_ALLOC_FAILED" (torch's AT_CUDNN_CHECK, ATen/cudnn/Exceptions.h; the
    # status name from cudnnGetErrorString)
    "cudnn_status_alloc_failed",
    "cusolver_status_alloc_failed",  # torch's TORCH_CUSOLVER_CHECK (ATen/cuda/Exceptions.h)
    # NCCL's own allocator: WARN("Failed to CUDA calloc %ld bytes", ...) and "Failed to CUDA calloc async %ld
    # bytes" (NCCL src/include/alloc.h, ncclCudaCalloc / ncclCudaCallocAsync), logged before torch's
    # "ncclUnhandledCudaError" DistBackendError
    "failed to cuda calloc",
    "hip out of memory",  # ROCm builds of the messages above
    "hip error: out of memory",
    "hiperroroutofmemory",
)
# NCCL/RCCL: a failed cudaMalloc/cuMemCreate inside NCCL is logged by NCCL's CUDACHECK/CUCHECK
# (src/include/checks.h: WARN("Cuda failure %d '%s'", err, errStr)) and torch appends NCCL's last error to
# its DistBackendError ("NCCL error in: ...ProcessGroupNCCL.cpp..., unhandled cuda error ...
# ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure 2 'out of memory'");
# 2 is cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY. Older NCCL: "Cuda failure 'out of memory'".
_NCCL_OOM = re.compile(r"cuda failure (?:\d+ )?'out of memory'")
_HOST_OOM_MESSAGES = ("defaultcpuallocator: can't allocate memory", "std::bad_alloc")
# A pinned (page-locked) host buffer comes from cudaHostAlloc in torch's CachingHostAllocator
# (ATen/cuda/CachingHostAllocator.cpp allocate_host_memory: C10_CUDA_CHECK(cudaHostAlloc(...))), so its failure
# reads "CUDA error: out of memory" like a device one. It is told apart by where it was raised: Tensor.pin_memory()
# or an allocation with pin_memory=True (DeepSpeed's pinned offload buffers go through
# accelerator/cuda_accelerator.py `pin_memory`: `return tensor.pin_memory()`), or, with
# TORCH_SHOW_CPP_STACKTRACES, the host allocator's C++ frames. It is a host limit (RAM, RLIMIT_MEMLOCK), not GPU memory.
_PINNED_PATH_MARKERS = ("pin_memory", "cudahostalloc", "cachinghostallocator", "cudahostregister")
PINNED_HOST_FAILURE = "pinned host allocation failed (page-locked host memory: host RAM or `ulimit -l`)"
# DeepSpeed's native pinned allocator (DS_PIN_MEMORY_BACKEND=native, and the NVMe swap buffers) locks with mlock and
# on failure prints "mlock failed to allocate <n> bytes with error no <e> msg <strerror>" (deepspeed 0.19.8
# ops/csrc/pin_memory/page_alloc.cpp:25-28), then asserts `nullptr != pinned_buffer` and aborts
# (deepspeed_pin_tensor.cpp:47-48). Under a locked-memory limit (ulimit -l, no CAP_IPC_LOCK) a rerun aborts the
# same way: a verdict about the candidate on this machine, never retried (issue 46: it was called inconclusive and
# run twice, 6 min each at load 13).
_MLOCK_FAILURE = re.compile(r"mlock failed to allocate \d+ bytes[^\n]*|Assertion [`'\"]?nullptr != pinned_buffer[^\n]*")
LOCKED_MEMORY_FAILURE = "locked-memory limit (`ulimit -l`, RLIMIT_MEMLOCK): DeepSpeed's mlock failed"
# Failures that say nothing about the candidate: the network, the rendezvous, the file system, a signal from
# outside. Torch's rendezvous and store raise DistNetworkError/DistStoreError (torch/distributed/__init__.py);
# gloo's TCP transport says "Connection closed by peer" / "Connection reset by peer"
# (third_party/gloo/gloo/transport/tcp/pair.cc).
_INCONCLUSIVE_TYPES = ("DistNetworkError", "DistStoreError")
_INCONCLUSIVE_TEXTS = (
    "connection closed by peer",
    "connection reset by peer",
    "connection refused",
    "no space left on device",  # ENOSPC
    "disk quota exceeded",  # EDQUOT
    "no such file or directory",  # ENOENT: a temp file or log removed under the trial (tmp cleaners)
    "broken pipe",
)
_INCONCLUSIVE_LINE = re.compile(
    r"^(?:[\w]+\.)*(?:OSError|IOError|ConnectionError|ConnectionResetError|ConnectionRefusedError|"
    r"ConnectionAbortedError|BrokenPipeError|TimeoutError|FileNotFoundError|DistNetworkError|DistStoreError)\b"
)
# Root cause first: a rank that ran out of memory makes its peers fail with connection errors, and a rank that
# died unexplained makes its peers raise whatever they raise (which says nothing about the candidate).
_STATUS_PRIORITY: tuple[TrialStatus, ...] = ("oom_gpu", "oom_host", "over_budget", "inconclusive", "error")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?$")
_LAUNCHER_NOISE = ("ChildFailedError", "SignalException")


def is_gpu_oom_text(text: str) -> bool:
    """Whether an error text (any case, any number of lines) reports a GPU-side allocation failure."""
    lowered = text.lower()
    return any(m in lowered for m in _GPU_OOM_MESSAGES) or bool(_NCCL_OOM.search(lowered))


def is_host_oom_text(text: str) -> bool:
    lowered = text.lower()
    return lowered.lstrip().startswith("memoryerror") or any(m in lowered for m in _HOST_OOM_MESSAGES)


def oom_status(text: str, raised_in: str = "") -> TrialStatus | None:
    """The out-of-memory class an error text names, or None: the one matcher for our workers and own commands.

    `raised_in`: where it was raised (traceback frames and their source lines), which tells a failed pinned host
    allocation from a device one.
    """
    if is_gpu_oom_text(text):
        return "oom_host" if is_pinned_path(raised_in + "\n" + text) else "oom_gpu"
    return "oom_host" if is_host_oom_text(text) else None


def is_pinned_path(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in _PINNED_PATH_MARKERS)


def is_inconclusive_text(text: str) -> bool:
    """A network, rendezvous or file-system failure: transient, or the machine's, not the candidate's."""
    lowered = text.lower()
    return bool(_INCONCLUSIVE_LINE.match(text.strip())) or any(m in lowered for m in _INCONCLUSIVE_TEXTS)


def _gpu_oom_line(text: str) -> str | None:
    """The line of a log or message that names the GPU allocation failure."""
    for line in text.splitlines():
        if is_gpu_oom_text(line):
            return line.strip()
    return None


def _traceback_text(error: BaseException) -> str:
    """Function names and source lines of the frames an exception passed through."""
    frames = traceback.extract_tb(error.__traceback__)
    return "\n".join(f"{frame.name}: {frame.line or ''}" for frame in frames)


def classify_exception(error: BaseException) -> tuple[TrialStatus, str]:
    """Status and first meaningful line of an exception raised inside a rank (causes included)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for item in chain:
        message = str(item)
        if type(item).__name__ == "OutOfMemoryError" or is_gpu_oom_text(message):
            line = exception_line(item)
            named = _gpu_oom_line(message)
            line = line if named is None or named.lower() in line.lower() else f"{line} ({named})"
            if is_pinned_path(_traceback_text(item) + "\n" + message):
                return "oom_host", f"{PINNED_HOST_FAILURE}: {line}"
            return "oom_gpu", line
        if isinstance(item, MemoryError) or is_host_oom_text(message):
            return "oom_host", exception_line(item)
    for item in chain:
        if isinstance(item, OSError) or type(item).__name__ in _INCONCLUSIVE_TYPES or is_inconclusive_text(str(item)):
            return "inconclusive", exception_line(item)
    return "error", exception_line(error)


def classify_line(line: str, raised_in: str = "") -> TrialStatus:
    """Status of an error line read back from a log, for ranks that died before writing a report."""
    lowered = line.lower()
    if lowered.startswith(("outofmemoryerror", "torch.outofmemoryerror")):
        return "oom_host" if is_pinned_path(raised_in) else "oom_gpu"
    if status := oom_status(line, raised_in):
        return status
    return "inconclusive" if is_inconclusive_text(line) else "error"


def traceback_before(log_text: str, line: str) -> str:
    """The traceback block that ends in `line` (from its "Traceback (most recent call last):"), or ''."""
    lines = log_text.splitlines()
    for end, raw in enumerate(lines):
        if raw.strip().endswith(line.strip()):
            start = end
            while start > 0 and "Traceback (most recent call last)" not in lines[start]:
                start -= 1
            return "\n".join(lines[start:end])
    return ""


def exception_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def first_error_line(log_text: str) -> str | None:
    """The first `SomeError: message` line of a log, i.e. the root cause of a traceback chain."""
    for raw in log_text.splitlines():
        line = raw.strip()
        line = re.sub(r"^\[(?:rank|default)\d+\]:\s*", "", line)  # torchrun --tee prefixes
        if _EXCEPTION_LINE.match(line) and not any(noise in line for noise in _LAUNCHER_NOISE):
            return line
    return None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def is_sigkill(code: int | None) -> bool:
    """SIGKILL seen directly (-9) or through a shell or launcher (128 + 9)."""
    return code in (-signal.SIGKILL, 128 + signal.SIGKILL)


def is_sigterm(code: int | None) -> bool:
    """SIGTERM seen directly (-15) or through a shell or launcher (128 + 15): how launchers stop survivors."""
    return code in (-signal.SIGTERM, 128 + signal.SIGTERM)


def killed_by_signal(code: int | None) -> TypeGuard[int]:
    """Death by a signal, seen directly (negative) or through a shell or launcher (128 + n)."""
    return code is not None and (code < 0 or 128 < code < 128 + 65)


def unexplained_signal(code: int, evidence: str | None) -> tuple[TrialStatus, str]:
    """A death by signal: an OOM only with the kernel's word for it, otherwise inconclusive."""
    how = describe_exit(code if code < 0 else -(code - 128))
    if is_sigkill(code) and evidence:
        return "oom_host", f"{how}: the kernel's OOM killer ({evidence})"
    return "inconclusive", (
        f"{how} with no out-of-memory evidence (no allocator message, budget breach, cgroup oom_kill or kernel"
        " OOM record): from outside or a crash, not a memory verdict"
    )


@dataclass(frozen=True)
class BudgetBreach:
    rank: int
    rss_bytes: int
    budget_bytes: int

    def message(self) -> str:
        return (
            f"rank {self.rank} host RSS peak {format_bytes(self.rss_bytes)} exceeds the host-memory budget of "
            f"{format_bytes(self.budget_bytes)} (an enforced cap, not a real out-of-memory)"
        )


@dataclass(frozen=True, kw_only=True)
class LaunchOutcome:
    """What the launcher saw, besides the rank reports."""

    ranks: range  # the ranks this launcher is responsible for
    wall_s: float
    timed_out: bool = False
    budget_breach: BudgetBreach | None = None  # seen by the parent's sampler, trial stopped early
    exit_codes: dict[int, int] = field(default_factory=dict)  # per rank where known; negative = signal
    logs: dict[int, Path] = field(default_factory=dict)  # per-rank logs
    launcher_log: Path | None = None
    oom_evidence: str | None = None  # trial/launch/oom_evidence.py: why a SIGKILL would be the OOM killer's


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _missing_rank_failure(rank: int, outcome: LaunchOutcome) -> tuple[TrialStatus, str]:
    code = outcome.exit_codes.get(rank)
    rank_log, launcher_log = _read(outcome.logs.get(rank)), _read(outcome.launcher_log)
    logs = rank_log + "\n" + launcher_log
    if oom := _gpu_oom_line(logs):  # the allocation failure may sit lines below the exception (NCCL's last error)
        raised_in = traceback_before(logs, oom)
        if is_pinned_path(raised_in + "\n" + oom):
            return "oom_host", f"{PINNED_HOST_FAILURE}: {oom}"
        return "oom_gpu", oom
    if locked := _MLOCK_FAILURE.search(logs):  # before the signal: the assertion's abort is its consequence
        return "oom_host", f"rank {rank} {LOCKED_MEMORY_FAILURE}: {locked.group(0).strip()}"
    if killed_by_signal(code):  # whatever it printed before, the signal ended it
        status, why = unexplained_signal(code, outcome.oom_evidence)
        return status, f"rank {rank} {why}"
    line = first_error_line(rank_log) or first_error_line(launcher_log)
    if line:
        return classify_line(line, traceback_before(logs, line)), line
    how = describe_exit(code) if code is not None else "exited"
    return "inconclusive", f"rank {rank} {how} without writing a result or an error line{_disk_note(outcome)}"


MIN_FREE_BYTES = 1 << 20  # below a MiB free, a rank cannot write its report (a few KiB) and its log reliably


def _disk_note(outcome: LaunchOutcome) -> str:
    """Our worker writes a report for every failure it can see (trial/worker/main.py), so a rank that left neither a
    report nor an error line met something outside the candidate (issue 46: TMPDIR filled 6 s into the trial,
    both trials were called errors and cached, and the rerun never measured them): inconclusive, retried once,
    never cached. Where the trial's directory is (nearly) full, say so."""
    import shutil

    folders = {path.parent for path in (*outcome.logs.values(), outcome.launcher_log) if path is not None}
    for folder in sorted(folders):
        try:
            free = shutil.disk_usage(folder).free
        except OSError:
            continue
        if free < MIN_FREE_BYTES:
            return f" (no space left on device: {format_bytes(free)} free under {folder})"
    return " (nothing about the candidate: a full disk, a removed file or a process killed from outside)"


def _budget_breach(spec: TrialSpec, reports: dict[int, RankReport]) -> BudgetBreach | None:
    budget = spec.host_memory_budget_bytes
    if spec.device != "cpu" or not budget:
        return None
    for rank, report in sorted(reports.items()):
        peak = report.memory.host_rss_peak_bytes if report.memory else None
        if peak and peak > budget:
            return BudgetBreach(rank, peak, budget)
    return None


def _failure(spec: TrialSpec, reports: dict[int, RankReport], outcome: LaunchOutcome) -> tuple[TrialStatus, str] | None:
    # The parent stopped these trials itself: exit codes and missing reports are its own doing.
    if outcome.timed_out:
        return "timeout", f"no result within the {spec.timeout_s:g} s trial timeout; all trial processes killed"
    if outcome.budget_breach:
        return "over_budget", outcome.budget_breach.message()
    failures: list[tuple[int, TrialStatus, str]] = []  # (how much of a consequence, status, message)
    breach = _budget_breach(spec, reports)
    if breach:
        failures.append((_CAUSE, "over_budget", breach.message()))
    for rank in outcome.ranks:  # ranks that said why they failed come before ranks that just vanished
        report = reports.get(rank)
        if report is not None and report.status != "ok":
            error = report.error or f"rank {rank} failed"
            failures.append((_PEER_LOST if is_inconclusive_text(error) else _CAUSE, report.status, error))
    for rank in outcome.ranks:
        if rank not in reports:
            stopped = is_sigterm(outcome.exit_codes.get(rank))
            failures.append((_STOPPED if stopped else _CAUSE, *_missing_rank_failure(rank, outcome)))
    if not failures:
        return None
    _, status, message = min(failures, key=_root_cause_first)
    return status, message


# A failed rank takes its peers down with it: their collectives lose the connection, and the launcher (torchrun,
# srun) SIGTERMs the survivors. Those are consequences, named only when nothing else failed.
_CAUSE, _PEER_LOST, _STOPPED = 0, 1, 2


def _root_cause_first(failure: tuple[int, TrialStatus, str]) -> tuple[bool, int, int]:
    """Sort key: ranks the launcher stopped last, then by status priority, then lost connections after the rest.

    A rank SIGKILLed mid-step under torch 2.13's torchrun leaves its peer SIGTERMed (torchrun's "Failures" table)
    or raising "Connection closed by peer" in gloo: both inconclusive like the death itself, so the status alone
    would name the peer and hide which rank died."""
    consequence, status, _ = failure
    priority = _STATUS_PRIORITY.index(status) if status in _STATUS_PRIORITY else 99
    return consequence == _STOPPED, priority, consequence


def _slowest_phases(reports: dict[int, RankReport]) -> dict[str, float]:
    phases: dict[str, float] = {}
    for report in reports.values():
        for name, seconds in report.phases.items():
            phases[name] = max(phases.get(name, 0.0), seconds)
    return phases


def _startup_s(phases: dict[str, float]) -> float | None:
    if "warmup" not in phases:
        return None
    before_first_step = list(phases)[: list(phases).index("warmup")]
    return sum(phases[name] for name in before_first_step)


def build_result(spec: TrialSpec, reports: dict[int, RankReport], outcome: LaunchOutcome) -> TrialResult:
    ranks = [
        report.memory or RankMetrics(rank=rank) for rank, report in sorted(reports.items()) if rank in outcome.ranks
    ]
    phases = _slowest_phases(reports)
    # a GPU rank without an NVML figure: its peak adds the predicted context and NCCL buffers (TrialResult)
    no_nvml = spec.device == "cuda" and any(r.device_used_bytes is None for r in ranks)
    estimate = spec.predicted_outside_allocator_bytes if no_nvml else None
    result = partial(
        TrialResult, ranks=ranks, wall_s=outcome.wall_s, phases=phases, startup_s=_startup_s(phases),
        outside_allocator_estimate_bytes=estimate,
        first_in_process=bool(reports) and all(r.trial_in_process == 0 for r in reports.values()),
    )  # fmt: skip
    failure = _failure(spec, reports, outcome)
    if failure is not None:
        status, error = failure
        return result(status=status, error=error)
    first = reports[min(reports)]
    if any(step <= 0 for step in first.step_times_s):
        # a wrong step time must never become a speed (a negative one once made ZenFlow look 50x faster)
        shown = ", ".join(f"{step:.3g}" for step in first.step_times_s)
        return result(status="error", error=f"non-positive step time measured ({shown} s)")
    flops = None
    if first.hardware_flops_per_token and first.model_flops_per_token:
        flops = FlopsPerToken(hardware=first.hardware_flops_per_token, model=first.model_flops_per_token)
    rates = throughput(
        first.step_times_s,
        first.train_batch_size or 0,
        spec.seq_len,
        spec.world_size,
        flops=flops,
        peak_tflops=spec.peak_tflops,
    )
    if rates is None:
        return result(status="error", error="the trial measured no step")
    return result(
        status="ok",
        step_times_s=list(first.step_times_s),
        micro_step_s=first.micro_step_s,
        optimizer_step_s=first.optimizer_step_s,
        accumulation=first.accumulation,
        smaller_micro_batch=first.smaller_micro_batch,
        smaller_micro_step_s=first.smaller_micro_step_s,
        smaller_step_s=first.smaller_step_s,
        samples_per_s=rates.samples_per_s,
        tokens_per_s=rates.tokens_per_s,
        tflops_per_gpu=rates.tflops_per_gpu,
        mfu=rates.mfu,
        engine_facts=dict(first.engine_facts),
    )
