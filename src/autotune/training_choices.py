"""Checks of the choices that shape the user's training job (optimizer, LoRA, script), made before any
model is built, so a bad value costs one line and exit 2 rather than a failed trial."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UserError
from autotune.lora import check_rank
from autotune.optimizers import optimizer_kind


def check_training_choices(optimizer: str, lora_rank: int | None, script: str | None) -> None:
    optimizer_kind(optimizer)
    check_rank(lora_rank)
    if script is not None and not Path(script).is_file():
        raise UserError(f"--script {script}: no such file")
