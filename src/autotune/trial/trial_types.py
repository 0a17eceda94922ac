"""Boundary types of the trial runner: one real DeepSpeed run of one candidate config."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

from autotune.core.measurement import MAX_MEASURE_S, MAX_STEPS

# "incomplete": an own-command trial (trial/own_command/script.py) that exited before the profiled steps.
# "inconclusive": the trial failed for a reason that says nothing about the candidate (a signal from outside or a
# crash with no out-of-memory evidence, a file-system or network/rendezvous failure): never cached, retried once,
# never used to recalibrate the memory model (trial/outcome.py).
TrialStatus = Literal["ok", "oom_gpu", "oom_host", "over_budget", "timeout", "error", "incomplete", "inconclusive"]
# Outcomes that a rerun of the same candidate on the same machine would give again: the only ones the results
# cache keeps. A timeout may be the budget, not the config; an inconclusive failure is not the config's.
DETERMINISTIC_STATUSES: tuple[TrialStatus, ...] = ("ok", "oom_gpu", "oom_host", "over_budget", "error", "incomplete")
# The device-memory sampler's period (trial/worker/memory.py PeakSampler): a choice, not a measurement. A training step
# of
# the sizes tuned lasts 0.1-10 s and the blocks behind its peak (activations, gathered ZeRO-3 parameters, optimizer
# temporaries) live for at least a layer's kernels; the thread holds the GIL only between NVML calls (ctypes
# releases it during them). Its cost to a step is not measured yet: the GPU lease times one ZeRO-3 point at 10 ms
# and at 1 s (benchmarks/gpu/points.py SAMPLER_POINT).
SAMPLE_PERIOD_S = 0.01


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    model_config: dict  # HF config.json content, model_type included
    architecture: str  # transformers class to build, e.g. "GPT2LMHeadModel"
    family: str  # "decoder-only" | "encoder-decoder" | "encoder": shapes the synthetic batch
    ds_config: dict  # complete config; its batch keys hold at nprocs_per_node * nodes
    seq_len: int  # tokens per sample; an encoder-decoder's encoder length
    grad_checkpointing: bool = False
    device: Literal["cuda", "cpu"] = "cuda"
    nprocs_per_node: int = 1
    nodes: int = 1
    warmup_steps: int = 2
    # measured whole optimizer steps: at most max_steps / max_measure_s, fewer once their median is known well
    # enough (autotune.core.measurement.enough_steps)
    max_steps: int = MAX_STEPS
    max_measure_s: float = MAX_MEASURE_S
    timeout_s: float = 600.0
    gpu_memory_fraction: float | None = None  # emulate a smaller card via set_per_process_memory_fraction
    host_memory_budget_bytes: int | None = None  # CPU backend: peak RSS per rank above this is over budget
    peak_tflops: float | None = None  # hardware peak for MFU
    trust_remote_code: bool = False
    smaller_micro_batch: int | None = None  # also time this micro-batch in the same process (second point)
    # The user's global batch is fixed, so the smaller micro-batch would accumulate more micro-steps per optimizer
    # step: its point is built from plain micro-steps and the optimizer's share (trial/worker/train_steps.py)
    fixed_global_batch: bool = False
    optimizer: str = "adamw"  # autotune.training.optimizers name; a client-side one is built by the trial itself
    lora: dict | None = None  # autotune.training.lora.LoraSettings.to_dict() plus "model_type"; None: full fine-tuning
    decoder_seq_len: int | None = None  # encoder-decoders: the decoder's length (labels); None: seq_len
    # ZeRO-3: build under deepspeed.zero.Init, as HF Trainer does; False builds the whole model on the device first
    # and lets the engine partition it, as scripts that build before DeepSpeed starts do
    zero_init: bool = True
    # Record every allocation and report whose memory the peak was (trial/worker/peak_sites.py). Costs host memory and
    # time (on the CPU backend it runs torch.profiler, which inflates RSS): for diagnosis runs, not for tuning.
    record_peak_sites: bool = False
    sample_period_s: float = SAMPLE_PERIOD_S  # the device-memory sampler's period (see SAMPLE_PERIOD_S)
    # What lives outside torch's allocator on each GPU rank as the memory model predicts it (CUDA context + NCCL
    # buffers, estimate/): added to max_reserved where NVML gives no process figure (TrialResult.peak_memory_bytes)
    predicted_outside_allocator_bytes: int | None = None
    # The search's device-memory limit (GPU trials; on the CPU backend the tuner's BudgetWatch stops a trial at its
    # own). A trial whose peak after its warm-up steps is over it on any rank is over the headroom whatever it does
    # next, and its speed would never be used (search/records.py TrialRecord.within_headroom): it stops there, as
    # "over_budget" with that peak (trial/worker/train_steps.py timed_steps), instead of timing steps and parts. Our
    # worker's trials only: a user's own command (trial/own_command/) runs as it is written.
    stop_over_bytes: int | None = None

    @property
    def world_size(self) -> int:
        return self.nprocs_per_node * self.nodes

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RankMetrics:
    rank: int
    max_allocated_bytes: int | None = None
    max_reserved_bytes: int | None = None
    # This rank's own device memory at its peak (trial/worker/memory.py): allocator plus CUDA context, NCCL buffers and
    # kernels; never other tenants' memory or the driver's reservation (the limit it is compared with excludes them)
    device_used_bytes: int | None = None
    host_rss_peak_bytes: int | None = None
    device_used_baseline_bytes: int | None = None  # NVML card used before this rank touched the GPU (other tenants)
    peak_sites: dict | None = None  # TrialSpec.record_peak_sites: trial/peak_sites.PeakSites.to_dict() or {"error"}
    device_outside_allocator_bytes: int | None = None  # own device memory outside torch's allocator, at step ends
    device_sampled_peak_bytes: int | None = None  # the sampler thread's highest own-process reading
    device_memory_source: str | None = None  # "nvml_process" (per-pid list) | "nvml_used_minus_baseline"
    emulated_card_bytes: int | None = None  # TrialSpec.gpu_memory_fraction as bytes: the whole process was capped
    # The peak of the plain micro-steps alone (forward and backward, no optimizer step) at the trial's micro-batch
    # and at the smaller one timed after it (GPU: allocated; CPU: host RSS), each from its own start: their
    # difference is what the micro-batch adds (trial/worker/memory.py MemoryTracker.phase)
    micro_peak_bytes: int | None = None
    smaller_micro_peak_bytes: int | None = None
    # the CUDA allocator's settings this rank ran under (infra/allocator_env.py): a peak is only comparable under them
    allocator_settings: dict[str, str] = field(default_factory=dict)
    # whether VmHWM was reset at the trial's start (trial/worker/memory.py reset_host_rss_peak); False: the host peak
    # may be
    # the process's lifetime high, a warm worker's earlier trials included
    host_peak_reset: bool | None = None


@dataclass(frozen=True)
class TrialResult:
    status: TrialStatus
    error: str | None = None  # first meaningful error line
    ranks: list[RankMetrics] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)  # measured steps, warm-up excluded
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    wall_s: float = 0.0
    startup_s: float | None = None  # launch to first step: process start, imports, init, model build
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, slowest rank: where wall time goes
    # The second point of the step-time line, timed in the same process, all-reduced max over ranks
    # (trial/worker/train_steps.py StepTimes): a whole step at a smaller micro-batch where neither accumulates;
    # otherwise the parts, a plain micro-step at each micro-batch and what an optimizer step adds.
    micro_step_s: float | None = None
    optimizer_step_s: float | None = None
    accumulation: int = 1
    smaller_micro_batch: int | None = None
    smaller_micro_step_s: float | None = None
    smaller_step_s: float | None = None  # or a whole step at it, where neither micro-batch accumulates
    # Every rank's process ran no trial before this one (a fresh launch, or a warm launch's first trial): its memory
    # is a fresh process's, which the pick's confirmation needs (search/pick_decision.py Pick.confirm_fresh). None:
    # not known (results from before this field, own-command trials).
    first_in_process: bool | None = None
    command: list[str] | None = None  # own-command trials (trial/own_command/script.py): the argv the trial ran
    # None: our worker's wall-clock steps; "step_wall_clock": the user's command's own optimizer steps, timed by
    # wall clock at the engine's step boundaries (trial/own_command/script_steps.py); "deepspeed_autotuning": the
    # engine's one
    # profiled step only (a command that ended before enough whole steps)
    metric_source: str | None = None
    profiled_samples_per_s: float | None = None  # own-command trials: the engine's profiled step, secondary
    # Read from the engine after the steps (trial/worker/train_steps.py engine_mode_facts): the ZeRO stage, offload
    # ratio,
    # sub-groups and how many elements the device-side optimizer stepped, so a test sees the mode really ran.
    engine_facts: dict = field(default_factory=dict)
    # TrialSpec.predicted_outside_allocator_bytes, kept where a GPU rank had no NVML figure (peak_memory_bytes adds it)
    outside_allocator_estimate_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def peak_memory_bytes(self) -> int | None:
        """Worst rank's own peak (GPU: its device memory, else max reserved plus the predicted CUDA context and NCCL
        buffers, `outside_allocator_estimate_bytes`; CPU: host RSS). Without NVML, max reserved alone would leave
        out what the next tenant of the card loses outside the allocator: the optimistic direction."""
        values = [v for r in self.ranks if (v := self._rank_peak(r))]
        return max(values) if values else None

    def _rank_peak(self, rank: RankMetrics) -> int | None:
        return rank_peak_bytes(rank, self.outside_allocator_estimate_bytes)

    @property
    def allocator_settings(self) -> dict[str, str]:
        """The CUDA allocator settings the trial ran under (its first rank's; every rank inherits one environment)."""
        return dict(self.ranks[0].allocator_settings) if self.ranks else {}

    @property
    def smaller_peak_point(self) -> tuple[int, int] | None:
        """(smaller micro-batch, its peak) from this one launch: the trial's peak less what its forward/backward
        passes measured between the two micro-batches (memory is linear in the micro-batch, SearchState.peak_line):
        plain micro-steps at both, or where the smaller one runs as whole steps, their forward/backward against a
        warm-up step's after the first (trial/worker/train_steps.py timed_steps). The largest drop over the ranks, so
        a line through this point rises no slower than the truth: a peak outside the forward/backward (an optimizer
        step's) does not grow with the micro-batch, so the line over-predicts above the trial's micro-batch, never
        under."""
        peak = self.peak_memory_bytes
        if not (self.ok and self.smaller_micro_batch and peak):
            return None
        drops = [
            r.micro_peak_bytes - r.smaller_micro_peak_bytes
            for r in self.ranks
            if r.micro_peak_bytes is not None and r.smaller_micro_peak_bytes is not None
        ]
        if not drops or max(drops) <= 0:  # nothing measured apart, or within what the allocator keeps: no slope
            return None
        return self.smaller_micro_batch, peak - max(drops)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrialResult:
        ranks = [RankMetrics(**r) for r in data.get("ranks", [])]
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "ranks"}
        return cls(ranks=ranks, **fields)


class TrialLauncher(Protocol):
    """Runs one trial to completion and leaves no child process behind. Swappable in tests."""

    def run(self, spec: TrialSpec) -> TrialResult: ...


def rank_peak_bytes(rank: RankMetrics, outside_allocator_bytes: int | None) -> int | None:
    """One rank's own peak as the search judges it (TrialResult.peak_memory_bytes; the worker's stop over the limit
    after warm-up, TrialSpec.stop_over_bytes): its device memory, else max reserved plus what lives outside the
    allocator as predicted, else (CPU) its host RSS."""
    if rank.device_used_bytes:
        return rank.device_used_bytes
    if rank.max_reserved_bytes:
        return rank.max_reserved_bytes + (outside_allocator_bytes or 0)
    return rank.host_rss_peak_bytes
