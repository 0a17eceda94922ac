"""From exceptions, exit codes and rank reports to one TrialResult.

Runs in the worker (classify_exception) and in the parent (everything else); imports no torch, so the
tuner's process stays free of CUDA.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from autotune.trial.report import RankReport
from autotune.trial.throughput import FlopsPerToken, throughput
from autotune.trial.types import RankMetrics, TrialResult, TrialSpec, TrialStatus
from autotune.units import format_bytes

# Every allocation failure on the GPU side is an OOM, whichever library hit it. Texts and where they come from:
_GPU_OOM_MESSAGES = (
    "cuda out of memory",  # torch.OutOfMemoryError from the caching allocator (c10/cuda/CUDACachingAllocator.cpp)
    "cuda error: out of memory",  # C10_CUDA_CHECK on cudaErrorMemoryAllocation (c10/cuda/CUDAException.cpp)
    "cudaerrormemoryallocation",  # the CUDA runtime's enum name, printed by some extensions
    # cuBLAS: "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`" (torch's
    # TORCH_CUDABLAS_CHECK in ATen/cuda/Exceptions.h; cublasLt handles the same way)
    "cublas_status_alloc_failed",
    # cuDNN: "cuDNN error: CUDNN_STATUS_ALLOC_FAILED" (torch's AT_CUDNN_CHECK, ATen/cudnn/Exceptions.h; the
    # status name from cudnnGetErrorString)
    "cudnn_status_alloc_failed",
    "cusolver_status_alloc_failed",  # torch's TORCH_CUSOLVER_CHECK (ATen/cuda/Exceptions.h)
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
# Root cause first: a rank that ran out of memory makes its peers fail with connection errors.
_STATUS_PRIORITY: tuple[TrialStatus, ...] = ("oom_gpu", "oom_host", "over_budget", "error")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b(?::.*)?$")
_LAUNCHER_NOISE = ("ChildFailedError", "SignalException")


def is_gpu_oom_text(text: str) -> bool:
    """Whether an error text (any case, any number of lines) reports a GPU-side allocation failure."""
    lowered = text.lower()
    return any(m in lowered for m in _GPU_OOM_MESSAGES) or bool(_NCCL_OOM.search(lowered))


def _gpu_oom_line(text: str) -> str | None:
    """The line of a log or message that names the GPU allocation failure."""
    for line in text.splitlines():
        if is_gpu_oom_text(line):
            return line.strip()
    return None


def classify_exception(error: BaseException) -> tuple[TrialStatus, str]:
    """Status and first meaningful line of an exception raised inside a rank (causes included)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for item in chain:
        message = str(item).lower()
        if type(item).__name__ == "OutOfMemoryError" or is_gpu_oom_text(message):
            line = exception_line(item)
            named = _gpu_oom_line(str(item))
            return "oom_gpu", line if named is None or named.lower() in line.lower() else f"{line} ({named})"
        if isinstance(item, MemoryError) or any(m in message for m in _HOST_OOM_MESSAGES):
            return "oom_host", exception_line(item)
    return "error", exception_line(error)


def classify_line(line: str) -> TrialStatus:
    """Status of an error line read back from a log, for ranks that died before writing a report."""
    lowered = line.lower()
    if lowered.startswith(("outofmemoryerror", "torch.outofmemoryerror")) or is_gpu_oom_text(lowered):
        return "oom_gpu"
    if lowered.startswith("memoryerror") or any(m in lowered for m in _HOST_OOM_MESSAGES):
        return "oom_host"
    return "error"


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
    """SIGKILL seen directly (-9) or through a shell or launcher (128 + 9); the kernel OOM killer's mark."""
    return code in (-signal.SIGKILL, 128 + signal.SIGKILL)


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


@dataclass(frozen=True)
class LaunchOutcome:
    """What the launcher saw, besides the rank reports."""

    ranks: range  # the ranks this launcher is responsible for
    wall_s: float
    timed_out: bool = False
    budget_breach: BudgetBreach | None = None  # seen by the parent's sampler, trial stopped early
    exit_codes: dict[int, int] = field(default_factory=dict)  # per rank where known; negative = signal
    logs: dict[int, Path] = field(default_factory=dict)  # per-rank logs
    launcher_log: Path | None = None


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _missing_rank_failure(rank: int, outcome: LaunchOutcome) -> tuple[TrialStatus, str]:
    code = outcome.exit_codes.get(rank)
    if is_sigkill(code):
        return "oom_host", f"rank {rank} was killed by SIGKILL (exit 137): most likely the host OOM killer"
    logs = _read(outcome.logs.get(rank)) + "\n" + _read(outcome.launcher_log)
    if oom := _gpu_oom_line(logs):  # the allocation failure may sit lines below the exception (NCCL's last error)
        return "oom_gpu", oom
    line = first_error_line(_read(outcome.logs.get(rank))) or first_error_line(_read(outcome.launcher_log))
    if line:
        return classify_line(line), line
    how = describe_exit(code) if code is not None else "exited"
    return "error", f"rank {rank} {how} without writing a result"


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
    failures: list[tuple[TrialStatus, str]] = []
    breach = _budget_breach(spec, reports)
    if breach:
        failures.append(("over_budget", breach.message()))
    for rank in outcome.ranks:  # ranks that said why they failed come before ranks that just vanished
        report = reports.get(rank)
        if report is not None and report.status != "ok":
            failures.append((report.status, report.error or f"rank {rank} failed"))
    failures.extend(_missing_rank_failure(rank, outcome) for rank in outcome.ranks if rank not in reports)
    if not failures:
        return None
    return min(failures, key=lambda f: _STATUS_PRIORITY.index(f[0]) if f[0] in _STATUS_PRIORITY else 99)


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
    common = dict(ranks=ranks, wall_s=outcome.wall_s, phases=phases, startup_s=_startup_s(phases))
    failure = _failure(spec, reports, outcome)
    if failure is not None:
        status, error = failure
        return TrialResult(status=status, error=error, **common)
    first = reports[min(reports)]
    if any(step <= 0 for step in first.step_times_s):
        # a wrong step time must never become a speed (a negative one once made ZenFlow look 50x faster)
        shown = ", ".join(f"{step:.3g}" for step in first.step_times_s)
        return TrialResult(status="error", error=f"non-positive step time measured ({shown} s)", **common)
    flops = None
    if first.hardware_flops_per_token and first.model_flops_per_token:
        flops = FlopsPerToken(hardware=first.hardware_flops_per_token, model=first.model_flops_per_token)
    rates = throughput(
        first.step_times_s, first.train_batch_size or 0, spec.seq_len, spec.world_size, flops, spec.peak_tflops
    )
    if rates is None:
        return TrialResult(status="error", error="the trial measured no step", **common)
    return TrialResult(
        status="ok",
        step_times_s=list(first.step_times_s),
        micro_step_s=first.micro_step_s,
        optimizer_step_s=first.optimizer_step_s,
        accumulation=first.accumulation,
        smaller_micro_batch=first.smaller_micro_batch,
        smaller_micro_step_s=first.smaller_micro_step_s,
        samples_per_s=rates.samples_per_s,
        tokens_per_s=rates.tokens_per_s,
        tflops_per_gpu=rates.tflops_per_gpu,
        mfu=rates.mfu,
        engine_facts=dict(first.engine_facts),
        **common,
    )
