"""What each modern memory mode adds to or moves out of one rank's memory, read from DeepSpeed 0.19.8's code.

The classic rung's figure (model_states.py, buffers.py) stays as it is; `mode_memory` returns the mode's terms on
top (partial optimizer offload, ZenFlow, ZeRO++, SuperOffload), named, so the report shows them and margin.py gives
each its own spread (MODE_MARGINS).

Reasoning and sources: estimate/README.md#modes
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.core.ladder import Candidate
from autotune.estimate.knobs import OPTIMIZER_STEP_TEMPORARY_BYTES, ZeroKnobs
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.applies import RATIO_STEPS, device_sub_groups, offloaded_fraction

BYTES_FP32 = 4
BYTES_INT32 = 4
BYTES_INT8 = 1
# fp32 master + fp32 gradient + AdamW's two fp32 moments, per element of a sub-group on the device (README.md#modes)
PARTIAL_OFFLOAD_DEVICE_BYTES = 16
# Of those 16 bytes, the part the host would have pinned: the fp32 gradient buffer (stage3.py:1337-1342)
PARTIAL_OFFLOAD_PINNED_HOST_BYTES = 4
# ZenFlow's topk_ratio as autotune emits it (dsconfig.ZENFLOW_DEFAULTS, zenflow_config.py default 0.1)
ZENFLOW_TOPK_RATIO = 0.1
# qgZ: quantized intra- and inter-node copies of the reduce bucket (README.md#modes)
QGZ_BYTES_PER_BUCKET_ELEMENT = 2

# How far above prediction each mode term may be, as margin.py's relative figures. The partial-offload and hpZ
# terms are arithmetic on parameter counts like the model states (margin.MODEL_STATE_RELATIVE, 2%), but the
# sub-group cut moves whole parameters (stage3.py:1221-1226), so the device share can exceed the nominal one by a
# parameter: 10%. ZenFlow's and ZeRO++'s buffers are read, not measured on a GPU here: 50%.
MODE_MARGINS = {
    "partial_offload_states": 0.10,
    "partial_offload_host_saving": 0.0,
    "partial_offload_pageable_saving": 0.0,
    "zenflow_selected_states": 0.50,
    "zenflow_buffers": 0.50,
    "hpz_secondary_params": 0.05,
    "qwz_buffers": 0.50,
    "qgz_buffers": 0.50,
    "superoffload_grad_buffer": 0.50,
}


@dataclass(frozen=True)
class ModeMemory:
    """A mode's terms on top of the classic rung, per rank. Host terms may be negative (moved to the device)."""

    device_components: dict[str, int] = field(default_factory=dict)
    host_components: dict[str, int] = field(default_factory=dict)
    step_temporary_bytes: int = 0  # what the mode's optimizer step adds on the device, freed when it ends

    @property
    def device_bytes(self) -> int:
        return sum(self.device_components.values())

    @property
    def host_bytes(self) -> int:
        return sum(self.host_components.values())


def partial_offload_device_elements(
    ratio: float,
    per_rank: int,
    first_param_per_rank: int = 0,
    tensor_per_rank: int = 0,
    steps: int = RATIO_STEPS,
    sub_group_size: int | None = None,
) -> int:
    """Elements of one rank's fp32 partition that DeepSpeed keeps on the device for `ratio`.

    DeepSpeed cuts sub-groups in parameter order and closes one as soon as it reaches sub_group_size
    (stage3.py:1221-1226), so a parameter larger than sub_group_size is a sub-group of its own, and the device gets
    the FIRST int((1 - ratio) * n) sub-groups (stage3.py:1105); this counts one sub-group more (see below).
    HF models register the token embedding first
    (GPT-2 `wte`, Llama `embed_tokens`, T5 `shared`): 20-40% of a small model's parameters, far over the 1/steps
    share dsconfig sizes sub-groups for. So the first sub-group is max(embedding, sub_group_size) and the rest are
    cut a little past sub_group_size: a sub-group closes on the tensor that crosses the size, overshooting by half a
    layer tensor on average (`tensor_per_rank`: the MLP matrix, hidden x intermediate, a layer's largest). Checked
    against DeepSpeed's own cut on GPT-2 in tests/test_modes.py. Non-decreasing as the ratio falls, so the GPU
    estimate stays monotone for the search's bisection. `sub_group_size`: the size a user's config cuts by
    (DeepSpeed's default 1e9 when it says none); None: dsconfig's own, per_rank / steps.
    """
    if ratio >= 1.0 or per_rank <= 0:
        return 0
    # dsconfig's sub_group_size (autotune.modes.applies.ratio_sub_group_size), or the config's as written
    size = max(1, math.ceil(per_rank / steps) if sub_group_size is None else sub_group_size)
    first = min(per_rank, max(first_param_per_rank, size))
    size += min(size, tensor_per_rank) // 2
    sub_groups = 1 + math.ceil((per_rank - first) / size)
    # DeepSpeed's int((1 - r) * n) on the ratio the config carries (a user's as written, autotune's nudged value)
    on_device = device_sub_groups(ratio, sub_groups, as_written=sub_group_size is not None)
    if on_device == 0:
        return 0
    # One sub-group more than the cut above gives: the real count is off by one either way (a sub-group that
    # overshoots more, or a tiny trailing one of the last norms), and a false "fits" costs a failed launch.
    return min(per_rank, first + on_device * size)


