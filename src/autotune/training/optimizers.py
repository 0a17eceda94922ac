"""The optimizers a user can tune for (--optimizer): how each is named in the ds_config, in HF
TrainingArguments and in the example scripts, and what it keeps in memory.

Three kinds, because DeepSpeed builds two of them itself and must be handed the third:
- `adamw` (default): DeepSpeed's own AdamW, `"optimizer": {"type": "AdamW"}`. DeepSpeed picks FusedAdam on
  the device, or DeepSpeedCPUAdam when the optimizer is offloaded (deepspeed/runtime/engine.py,
  `_configure_basic_optimizer`).
- `torch-adamw`: the same section with `"torch_adam": true`, which makes DeepSpeed build torch.optim.AdamW
  (same function, TORCH_ADAM_PARAM).
- `adafactor`: transformers' Adafactor, not a DeepSpeed optimizer type (DeepSpeed asserts on unknown types),
  so the config has no optimizer section and `"zero_allow_untested_optimizer": true`, as HF Trainer sets
  it for its own optimizers (transformers/integrations/deepspeed.py, `deepspeed_optim_sched`); the script
  builds it exactly as HF's `--optim adafactor` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import UserError


@dataclass(frozen=True)
class OptimizerKind:
    name: str  # --optimizer value
    ds_type: str | None  # DeepSpeed optimizer "type"; None when the script passes the optimizer itself
    torch_adam: bool  # DeepSpeed builds torch.optim.AdamW instead of its fused kernel
    hf_optim: str | None  # TrainingArguments --optim, needed only when the config has no optimizer section
    # fp32 states per trainable parameter; Adafactor's factored second moment is rows + columns per matrix,
    # counted by adafactor_state_elements instead.
    state_bytes_per_param: int
    description: str

    @property
    def client_side(self) -> bool:
        """The training script builds this optimizer and hands it to DeepSpeed."""
        return self.ds_type is None


# AdamW keeps exp_avg and exp_avg_sq in fp32 (torch/optim/adamw.py; DeepSpeed's CPU Adam likewise).
OPTIMIZERS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind(
        "adamw",
        "AdamW",
        False,
        None,
        state_bytes_per_param=8,
        description="DeepSpeed AdamW (FusedAdam; DeepSpeedCPUAdam offloaded)",
    ),
    "torch-adamw": OptimizerKind(
        "torch-adamw",
        "AdamW",
        True,
        None,
        state_bytes_per_param=8,
        description="torch.optim.AdamW (DeepSpeed torch_adam)",
    ),
    "adafactor": OptimizerKind(
        "adafactor",
        None,
        False,
        "adafactor",
        state_bytes_per_param=0,
        description="Adafactor (transformers, factored states)",
    ),
}
DEFAULT_OPTIMIZER = "adamw"


def optimizer_kind(name: str | None) -> OptimizerKind:
    """The named optimizer; a one-line UserError (exit 2) for any other name."""
    chosen = OPTIMIZERS.get(name or DEFAULT_OPTIMIZER)
    if chosen is None:
        raise UserError(f"unknown --optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return chosen


def ds_optimizer_section(kind: OptimizerKind) -> dict[str, Any] | None:
    """The ds_config "optimizer" entry, or None for a client-side optimizer. Its type only: lr, betas, eps and
    weight_decay are the user's training, which autotune never chooses (DeepSpeed's defaults apply where the user
    gives none; autotune.dsconfig.base_config.placeholder_notes says so)."""
    if kind.ds_type is None:
        return None
    params: dict[str, Any] = {}
    if kind.torch_adam:
        params["torch_adam"] = True
    return {"type": kind.ds_type, "params": params}


def build_client_optimizer(name: str, parameters: Any, lr: float) -> Any:
    """The optimizer a script passes to deepspeed.initialize when the config names none.

    Adafactor with the arguments HF Trainer uses for `--optim adafactor` (transformers/trainer.py,
    `get_optimizer_cls_and_kwargs`: scale_parameter=False, relative_step=False).
    """
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(parameters, lr=lr, scale_parameter=False, relative_step=False)
    import torch

    return torch.optim.AdamW(parameters, lr=lr)


def adafactor_state_elements(shapes: list[tuple[int, ...]]) -> int:
    """Adafactor's fp32 state elements (beta1=None, no first moment): a matrix keeps one row and one
    column vector of squared-gradient averages, anything else a full copy (transformers/optimization.py,
    Adafactor.step, `factored = len(grad_shape) >= 2`)."""
    total = 0
    for shape in shapes:
        if len(shape) >= 2:
            leading = 1
            for dim in shape[:-2]:
                leading *= dim
            total += leading * (shape[-2] + shape[-1])
        else:
            total += shape[0] if shape else 1
    return total


# DeepSpeed's estimators count Adam's two fp32 states (8 B per trainable parameter) inside their figure
# (runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs: 16 B = fp32 master, grad, 2 states).
ADAM_STATE_BYTES = 8
FP32 = 4


@dataclass(frozen=True)
class OptimizerMemory:
    """Relative to DeepSpeed's Adam figure, for the optimizer's slice of the parameters on one rank."""

    state_delta_bytes: int  # states held beyond (negative: below) Adam's 8 B per parameter
    step_temporary_bytes: int  # allocated inside step() and freed when it returns


def optimizer_memory(name: str, elements: int, flattened: bool = True, largest_tensor: int = 0) -> OptimizerMemory:
    """States and step temporaries of `elements` fp32 parameters as the optimizer sees them.

    DeepSpeed hands the optimizer flat fp32 partitions whenever it keeps master weights (ZeRO 1-3, and the
    bf16/fp16 optimizers at stage 0: `single_partition_of_fp32_groups`, `fp32_groups_flat_partition`), so the
    optimizer sees one 1-D tensor per group; only fp32 at stage 0 gives it the model's own tensors.
    - adamw: FusedAdam and DeepSpeedCPUAdam update in place (csrc/adam/multi_tensor_adam.cu,
      csrc/adam/cpu_adam_impl.cpp): no temporaries.
    - torch-adamw: torch's single-tensor AdamW builds `denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`
      (torch/optim/adam.py, `_single_tensor_adam`): two fp32 temporaries the size of the tensor it updates,
      for a moment: the whole flat partition, or on the model's own tensors the largest one (measured: no
      visible step peak for fp32 gpt2 at stage 0, benchmarks/optimizer_lora_memory.py). The foreach path
      (the default on CUDA) needs one temporary for all tensors of a group at once; not modelled separately.
    - adafactor: a 1-D tensor is not factored (transformers/optimization.py, Adafactor.step,
      `factored = len(grad_shape) >= 2`), so under DeepSpeed it keeps a full exp_avg_sq (4 B, half of Adam)
      and builds `update = grad**2 + eps`, `exp_avg_sq.rsqrt().mul_(grad)` and `-update`: two full-size fp32
      temporaries at once. On the model's own tensors (fp32, stage 0) it keeps only row and column vectors
      (counted as nothing) and its temporaries are per tensor: two of the largest.
    """
    if name == "torch-adamw":
        return OptimizerMemory(0, 2 * FP32 * (elements if flattened else largest_tensor))
    if name == "adafactor":
        if flattened:
            return OptimizerMemory((FP32 - ADAM_STATE_BYTES) * elements, 2 * FP32 * elements)
        return OptimizerMemory(-ADAM_STATE_BYTES * elements, 2 * FP32 * largest_tensor)
    return OptimizerMemory(0, 0)
