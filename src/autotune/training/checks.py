"""Checks of the choices that shape the user's training job (optimizer, LoRA, script), made before any
model is built, so a bad value costs one line and exit 2 rather than a failed trial."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UserError
from autotune.models import ModelSummary
from autotune.training.lora import LoraSettings, check_rank, default_targets
from autotune.training.optimizers import optimizer_kind


def check_training_choices(optimizer: str, lora_rank: int | None, script: str | None) -> None:
    optimizer_kind(optimizer)
    check_rank(lora_rank)
    if script is not None and not Path(script).is_file():
        raise UserError(f"--script {script}: no such file")


def training_choices_report(optimizer: str, lora: LoraSettings | None, model: ModelSummary) -> dict:
    """What the trials trained and the emitted config names, for the report."""
    kind = optimizer_kind(optimizer)
    targets = list(lora.target_modules or default_targets(model.model_type)) if lora else []
    summary = f"optimizer {kind.name}: {kind.description}"
    if kind.client_side:
        summary += " (built by the script: no optimizer section in the config, `--optim`/`--optimizer` flag)"
    if lora:
        summary += (
            f"; LoRA rank {lora.rank} via peft on {', '.join(targets)} ({model.trainable_params:,} trainable of"
            f" {model.total_params:,} parameters, base frozen)"
        )
    else:
        summary += "; full fine-tuning"
    return {
        "optimizer": kind.name,
        "lora": {**lora.to_dict(), "target_modules": targets} if lora else None,
        "summary": summary,
    }
