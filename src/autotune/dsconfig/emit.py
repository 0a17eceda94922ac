"""Write the chosen ds_config.json (validated by DeepSpeed at the target world size, atomically)
and say how to launch it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.core.choices import Device, Kernels, Precision
from autotune.core.ladder import Candidate
from autotune.dsconfig.base_config import runnable
from autotune.dsconfig.build_config import ConfigRejected, hf_variant, validate_with_deepspeed
from autotune.dsconfig.launchers import LaunchCommands, TunedRun, launch_commands, write_accelerate_config
from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_json

__all__ = ["LaunchCommands", "emit_launchers", "write_configs"]


def emit_launchers(
    config: dict[str, Any],
    candidate: Candidate,
    config_path: Path,
    gpus_per_node: int,
    nodes: int,
    script: str = "train.py",
    optimizer: str = "adamw",
    lora_rank: int | None = None,
    hf_script: str | None = None,
    kernels: Kernels = "stock",
    device: Device = "cuda",
    precision: Precision | None = None,
) -> LaunchCommands:
    """Write the accelerate config beside `config_path` (the .hf.json is written by write_configs) and
    return the command for every launcher, all read off the same emitted config. `precision`: the one tuned
    for, where the config leaves it to the launcher (a base config's `"bf16": {"enabled": "auto"}`)."""
    run = TunedRun(
        config_path=config_path,
        hf_config_path=config_path.with_suffix(".hf.json"),
        accelerate_config_path=config_path.with_suffix(".accelerate.yaml"),
        micro_batch=int(config["train_micro_batch_size_per_gpu"]),
        accumulation=int(config["gradient_accumulation_steps"]),
        precision=precision or _config_precision(config),
        grad_checkpointing=candidate.grad_checkpointing,
        stage=candidate.rung.stage,
        optimizer=optimizer,
        lora_rank=lora_rank,
        kernels=kernels,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        script=script,
        hf_script=hf_script or script,
        device=device,
    )
    try:
        write_accelerate_config(run)
    except OSError as error:
        raise UserError(f"cannot write {run.accelerate_config_path}: {error.strerror or error}") from None
    return launch_commands(run)


def _config_precision(config: dict[str, Any]) -> Precision:
    """The precision a config enables (DeepSpeed's reading: only `true` enables)."""
    halves: tuple[Precision, ...] = ("bf16", "fp16")
    for name in halves:
        section = config.get(name)
        if isinstance(section, dict) and section.get("enabled") is True:
            return name
    return "fp32"


def write_configs(
    config: dict[str, Any],
    world_size: int,
    out_path: Path,
    hf: bool = False,
    validate: bool = True,
    base: Mapping[str, Any] | None = None,
) -> tuple[Path, Path | None]:
    """Validate with DeepSpeed's parser at `world_size`, then write; nothing is written on refusal.

    With hf=True a second file `<stem>.hf.json` holds the "auto" variant for HF Trainer / Accelerate.
    validate=False is for configs already validated at this world size by this DeepSpeed version (a
    cache hit), which spares importing DeepSpeed. `base`: the user's config the tuned one was built on
    (autotune.dsconfig.base_config); its "auto" values are validated as HF Trainer fills them, and written as they are.
    """
    if validate:
        try:
            validate_with_deepspeed(runnable(config, world_size), world_size)
        except ConfigRejected as error:
            raise UserError(f"DeepSpeed rejected the generated config at world size {world_size}: {error}") from None
    try:
        written = atomic_write_json(out_path, config)
        hf_path = atomic_write_json(out_path.with_suffix(".hf.json"), hf_variant(config, base)) if hf else None
    except OSError as error:
        raise UserError(f"cannot write {out_path}: {error.strerror or error}") from None
    return written, hf_path
