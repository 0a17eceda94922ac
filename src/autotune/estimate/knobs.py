"""The ds_config values that size DeepSpeed's buffers, and the optimizer the run steps with.

`ZeroKnobs()` is what autotune.dsconfig.build_config emits; `ZeroKnobs.from_ds_config` reads a user's (or a published
run's) `zero_optimization` section, filling "auto" the way HF Trainer does
(transformers/integrations/deepspeed.py, `trainer_config_finalize`: reduce_bucket_size = hidden^2,
stage3_prefetch_bucket_size = 0.9 hidden^2, stage3_param_persistence_threshold = 10 hidden) and absent keys
with DeepSpeed 0.19.8's defaults (runtime/zero/config.py: reduce_bucket_size 5e8, allgather_bucket_size 5e8,
overlap_comm None -> True at stage 3 only, stage3_* 5e7 / 1e5 / 1e9 / 1e9, sub_group_size 1e9).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

DS_DEFAULT_BUCKET = 500_000_000  # runtime/zero/config.py: reduce_bucket_size / allgather_bucket_size
DS_DEFAULT_PREFETCH = 50_000_000  # stage3_prefetch_bucket_size
DS_DEFAULT_PERSISTENCE = 100_000  # stage3_param_persistence_threshold
DS_DEFAULT_LIVE = 1_000_000_000  # stage3_max_live_parameters, stage3_max_reuse_distance, sub_group_size

# How the optimizer step allocates on the device, per trainable element of the rank's fp32 partition:
# - "fused" (DeepSpeed FusedAdam, what autotune.dsconfig.build_config emits; ops/adam/fused_adam.py): one multi-tensor
# kernel
#   updating in place, no temporaries;
# - "torch_foreach" (torch.optim.AdamW's default on CUDA, foreach=True): torch 2.13 torch/optim/adam.py:790,
#   `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`, one fp32 temporary per element for the whole
#   parameter list at once (4 bytes per element; the other foreach ops are in place);
# - "torch_fused" (fused=True): in place, like FusedAdam.
OPTIMIZER_STEP_TEMPORARY_BYTES = {"fused": 0, "torch_foreach": 4, "torch_fused": 0}


def _pins(zero: dict[str, Any]) -> bool:
    """Whether the optimizer offload section pins its host buffers (DeepSpeed 0.19.8 default: True)."""
    section = zero.get("offload_optimizer")
    return bool(section.get("pin_memory", True)) if isinstance(section, dict) else True


def _steps(steps: int | None) -> int | None:
    return None if steps is None else max(1, int(steps))


@dataclass(frozen=True, kw_only=True)
class ZeroKnobs:
    reduce_bucket_size: int | None = None  # None: what dsconfig emits (stage 1-2: EstimateSettings', stage 3: hidden^2)
    allgather_bucket_size: int | None = None
    overlap_comm: bool | None = None  # None: True (what dsconfig emits at every stage)
    contiguous_gradients: bool = True
    stage3_prefetch_bucket_size: int | None = None  # None: 0.9 hidden^2
    stage3_param_persistence_threshold: int | None = None  # None: 10 hidden
    stage3_max_live_parameters: int = DS_DEFAULT_LIVE
    stage3_max_reuse_distance: int = DS_DEFAULT_LIVE
    sub_group_size: int = DS_DEFAULT_LIVE
    gradient_accumulation_steps: int | None = None  # None: not known (the full ZeRO-1 gradient is then counted)
    optimizer: str = "fused"  # key of OPTIMIZER_STEP_TEMPORARY_BYTES
    # Stage 3: was the model built under deepspeed.zero.Init (HF Trainer / accelerate do it, and so do autotune's
    # trials)? Without it the engine moves the whole cast model to the GPU before partitioning it
    # (runtime/engine.py:2093-2094) and the caching allocator keeps those blocks reserved. None: not known.
    zero_init: bool | None = True
    # Whose sub_group_size cuts the sub-groups an offload ratio splits (stage3.py:1105, 1210-1233): False for
    # autotune's own configs (dsconfig emits modes.ratio_sub_group_size with every ratio < 1), True for a user's
    # config read by from_ds_config, where DeepSpeed cuts by the value written (or its default 1e9).
    sub_group_size_as_written: bool = False
    # Offloaded states in page-locked memory: what dsconfig writes (dsconfig/build_config.py) and DeepSpeed 0.19.8's
    # default
    # (runtime/zero/offload_config.py:45, 75). Pinned tensors cost a power of two on CUDA (estimate/pinned.py).
    pin_memory: bool = True

    @classmethod
    def from_ds_config(
        cls,
        zero: dict[str, Any],
        hidden_size: int | None,
        stage: int,
        gradient_accumulation_steps: int | None = None,
        optimizer: str = "fused",
        zero_init: bool | None = True,
    ) -> ZeroKnobs:
        """Knobs of a `zero_optimization` section as DeepSpeed would run it (HF Trainer's "auto" filled)."""
        hidden = hidden_size or 0

        def size(key: str, auto: int, default: int) -> int:
            value = zero.get(key, default)
            return auto if value == "auto" else int(float(value))

        overlap = zero.get("overlap_comm")
        return cls(
            reduce_bucket_size=size("reduce_bucket_size", hidden * hidden or DS_DEFAULT_BUCKET, DS_DEFAULT_BUCKET),
            allgather_bucket_size=size("allgather_bucket_size", DS_DEFAULT_BUCKET, DS_DEFAULT_BUCKET),
            overlap_comm=(stage == 3) if overlap in (None, "auto") else bool(overlap),
            contiguous_gradients=bool(zero.get("contiguous_gradients", True)),
            stage3_prefetch_bucket_size=size(
                "stage3_prefetch_bucket_size", int(0.9 * hidden * hidden) or DS_DEFAULT_PREFETCH, DS_DEFAULT_PREFETCH
            ),
            stage3_param_persistence_threshold=size(
                "stage3_param_persistence_threshold", 10 * hidden or DS_DEFAULT_PERSISTENCE, DS_DEFAULT_PERSISTENCE
            ),
            stage3_max_live_parameters=size("stage3_max_live_parameters", DS_DEFAULT_LIVE, DS_DEFAULT_LIVE),
            stage3_max_reuse_distance=size("stage3_max_reuse_distance", DS_DEFAULT_LIVE, DS_DEFAULT_LIVE),
            sub_group_size=size("sub_group_size", DS_DEFAULT_LIVE, DS_DEFAULT_LIVE),
            gradient_accumulation_steps=_steps(gradient_accumulation_steps),
            optimizer=optimizer,
            zero_init=zero_init,
            sub_group_size_as_written=True,
            pin_memory=_pins(zero),
        )

    def with_accumulation(self, steps: int) -> ZeroKnobs:
        return replace(self, gradient_accumulation_steps=max(1, steps))

    @property
    def zero1_keeps_full_gradient(self) -> bool:
        """stage_1_and_2.py:2290-2295: only overlap_comm at an accumulation boundary drops gradients in backward."""
        overlap = True if self.overlap_comm is None else self.overlap_comm
        return not overlap or self.gradient_accumulation_steps != 1

    @property
    def step_temporary_bytes_per_element(self) -> int:
        if self.optimizer not in OPTIMIZER_STEP_TEMPORARY_BYTES:
            known = ", ".join(sorted(OPTIMIZER_STEP_TEMPORARY_BYTES))
            raise ValueError(f"unknown optimizer kind {self.optimizer!r}; known: {known}")
        return OPTIMIZER_STEP_TEMPORARY_BYTES[self.optimizer]


# DeepSpeed ran ZeRO-1 with overlap_comm and contiguous_gradients off, whatever the config said, from PR #1246
# ("meaningless in stage 1") until PR #4887 released both. Read in the sdists: absent from 0.4.3; present in
# 0.4.4 and 0.4.5 (engine.py:916-919), 0.5.0 (1003-1007), 0.10.0 (1432-1438), 0.12.0 (1468-1474) and 0.12.6
# (1485-1491; by 0.10.0 a model with MoE layers keeps contiguous_gradients, PR #2250, not modelled); absent
# again from 0.13.1, 0.13.5 and 0.14.0 (0.13.0's sdist could not be fetched: taken as released). Without them
# ZeRO-1 keeps every full gradient until the accumulation boundary and allocates no contiguous reduce buffer.
ZERO1_FLAGS_IGNORED_VERSIONS = ((0, 4, 4), (0, 13, 0))  # [first version that ignores them, first that does not)


def as_deepspeed_runs(knobs: ZeroKnobs, stage: int, deepspeed_version: tuple[int, ...] | None) -> ZeroKnobs:
    """The knobs the named DeepSpeed version actually runs at this stage (an unknown version: as written)."""
    first, released = ZERO1_FLAGS_IGNORED_VERSIONS
    if stage == 1 and deepspeed_version is not None and first <= deepspeed_version < released:
        return replace(knobs, overlap_comm=False, contiguous_gradients=False)
    return knobs
