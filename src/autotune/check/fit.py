"""With --model: the predicted per-GPU peak of the config as DeepSpeed will really run it.

The config is mapped to a ladder candidate by its effective settings (offload_param ignored below
stage 3, NVMe optimizer offload run as CPU below stage 3), then sized by autotune's memory model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune.check import schema
from autotune.check.context import CheckContext
from autotune.check.findings import Finding, FitResult, Severity
from autotune.check.rules import ZERO, resolve_batch, zero_stage
from autotune.check.values import batch_keys
from autotune.ladder import Candidate, Rung
from autotune.models import ModelSummary
from autotune.units import format_bytes


@dataclass(frozen=True)
class FitAssumptions:
    """What the tuning that wrote the config assumed, beyond the model and sequence length."""

    attention: str = "sdpa"
    device: str = "cuda"
    headroom: float = 0.9
    measured_peak_bytes: int | None = None  # the trial's peak, when the config was verified here


# (optimizer offload, parameter offload) at stage 3 -> rung, where the ladder has that exact rung.
_STAGE3_RUNGS = {
    (None, None): Rung.Z3,
    ("cpu", None): Rung.Z3_OFFLOAD_OPT,
    ("cpu", "cpu"): Rung.Z3_OFFLOAD_ALL,
    ("nvme", "cpu"): Rung.Z3_NVME_OPT,
    ("nvme", "nvme"): Rung.Z3_NVME_ALL,
}


def _offload_device(zero: dict[str, Any], section: str) -> str | None:
    value = zero.get(section)
    device = value.get("device", "none") if isinstance(value, dict) else "none"
    return None if device in ("none", None) else str(device)


def effective_rung(config: dict[str, Any]) -> tuple[Rung | None, str]:
    """The rung DeepSpeed really runs, and a note when the ladder has only a close one."""
    stage = zero_stage(config)
    if stage is None:
        return None, "the ZeRO stage is not a number"
    zero = config.get(ZERO) if isinstance(config.get(ZERO), dict) else {}
    optimizer = _offload_device(zero, "offload_optimizer")
    if stage < 3:
        optimizer = "cpu" if optimizer else None  # NVMe runs as CPU below stage 3; params are never offloaded
        if stage == 2:
            return (Rung.Z2_OFFLOAD_OPT if optimizer else Rung.Z2), ""
        note = f"ZeRO-{stage} with optimizer offload is not modelled; predicted without it (an upper bound)"
        return (Rung.Z1 if stage == 1 else Rung.Z0), note if optimizer else ""
    parameters = _offload_device(zero, "offload_param")
    if (optimizer, parameters) in _STAGE3_RUNGS:
        return _STAGE3_RUNGS[(optimizer, parameters)], ""
    if optimizer is None:
        return Rung.Z3, "parameter offload without optimizer offload is not modelled; predicted without it"
    closest = Rung.Z3_OFFLOAD_OPT if parameters is None else Rung.Z3_OFFLOAD_ALL
    return closest, f"predicted as {closest.label}, which keeps the same on the GPU"


def _reduce_bucket_elements(config: dict[str, Any]) -> int:
    """The config's reduce bucket, else DeepSpeed's default (not the smaller one autotune emits)."""
    zero = config.get(ZERO) if isinstance(config.get(ZERO), dict) else {}
    value = zero.get("reduce_bucket_size")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    return int(schema.field_default(schema.section_models()[ZERO].model_fields["reduce_bucket_size"]))


def _precision(config: dict[str, Any]) -> str:
    for name in ("bf16", "fp16"):
        section = config.get(name)
        if isinstance(section, dict) and section.get("enabled") is True:
            return name
    return "fp32"


def fit_findings(
    config: dict[str, Any],
    context: CheckContext,
    model: ModelSummary,
    seq_len: int,
    grad_checkpointing: bool,
    assumed: FitAssumptions | None = None,
) -> tuple[FitResult | None, list[Finding]]:
    """The predicted peak of `config` for `model`; `assumed` is what a tuning recorded beside its config
    (precision, attention, device, headroom, the measured peak), so checking its output asks its question."""
    if context.target is None:
        note = f"Fit not checked: {context.hardware_note or 'no GPU known'}"
        return None, [Finding(Severity.INFO, "", note, "fit")]
    try:
        from autotune.estimate import check_fit, estimate
        from autotune.estimate.types import EstimateSettings
    except ImportError:
        return None, [Finding(Severity.INFO, "", "Fit not checked: the memory model is not available.", "fit")]
    rung, note = effective_rung(config)
    given = [config.get(name) for name in batch_keys()]
    if rung is None or any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in given):
        why = note or "the batch keys are not numbers"
        return None, [Finding(Severity.INFO, "", f"Fit not checked: {why}.", "fit")]
    _, micro_batch, _, problem = resolve_batch(*given, context.world_size)
    if problem or not micro_batch:
        return None, [Finding(Severity.INFO, "", "Fit not checked: the micro-batch cannot be derived.", "fit")]
    candidate = Candidate(rung, micro_batch, grad_checkpointing)
    settings = EstimateSettings(
        seq_len=seq_len,
        precision=_precision(config),
        reduce_bucket_elements=_reduce_bucket_elements(config),
        **({"attention": assumed.attention, "device": assumed.device} if assumed else {}),
    )
    predicted = estimate(model, context.target, candidate, settings)
    verdict = check_fit(predicted, context.target, *((assumed.headroom,) if assumed else ()))
    if not verdict.fits and assumed and assumed.measured_peak_bytes is not None:
        limit = int(assumed.headroom * context.target.free_memory_bytes)
        if assumed.measured_peak_bytes <= limit:  # a trial ran this config here: measured beats predicted
            verdict = replace(verdict, fits=True, reason="", shortfall_bytes=0)
            predicted = replace(predicted, gpu_peak_bytes=assumed.measured_peak_bytes)
    notes = tuple(n for n in (note,) if n)
    result = FitResult(
        candidate=candidate.describe(),
        gpu_peak_bytes=predicted.gpu_peak_bytes,
        fits=verdict.fits,
        reason=verdict.reason,
        target=context.target.describe(),
        notes=notes,
    )
    peak = format_bytes(predicted.gpu_peak_bytes)
    where = f"{model.name} at seq len {seq_len}, {candidate.describe()}, on {context.target.describe()}"
    if verdict.fits:
        finding = Finding(Severity.INFO, "", f"Fits: predicted peak {peak} per GPU for {where}.", "fit")
    else:
        finding = Finding(
            Severity.ERROR, "", f"Does not fit: predicted peak {peak} per GPU for {where}: {verdict.reason}.", "fit"
        )
    return result, [finding]