def partial_offload_device_share(ratio: float, steps: int = RATIO_STEPS) -> float:
    """The device share for `ratio` with equal sub-groups (no parameter larger than a sub-group)."""
    return 1.0 - offloaded_fraction(ratio, steps)


def mode_memory(
    model: ModelSummary,
    target: Target,
    candidate: Candidate,
    precision: str,
    knobs: ZeroKnobs | None = None,
    bucket_elements: int = 200_000_000,
) -> ModeMemory:
    """The candidate's mode terms; empty for the classic mode. `bucket_elements`: the stage 1-2 bucket emitted."""
    mode = candidate.mode
    if mode.is_classic:
        return ModeMemory()
    knobs = knobs or ZeroKnobs()
    rung = candidate.rung
    trainable = model.trainable_params
    world = target.world_size
    per_rank = math.ceil(trainable / world)
    weight_bytes = BYTES_FP32 if precision == "fp32" else 2
    device: dict[str, int] = {}
    host: dict[str, int] = {}
    step_temporary = 0
    if mode.offload_ratio != 1.0:
        # the token embedding is the first parameter, and trainable only when the whole model is
        first = math.ceil(model.embedding_params / world) if trainable == model.total_params else 0
        tensor = math.ceil(model.hidden_size * model.intermediate_size / world)
        written = knobs.sub_group_size if knobs.sub_group_size_as_written else None
        on_device = partial_offload_device_elements(mode.offload_ratio, per_rank, first, tensor, sub_group_size=written)
        moved = PARTIAL_OFFLOAD_DEVICE_BYTES * on_device
        device["partial_offload_states"] = moved
        # what the host no longer holds: the sub-groups' pinned fp32 gradient buffers (stage3.py:1337-1342) and
        # their pageable fp32 master copy and moments (model_states.offloaded_stage3_host)
        host["partial_offload_host_saving"] = -PARTIAL_OFFLOAD_PINNED_HOST_BYTES * on_device
        pageable = PARTIAL_OFFLOAD_DEVICE_BYTES - PARTIAL_OFFLOAD_PINNED_HOST_BYTES
        host["partial_offload_pageable_saving"] = -pageable * on_device
        if on_device > 0:
            # one step call per sub-group; the largest on the device is the first (the embedding, or a full one)
            size = math.ceil(per_rank / RATIO_STEPS) if written is None else written
            sub_group = min(per_rank, max(first, size))
            step_temporary += OPTIMIZER_STEP_TEMPORARY_BYTES["torch_foreach"] * sub_group
    if mode.zenflow:
        device["zenflow_selected_states"] = round(3 * weight_bytes * ZENFLOW_TOPK_RATIO * trainable)
        device["zenflow_buffers"] = round(ZENFLOW_TOPK_RATIO * bucket_elements * (BYTES_INT32 + weight_bytes))
    if mode.hpz_partition_size > 1 and rung.offload_param is None:
        device["hpz_secondary_params"] = math.ceil(model.total_params / mode.hpz_partition_size) * weight_bytes
    if mode.quantized_weights:
        prefetch = knobs.stage3_prefetch_bucket_size or int(0.9 * model.hidden_size * model.hidden_size)
        device["qwz_buffers"] = BYTES_INT8 * prefetch
    if mode.quantized_gradients:
        reduce_bucket = knobs.reduce_bucket_size or model.hidden_size * model.hidden_size
        device["qgz_buffers"] = QGZ_BYTES_PER_BUCKET_ELEMENT * reduce_bucket
    if mode.super_offload:
        device["superoffload_grad_buffer"] = BYTES_FP32 * min(per_rank, knobs.sub_group_size)
    return ModeMemory(device, host, step_temporary)
