"""Boundary types of the memory model: what `estimate` and `plan` take and return."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from autotune.core.choices import Attention, Device, Kernels, Precision
from autotune.core.ladder import Candidate
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.runtime import RuntimeStack


@dataclass(frozen=True, kw_only=True)
class EstimateSettings:
    seq_len: int
    precision: Precision = "bf16"
    attention: Attention = "sdpa"  # "eager" materialises the s^2 score matrix
    device: Device = "cuda"  # "cuda": GPU quantities; "cpu": the CPU backend, where everything is host memory
    reduce_bucket_elements: int = 200_000_000  # what autotune.dsconfig.build_config emits for stages 1-2
    knobs: ZeroKnobs = field(default_factory=ZeroKnobs)  # ds_config values that size buffers (default: dsconfig's)
    stack: RuntimeStack = field(default_factory=RuntimeStack)  # as probed; unknown fields widen the margin
    optimizer: str = "adamw"  # an autotune.training.optimizers name: its states and step temporaries
    decoder_seq_len: int | None = None  # encoder-decoder models: the decoder's length; None: seq_len for both
    kernels: Kernels = "stock"  # fused training kernels in use (estimate/kernels.py)
    native_pinning: bool = False  # DS_PIN_MEMORY_BACKEND=native: pin_memory mlocks (estimate/pinned.py)


def checkpointing_setting(grad_checkpointing: bool) -> str:
    """The name of a checkpointing setting, as a candidate's key spells it ('z2/mb4/ckpt')."""
    return "ckpt" if grad_checkpointing else "nockpt"


def setting_of_key(key: str) -> str:
    """The checkpointing setting of a candidate key: 'z2/mb4/ckpt' -> 'ckpt'."""
    return key.split("/")[2]


@dataclass
class Calibration:
    """Corrections learned from measured trials; identity by default.

    The tuner updates it after each successful trial so later predictions need fewer trials.
    """

    # Multiplies the activation, logits and backward-window bytes: one slope per checkpointing setting
    # (checkpointing_setting), each fitted on its own setting's trials (estimate/calibration.py says why); see
    # activation_scale for a setting not measured yet. Reports written before kept one pooled "activation_scale";
    # a report holds its calibration as the free dict it was written as (report/data.py), so both read back.
    activation_scales: dict[str, float] = field(default_factory=dict)
    overhead_bytes: int = 0  # added to the fixed part (context, allocator, runtime), whatever the checkpointing
    samples: int = 0  # how many trials informed it
    # One entry per measured candidate (latest wins): {"key", "fixed", "variable", "measured"} in bytes,
    # the uncalibrated prediction split into its micro-batch-independent and -dependent parts.
    observations: list[dict] = field(default_factory=list)
    # One entry per candidate that ran out of memory: {"key", "fixed", "variable", "limit"} in bytes. Its true
    # peak was above `limit`, a lower bound the calibrated prediction is kept above (calibrate_oom).
    oom_bounds: list[dict] = field(default_factory=list)

    def activation_scale(self, grad_checkpointing: bool) -> float:
        """The activation slope for candidates with (or without) gradient checkpointing. Before any trial of that
        setting, the other setting's: it and the offset were fitted together as one line, so the offset alone does
        not describe the other setting, and what both settings share (the logits, the allocator's fragmentation,
        memory the model does not know of) is in it. 1, the uncalibrated model's, before any trial at all."""
        own = self.activation_scales.get(checkpointing_setting(grad_checkpointing))
        other = self.activation_scales.get(checkpointing_setting(not grad_checkpointing), 1.0)
        return own if own is not None else other

    def measured(self, grad_checkpointing: bool) -> bool:
        """Whether a trial of this checkpointing setting ran and gave a peak: its activation slope was then fitted on
        a measurement, not borrowed from the other setting nor only lifted by an OOM's lower bound."""
        setting = checkpointing_setting(grad_checkpointing)
        return any(setting_of_key(o["key"]) == setting for o in self.observations)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MemoryEstimate:
    candidate: Candidate
    gpu_peak_bytes: int  # per GPU, as the device shows it (CPU backend: per-rank host RSS)
    host_ram_bytes: int  # per node
    nvme_bytes: int  # per node
    gpu_components: dict[str, int] = field(default_factory=dict)
    host_components: dict[str, int] = field(default_factory=dict)
    device: Device = "cuda"  # EstimateSettings.device it was made for: "cpu" means gpu_* fields are per-rank RSS
    deepspeed_estimate_bytes: int = 0  # what DeepSpeed's model-states estimator alone says per GPU
    nvme_components: dict[str, int] = field(default_factory=dict)
    # How far the true peak may be above gpu_peak_bytes, per component (bytes); "fits" needs peak + margin.
    gpu_uncertainty: dict[str, int] = field(default_factory=dict)
    # What a run with room to spare shows on top of gpu_peak_bytes (nvidia-smi, max_memory_reserved): the caching
    # allocator keeps more cached when it is not pressed. Not needed to fit; used to compare with such figures.
    gpu_unpressured_extra_bytes: int = 0
    mlocked_bytes_per_rank: int = 0  # what one rank locks with mlock: limited by RLIMIT_MEMLOCK (estimate/pinned.py)

    @property
    def gpu_margin_bytes(self) -> int:
        return sum(self.gpu_uncertainty.values())

    def to_dict(self) -> dict:
        data = asdict(self)
        data["candidate"] = self.candidate.to_dict()
        data["gpu_margin_bytes"] = self.gpu_margin_bytes
        return data


@dataclass(frozen=True)
class Verdict:
    fits: bool
    reason: str  # "" when it fits; else e.g. "GPU peak 91.2 GiB > 72.0 GiB (90% of 80.0 GiB free)"
    shortfall_bytes: int = 0  # how much over the tightest limit it is (0 when it fits)
    limit: str = ""  # the limit furthest over: "gpu", "host", "memlock", "nvme", "nvme_unknown" or "global_batch"
