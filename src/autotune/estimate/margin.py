"""How far above the prediction the true peak may be, component by component.

A GPU verdict says "fits" only when prediction + margin is under the limit. Each relative figure below is
what this project measured or read for that component; the runtime parts (CUDA context, NCCL, allocator)
come with their own spread from estimate/runtime.py. The margins add linearly: components can all be off in
the same direction (a newer stack, a different kernel choice), and a false "fits" costs a failed launch.
benchmarks/published_accuracy.py reports what this margin costs in true fits on published runs.
"""

from __future__ import annotations

from autotune.estimate.estimate_types import Calibration
from autotune.estimate.mode_terms import MODE_MARGINS
from autotune.estimate.runtime import Overhead, allocator_reserve_margin_fraction
from autotune.models import ModelSummary

# Model states are arithmetic on parameter counts (exact counts from the meta-device build); what remains is
# allocator rounding and alignment padding of DeepSpeed's flat buffers (stage_1_and_2.py / stage3.py align
# partitions to 2 * world_size elements): 2%.
MODEL_STATE_RELATIVE = 0.02
# Bucket sizes are read from the config; the buffers exist exactly once or twice: 5% for rounding.
BUFFER_RELATIVE = 0.05
# Activations: within 10% of autograd (MemTracker) for GPT-2 / Llama / T5, T5 with checkpointing within 25%
# (tests/test_estimate_activations.py); 15% for decoder-only and encoder-only, 25% for encoder-decoder.
ACTIVATION_RELATIVE = 0.15
ACTIVATION_RELATIVE_ENCODER_DECODER = 0.25
# Stage-3 retention replays DeepSpeed's release rule on a module trace made from the summary
# (stage3_retention.py); against DeepSpeed's own gathered state on the CPU backend it was within 1.4% for Llama,
# 9.3% for GPT-2 (its fused qkv and position embedding are not in the layout) and 7.4% for T5, on models small
# enough that one module is a seventh of what is kept (benchmarks/stage3_retention_cpu.py,
# results/stage3_retention_cpu.json): 15%.
LIVE_PARAMS_RELATIVE = 0.15
# After a measured trial, what calibration absorbed is known to this fraction of the relative figures above: the
# activations' only after a trial of the candidate's own checkpointing setting (its slope is fitted per setting,
# estimate/calibration.py; the other setting's trials say nothing measured about it), the rest after any trial.
CALIBRATED_SHRINK = 0.5

_STATE_COMPONENTS = ("model_states", "frozen_params", "zero1_unpartitioned_grads", "fp32_widening")
_BUFFER_COMPONENTS = (
    "reduce_buckets",
    "persistent_params",
    "prefetched_params",
    "allreduce_flat_grads",
    "weight_grad_transient",
    "offload_grad_staging",
)
_ACTIVATION_COMPONENTS = ("activations", "logits", "backward_window")


def gpu_margins(
    components: dict[str, int],
    model: ModelSummary,
    runtime: dict[str, Overhead],
    allocated_bytes: int,
    calibration: Calibration | None = None,
    unknown_zero_init_bytes: int = 0,
    grad_checkpointing: bool = False,
) -> dict[str, int]:
    """Bytes by which each component may exceed its prediction (CUDA only), for a candidate with (or without)
    gradient checkpointing.

    unknown_zero_init_bytes: at stage 3 when nobody knows whether the model was built under zero.Init, the whole
    16-bit model that would then reach the GPU first (buffers.unpartitioned_model_bytes), less what the step's
    parameter-sized tensors would reuse of its cached blocks (buffers.reserve_left_after_reuse).
    """
    activation_relative = (
        ACTIVATION_RELATIVE_ENCODER_DECODER if model.family == "encoder-decoder" else ACTIVATION_RELATIVE
    )
    relative = dict.fromkeys(_STATE_COMPONENTS, MODEL_STATE_RELATIVE)
    relative.update(dict.fromkeys(_BUFFER_COMPONENTS, BUFFER_RELATIVE))
    relative.update(dict.fromkeys(_ACTIVATION_COMPONENTS, activation_relative))
    relative["live_params"] = LIVE_PARAMS_RELATIVE
    relative.update(MODE_MARGINS)  # the modern memory modes' terms (estimate/mode_terms.py)
    calibrated = calibration is not None and calibration.samples > 0
    relative["unpartitioned_model_reserve"] = BUFFER_RELATIVE
    shrink = CALIBRATED_SHRINK if calibrated else 1.0
    activations_measured = calibration is not None and calibration.measured(grad_checkpointing)
    activation_shrink = CALIBRATED_SHRINK if activations_measured else 1.0
    margins = {
        name: round((activation_shrink if name in _ACTIVATION_COMPONENTS else shrink) * fraction * value)
        for name, fraction in relative.items()
        if (value := components.get(name, 0)) > 0
    }
    if not calibrated:  # a measured trial has seen the runtime's real size: the offset carries it
        margins["allocator_slack"] = round(allocator_reserve_margin_fraction() * allocated_bytes)
        for name, overhead in runtime.items():
            margins[name] = overhead.uncertainty
        margins["zero_init_unknown"] = unknown_zero_init_bytes
    return {name: value for name, value in margins.items() if value > 0}
