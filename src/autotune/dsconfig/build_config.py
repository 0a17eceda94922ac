"""Build complete ds_config dicts for candidates, and validate them with DeepSpeed's own parser."""

from __future__ import annotations

import copy
import io
from collections.abc import Mapping
from contextlib import redirect_stdout
from dataclasses import dataclass
from typing import Any
from unittest import mock

from autotune.core.choices import Precision
from autotune.core.ladder import Candidate
from autotune.errors import UserError
from autotune.infra.environment import parse_without_device
from autotune.modes.applies import deepspeed_ratio, ratio_sub_group_size
from autotune.training.optimizers import ds_optimizer_section, optimizer_kind

# DeepSpeed's default bucket sizes (element counts, not bytes).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000
DS_DEFAULT_ALLGATHER_BUCKET = 500_000_000
DS_DEFAULT_PREFETCH_BUCKET = 50_000_000
DS_DEFAULT_PERSISTENCE_THRESHOLD = 100_000
DS_DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000

# ZenFlow's documented defaults, written out so the emitted config says what runs (deepspeed/runtime/zenflow/
# zenflow_config.py, ZenFlowConfig field defaults; the same values as DeepSpeed's ZenFlow tutorial config), except
# update_interval: ZenFlow overwrites the engine's gradient_accumulation_steps with it (runtime/zenflow/engine.py:69),
# and "auto" makes that 0 (engine.py:48-50), which breaks every loop over engine.gradient_accumulation_steps().
# `zenflow_section` writes the candidate's accumulation there instead.
ZENFLOW_DEFAULTS: dict[str, Any] = {
    "topk_ratio": 0.1,
    "select_strategy": "auto",
    "select_interval": "auto",
    "full_warm_up_rounds": 0,
    "overlap_step": False,
}
# DeepSpeed's default share of cores for SuperOffload's CPU Adam (runtime/zero/offload_config.py:105).
SUPER_OFFLOAD_CPUADAM_CORES_PERC = 0.8


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Everything besides the candidate that shapes the emitted config."""

    world_size: int
    precision: Precision = "bf16"
    global_batch: int | None = None
    hidden_size: int | None = None  # sizes the stage-3 buckets the way HF's "auto" does
    nvme_path: str | None = None
    bucket_elements: int = 200_000_000  # stages 1-2 reduce/allgather bucket, elements
    optimizer: str = "adamw"  # an autotune.training.optimizers name
    # Sizes sub_group_size for a partial offload ratio (autotune.modes.applies.ratio_sub_group_size); needed only then.
    trainable_params: int | None = None


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


def zenflow_section(accumulation: int) -> dict[str, Any]:
    """ZenFlow's section with update_interval = the stated accumulation, so engine.gradient_accumulation_steps()
    (which ZenFlow sets to update_interval, runtime/zenflow/engine.py:52-54,69) is what the report states."""
    return {**ZENFLOW_DEFAULTS, "update_interval": accumulation}


def zero_section(candidate: Candidate, settings: TrainSettings, accumulation: int = 1) -> dict[str, Any]:
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
    zero.update(mode_fields(candidate, settings, accumulation))
    offload_extra = zero.pop("offload_optimizer_extra", None)
    if offload_extra:
        zero["offload_optimizer"].update(offload_extra)
    return zero


def mode_fields(candidate: Candidate, settings: TrainSettings, accumulation: int = 1) -> dict[str, Any]:
    """The zero_optimization fields of the candidate's modern memory mode; {} for the classic mode.

    Keys under offload_optimizer come back under "offload_optimizer_extra" for zero_section to merge. Whether the
    mode applies to the rung is `autotune.modes.applies`' question; here a mode on a rung that lacks what it needs is a
    programming error and raises ValueError, so no config silently drops a mode.
    """
    mode = candidate.mode
    rung = candidate.rung
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if mode.offload_ratio != 1.0:
        if rung.stage != 3 or rung.offload_optimizer != "cpu":
            raise ValueError(f"offload ratio {mode.offload_ratio:g} needs ZeRO-3 with CPU optimizer offload")
        if not settings.trainable_params:
            raise ValueError("an offload ratio needs TrainSettings.trainable_params to size sub_group_size")
        # the value for which DeepSpeed's float int((1 - r) * n) keeps the intended sub-group count (0.9 is 0.95's)
        extra["ratio"] = deepspeed_ratio(mode.offload_ratio)
        # DeepSpeed applies the ratio per sub-group (runtime/zero/stage3.py:1105): without this a model under 1e9
        # params per rank is one sub-group and any ratio > 0 offloads everything.
        fields["sub_group_size"] = ratio_sub_group_size(settings.trainable_params, settings.world_size)
    if mode.zenflow:
        if rung.stage not in (1, 2) or rung.offload_optimizer != "cpu":
            raise ValueError("ZenFlow needs ZeRO-1/2 with CPU optimizer offload")
        fields["zenflow"] = zenflow_section(accumulation)
    if mode.hpz_partition_size != 1 or mode.quantized_weights or mode.quantized_gradients:
        if rung.stage != 3:
            raise ValueError("ZeRO++ (hpZ, qwZ, qgZ) needs ZeRO-3")
        if mode.hpz_partition_size != 1:
            if settings.world_size % mode.hpz_partition_size:
                raise ValueError(
                    f"hpZ partition {mode.hpz_partition_size} does not divide world size {settings.world_size}"
                )
            fields["zero_hpz_partition_size"] = mode.hpz_partition_size
        if mode.quantized_weights:
            fields["zero_quantized_weights"] = True
        if mode.quantized_gradients:
            fields["zero_quantized_gradients"] = True
    if mode.super_offload:
        if rung.stage != 3 or rung.offload_optimizer != "cpu":
            raise ValueError("SuperOffload needs ZeRO-3 with CPU optimizer offload")
        extra.update(super_offload=True, cpuadam_cores_perc=SUPER_OFFLOAD_CPUADAM_CORES_PERC)
    if extra:
        fields["offload_optimizer_extra"] = extra
    return fields


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
        "zero_optimization": zero_section(candidate, settings, accumulation),
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    kind = optimizer_kind(settings.optimizer)
    section = ds_optimizer_section(kind)
    if section is not None:
        config["optimizer"] = section
    else:
        # The script passes its own optimizer; ZeRO refuses untested ones without this (HF Trainer sets it too).
        config["zero_allow_untested_optimizer"] = True
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


def hf_variant(config: dict[str, Any], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config for HF Trainer / Accelerate: every tuned value stays concrete, so HF's consistency check
    (transformers/integrations/deepspeed.py, `trainer_config_process`) holds TrainingArguments to it; only
    the user's own hyperparameters, which autotune does not tune (learning rate, betas, eps, weight decay,
    gradient clipping), are "auto" and come from TrainingArguments. No scheduler section: HF Trainer then
    drives DeepSpeed's optimizer with its own `--lr_scheduler_type` schedule.

    With the user's base config (autotune.dsconfig.base_config) its keys are theirs, "auto" or not, and stay as written;
    only an optimizer section autotune added (the base had none) takes its hyperparameters from TrainingArguments.
    """
    hf = copy.deepcopy(config)
    if base is None:
        hf["gradient_clipping"] = "auto"
        hf.pop("scheduler", None)
    if "optimizer" in hf and "optimizer" not in (base or {}):
        params = hf["optimizer"].setdefault("params", {})
        for key in ("lr", "betas", "eps", "weight_decay"):
            params[key] = "auto"
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
