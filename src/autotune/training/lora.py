"""LoRA through the `peft` library: which modules get adapters, how many parameters they add, and
wrapping a model for a trial or a training script.

Target modules default to peft's own per-architecture choice (peft/utils/constants.py,
TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj/v_proj for llama, c_attn for gpt2, q/v for
t5), which is what `LoraConfig(target_modules=None)` uses, so a user's peft script trains the same
adapters the tuner measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import UserError


@dataclass(frozen=True)
class LoraSettings:
    rank: int
    target_modules: tuple[str, ...] | None = None  # None: peft's default for the model type
    alpha: int | None = None  # default 2 x rank, a common choice; does not change memory

    def to_dict(self) -> dict:
        return {"rank": self.rank, "target_modules": list(self.target_modules or ()), "alpha": self.alpha}


def check_rank(rank: int | None) -> None:
    if rank is not None and rank <= 0:
        raise UserError(f"--lora-rank must be a positive integer, got {rank}")


def default_targets(model_type: str) -> tuple[str, ...]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

    targets = defaults.get(model_type)
    if not targets:
        raise UserError(f"peft has no default LoRA target modules for model type {model_type!r}; pass --lora-targets")
    return tuple(targets)


def _linear_like(module: Any) -> tuple[int, int] | None:
    """(in, out) features of a module peft's LoRA can wrap: nn.Linear, or GPT-2's Conv1D."""
    weight = getattr(module, "weight", None)
    if weight is None or weight.dim() != 2:
        return None
    if type(module).__name__ == "Conv1D":  # transformers' Conv1D stores weight as (in, out)
        return int(weight.shape[0]), int(weight.shape[1])
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        return int(module.in_features), int(module.out_features)
    return None


def adapter_parameters(model: Any, targets: tuple[str, ...], rank: int) -> int:
    """Parameters LoRA adds: rank x (in + out) per targeted module (A is r x in, B is out x r).

    A target matches a module whose name ends with it, as peft matches a list of names
    (peft/tuners/tuners_utils.py, `check_target_module_exists`). A target that matches nothing is refused
    here with one line, before peft would raise deep inside a trial.
    """
    matched: dict[str, int] = {t: 0 for t in targets}
    total = 0
    for name, module in model.named_modules():
        for target in targets:
            if name == target or name.endswith(f".{target}"):
                shape = _linear_like(module)
                if shape is None:
                    continue
                matched[target] += 1
                total += rank * (shape[0] + shape[1])
    missing = [t for t, count in matched.items() if count == 0]
    if missing:
        raise UserError(
            f"LoRA target module(s) {', '.join(missing)} not found in the model (no linear layer by that name)"
        )
    return total


def apply_lora(model: Any, settings: LoraSettings, model_type: str) -> Any:
    """Freeze the base and add adapters with peft; returns the PeftModel (trainable = adapters only)."""
    from peft import LoraConfig, get_peft_model

    targets = list(settings.target_modules or default_targets(model_type))
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha or 2 * settings.rank, target_modules=targets)
    return get_peft_model(model, config)


def lora_summary(summary: Any, settings: LoraSettings) -> Any:
    """The model as LoRA trains it: the base frozen, the adapters the only trainable parameters.

    Counted on the meta device (nothing allocated), which also refuses a target module the model lacks.
    The memory model then gives frozen parameters 16-bit weights only (no gradient, no optimizer state;
    partitioned at ZeRO-3: estimate/model_states.py) and the adapters the full treatment.
    """
    from dataclasses import replace

    from autotune.models.architecture import build_model

    model, _ = build_model(
        summary.config, summary.architecture, device="meta", trust_remote_code=summary.trust_remote_code
    )
    targets = settings.target_modules or default_targets(summary.model_type)
    adapters = adapter_parameters(model, tuple(targets), settings.rank)
    return replace(
        summary,
        total_params=summary.total_params + adapters,
        trainable_params=adapters,
        fingerprint=f"{summary.fingerprint}+lora-r{settings.rank}-{','.join(targets)}",
    )
