"""Build complete ds_config dicts for candidates, and validate them with DeepSpeed's own parser."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any
from unittest import mock

from autotune.environment import parse_without_device
from autotune.errors import UserError
from autotune.ladder import Candidate

# DeepSpeed's default bucket sizes (element counts, not bytes).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000
DS_DEFAULT_ALLGATHER_BUCKET = 500_000_000
DS_DEFAULT_PREFETCH_BUCKET = 50_000_000
DS_DEFAULT_PERSISTENCE_THRESHOLD = 100_000
DS_DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class TrainSettings:
    """Everything besides the candidate that shapes the emitted config."""

    world_size: int
    precision: str = "bf16"  # "bf16" | "fp16" | "fp32"
    global_batch: int | None = None
    hidden_size: int | None = None  # sizes the stage-3 buckets the way HF's "auto" does
    nvme_path: str | None = None
    learning_rate: float = 1e-4
    gradient_clipping: float = 1.0
    bucket_elements: int = 200_000_000  # stages 1-2 reduce/allgather bucket, elements


def gradient_accumulation(global_batch: int | None, micro_batch: int, world_size: int) -> int | None:
    """Steps that keep the effective batch at global_batch; None when it is not a whole number."""
    if global_batch is None:
        return 1
    per_step = micro_batch * world_size
    if global_batch % per_step:
        return None
    return global_batch // per_step


def stage3_buckets(hidden_size: int | None) -> dict[str, int]:
    """Model-sized stage-3 buckets, as HF Trainer's "auto" fills them (hidden^2 based)."""
    if not hidden_size:
        return {
            "reduce_bucket_size": DS_DEFAULT_REDUCE_BUCKET,
            "stage3_prefetch_bucket_size": DS_DEFAULT_PREFETCH_BUCKET,
            "stage3_param_persistence_threshold": DS_DEFAULT_PERSISTENCE_THRESHOLD,
        }
    return {
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }


def zero_section(candidate: Candidate, settings: TrainSettings) -> dict[str, Any]:
    rung = candidate.rung
    stage = rung.stage
    zero: dict[str, Any] = {"stage": stage}
    if stage in (1, 2):
        zero.update(
            overlap_comm=True,
            contiguous_gradients=True,
            reduce_scatter=True,
            reduce_bucket_size=settings.bucket_elements,
            allgather_bucket_size=settings.bucket_elements,
        )
    if stage == 3:
        zero.update(overlap_comm=True, contiguous_gradients=True, **stage3_buckets(settings.hidden_size))
        zero.update(stage3_max_live_parameters=DS_DEFAULT_MAX_LIVE_PARAMETERS, stage3_max_reuse_distance=1_000_000_000)
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    for section, device in (("offload_optimizer", rung.offload_optimizer), ("offload_param", rung.offload_param)):
        if device is None:
            continue
        zero[section] = {"device": device, "pin_memory": True}
        if device == "nvme":
            zero[section]["nvme_path"] = settings.nvme_path or "/local_nvme"
    return zero


def build_ds_config(candidate: Candidate, settings: TrainSettings) -> dict[str, Any]:
    """A complete config whose batch arithmetic holds at settings.world_size."""
    accumulation = gradient_accumulation(settings.global_batch, candidate.micro_batch, settings.world_size)
    if accumulation is None:
        raise UserError(
            f"global batch {settings.global_batch} is not a multiple of micro-batch {candidate.micro_batch}"
            f" x world size {settings.world_size}"
        )
    config: dict[str, Any] = {
        "train_batch_size": candidate.micro_batch * accumulation * settings.world_size,
        "train_micro_batch_size_per_gpu": candidate.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": settings.gradient_clipping,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": settings.learning_rate, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        },
        "zero_optimization": zero_section(candidate, settings),
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if settings.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif settings.precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if candidate.rung.needs_nvme:
        config["aio"] = {
            "block_size": 1_048_576,
            "queue_depth": 8,
            "single_submit": False,
            "overlap_events": True,
            "thread_count": 1,
        }
    return config


_HF_AUTO_ZERO_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def hf_variant(config: dict[str, Any]) -> dict[str, Any]:
    """The same config with "auto" wherever HF Trainer / Accelerate fill the value from TrainingArguments."""
    hf = copy.deepcopy(config)
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
    ):
        hf[key] = "auto"
    hf["optimizer"]["params"] = {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
    hf["scheduler"] = {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    }
    for precision in ("bf16", "fp16"):
        if precision in hf:
            hf[precision]["enabled"] = "auto"
    zero = hf["zero_optimization"]
    for key in _HF_AUTO_ZERO_KEYS:
        if key in zero and zero.get("stage") == 3:
            zero[key] = "auto"
    return hf


class ConfigRejected(Exception):
    """DeepSpeed's own parser refused the config."""


def validate_with_deepspeed(config: dict[str, Any], world_size: int) -> None:
    """Run DeepSpeedConfig on `config` as if `world_size` ranks existed; raise ConfigRejected on refusal.

    DeepSpeed reads the world size from its comm module when parsing; we patch it, since no process
    group exists in the tuner.
    """
    parse_without_device()  # parsing needs no device; never touch CUDA here
    from deepspeed.runtime import config as ds_config_module

    try:
        with (
            mock.patch.object(ds_config_module.dist, "get_world_size", return_value=world_size),
            mock.patch.object(ds_config_module.dist, "get_rank", return_value=0),
            mock.patch.object(ds_config_module.dist, "is_initialized", return_value=True),
            redirect_stdout(io.StringIO()),
        ):
            ds_config_module.DeepSpeedConfig(copy.deepcopy(config))
    except Exception as error:  # DeepSpeed raises AssertionError, ValueError and pydantic errors alike
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigRejected(f"{type(error).__name__}: {message}") from error
