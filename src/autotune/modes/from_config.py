"""The memory mode (classic or modern) a user's `zero_optimization` section runs, as DeepSpeed 0.19.8 would run it.

`modes.applies.mode_from_zero_section` reads what is written; this keeps only the parts DeepSpeed really acts on
for the config's rung, and says in a note what it drops and why (DeepSpeed ignores it, or refuses the config), so
`plan --config` and `check` never silently predict a mode that will not run. Paths are relative to the installed
`deepspeed` package.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from autotune.core.ladder import Mode, Rung
from autotune.modes.applies import mode_from_zero_section


def _ratio(zero: dict[str, Any], rung: Rung, notes: list[str]) -> float:
    offload = zero.get("offload_optimizer")
    written = offload.get("ratio", 1.0) if isinstance(offload, dict) else 1.0
    if not isinstance(written, (int, float)) or isinstance(written, bool) or written >= 1.0:
        return 1.0
    where = f"offload_optimizer.ratio {written:g}"
    if rung.stage != 3:
        # pydantic turns the assert into a validation error before this is reached (check/fit._validated_zero)
        notes.append(f"{where}: DeepSpeed refuses a ratio below ZeRO-3 (runtime/zero/config.py:396-399)")
    elif rung.offload_optimizer is None:
        notes.append(
            f"{where} is ignored: without optimizer offload there is nothing to split (runtime/zero/stage3.py:1100)"
        )
    elif rung.offload_optimizer == "nvme":
        notes.append(
            f"{where} is ignored: the NVMe swap path places every sub-group itself (runtime/zero/stage3.py:1117-1121)"
        )
    else:
        return float(written)
    return 1.0


def moot_ratio_note(ratio: float, sub_group_size: int, per_rank: int) -> str:
    """Said when the memory model keeps nothing of a ratio on the GPU: too few sub-groups for int((1 - r) * n)."""
    sub_groups = max(1, math.ceil(per_rank / max(1, sub_group_size)))
    return (
        f"offload_optimizer.ratio {ratio:g} keeps nothing on the GPU here: sub_group_size {sub_group_size:,} cuts"
        f" the rank's {per_rank:,} parameters into about {sub_groups} sub-group(s), and DeepSpeed keeps the first"
        f" int((1 - {ratio:g}) x n) of them there (runtime/zero/stage3.py:1105); a smaller sub_group_size makes"
        " the ratio act"
    )


def config_mode(zero: dict[str, Any], rung: Rung) -> tuple[Mode, list[str]]:
    """(the Mode DeepSpeed runs for `zero` on `rung`, notes on what it drops). Whether the config's
    sub_group_size leaves the ratio anything to split is the memory model's answer (`moot_ratio_note`)."""
    written = mode_from_zero_section(zero)
    notes: list[str] = []
    ratio = _ratio(zero, rung, notes)
    mode = replace(written, offload_ratio=ratio)
    if mode.zenflow and rung is not Rung.Z2_OFFLOAD_OPT:
        if rung.stage == 3:
            why = "ZenFlow's ZeRO-3 path (runtime/zenflow/engine_stage3.py) is not modelled; predicted without it"
        elif rung.offload_optimizer is None and rung.stage in (1, 2):
            why = "DeepSpeed refuses ZenFlow without CPU optimizer offload (zenflow_stage_1_and_2.py:115-116)"
        else:
            why = "ZenFlow is modelled at ZeRO-2 + CPU optimizer offload only; predicted without it"
        notes.append(f"zenflow: {why}")
        mode = replace(mode, zenflow=False)
    zero_plus_plus = mode.hpz_partition_size > 1 or mode.quantized_weights or mode.quantized_gradients
    if zero_plus_plus and rung.stage != 3:
        notes.append(
            "zero_hpz_partition_size / zero_quantized_*: ignored below ZeRO-3 (read only by ZeRO-3's"
            " runtime/zero/partition_parameters.py:1905-1925 and stage3.py)"
        )
        mode = replace(mode, hpz_partition_size=1, quantized_weights=False, quantized_gradients=False)
    if mode.super_offload and (rung.stage != 3 or rung.offload_optimizer != "cpu"):
        why = (
            "ignored below ZeRO-3: the engine swaps in SuperOffloadOptimizer_Stage3 at stage 3 only"
            " (runtime/engine.py:2749)"
            if rung.stage != 3
            else "modelled with CPU optimizer offload only; predicted without it"
        )
        notes.append(f"offload_optimizer.super_offload: {why}")
        mode = replace(mode, super_offload=False)
    notes += zenflow_accumulation_notes(zero)
    return mode, notes


def zenflow_accumulation_notes(zero: dict[str, Any]) -> list[str]:
    """ZenFlow overwrites the engine's gradient_accumulation_steps with update_interval (runtime/zenflow/
    engine.py:69); its default "auto" makes that 0 (engine.py:48-50), and a loop over
    engine.gradient_accumulation_steps() then never steps."""
    zenflow = zero.get("zenflow")
    if not isinstance(zenflow, dict) or not isinstance(zenflow.get("update_interval", "auto"), str):
        return []
    return [
        'zenflow.update_interval "auto" (the default) makes engine.gradient_accumulation_steps() 0'
        " (runtime/zenflow/engine.py:48-50, 69): a loop over it never steps; write your accumulation there"
    ]
