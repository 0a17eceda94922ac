"""With --model: the predicted per-GPU peak of the config as DeepSpeed will really run it.

The config is mapped to a ladder candidate by its effective settings (offload_param ignored below
stage 3, NVMe optimizer offload run as CPU below stage 3), then sized by autotune's memory model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune.check import schema
from autotune.check.checked_against import CheckContext
from autotune.check.findings import Finding, FitResult, Severity
from autotune.check.rules import ZERO, batch_arithmetic, resolve_batch, zero_stage
from autotune.check.values import batch_keys
from autotune.core.choices import Attention, Device, Kernels, Precision
from autotune.core.ladder import Candidate, Rung
from autotune.core.units import format_bytes
from autotune.dsconfig.base_config import config_optimizer
from autotune.dsconfig.loading import section_of
from autotune.estimate.estimate_types import EstimateSettings, MemoryEstimate, Verdict
from autotune.estimate.kernels import kernels_note
from autotune.estimate.pinned import native_pinning
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.from_config import config_mode, moot_ratio_note
from autotune.request.tune_request import default_of


@dataclass(frozen=True)
class FitAssumptions:
    """What the tuning that wrote the config assumed, beyond the model and sequence length; without a record,
    what a tuning assumes by default (TuneRequest's defaults, read from it, not restated)."""

    attention: Attention = default_of("attention")
    device: Device = default_of("device")
    headroom: float = default_of("headroom")
    measured_peak_bytes: int | None = None  # the trial's peak, when the config was verified here
    optimizer: str = default_of("optimizer")  # the optimizer the tuning ran, for a config without an optimizer section
    decoder_seq_len: int | None = None  # encoder-decoders: the decoder length the tuning ran
    kernels: Kernels = default_of("kernels")  # fused training kernels (estimate/kernels.py): `check --kernels`


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
    zero = section_of(config, ZERO)
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
    zero = section_of(config, ZERO)
    value = zero.get("reduce_bucket_size")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    return int(schema.field_default(schema.section_models()[ZERO].model_fields["reduce_bucket_size"]))


def _precision(config: dict[str, Any], when_auto: Precision) -> Precision:
    """bf16 / fp16 when the config enables one; `when_auto` when one is "auto" (HF Trainer fills it from its
    --bf16 / --fp16 flags); fp32 when neither is on."""
    auto = False
    halves: tuple[Precision, ...] = ("bf16", "fp16")
    for name in halves:
        section = config.get(name)
        if isinstance(section, dict) and section.get("enabled") is True:
            return name
        auto = auto or (isinstance(section, dict) and section.get("enabled") == "auto")
    return when_auto if auto else "fp32"


class ConfigNotModelled(Exception):
    """The config cannot be sized (its micro-batch or stage is not a number...): `check` says so as a finding,
    `plan --config` as bad input. `micro_batch_unknown`: the config does not state a micro-batch, so giving one
    (plan --micro-batch) would let it be sized."""

    def __init__(self, message: str, micro_batch_unknown: bool = False) -> None:
        super().__init__(message)
        self.micro_batch_unknown = micro_batch_unknown


def _validated_zero(config: dict[str, Any]) -> Any:
    """The zero_optimization section through DeepSpeed's own DeepSpeedZeroConfig: what DeepSpeed refuses
    (stage 7, unknown keys, a device that is not none/cpu/nvme) cannot be sized."""
    from pydantic import ValidationError

    zero = config.get(ZERO, {})
    if not isinstance(zero, dict):
        raise ConfigNotModelled(f"{ZERO} is not a JSON object")
    model = schema.section_models()[ZERO]
    try:
        return model(**zero)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or ZERO
        raise ConfigNotModelled(f"DeepSpeed refuses {ZERO}.{where}: {first.get('msg')}") from None
    except (TypeError, ValueError) as error:
        raise ConfigNotModelled(f"DeepSpeed refuses {ZERO}: {error}") from None


def _batch(
    config: dict[str, Any], world_size: int, micro_batch: int | None, global_batch: int | None = None
) -> tuple[int, int | None]:
    """(micro-batch, gradient accumulation or None when not known) as DeepSpeed derives them;
    `micro_batch` overrides the config's (plan --micro-batch), `global_batch` (plan --global-batch) gives the
    accumulation when the config leaves it to HF ("auto"). "auto" is what HF Trainer fills in."""
    given = [config.get(name) for name in batch_keys()]
    numbers = [v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None for v in given]
    pairs = zip(batch_keys(), given, numbers, strict=True)
    bad = [name for name, value, number in pairs if value not in (None, "auto") and number is None]
    if bad:
        raise ConfigNotModelled(f"{bad[0]} is {config.get(bad[0])!r}, not a positive integer")
    train, micro, accumulation = numbers
    if micro_batch is not None:
        if accumulation is None and (train or global_batch):
            accumulation = (train or global_batch or 0) // (micro_batch * world_size) or None
        return micro_batch, accumulation
    if not any(numbers):
        raise ConfigNotModelled('the batch keys are "auto" or absent, so the micro-batch is not known', True)
    _, derived_micro, derived_accumulation, problem = resolve_batch(train, micro, accumulation, world_size)
    if problem and (arithmetic := batch_arithmetic(train, micro, accumulation, world_size)):
        raise ConfigNotModelled(f"its batch sizes do not add up, so DeepSpeed refuses to start: {arithmetic}")
    if problem or not derived_micro:
        raise ConfigNotModelled(f"the micro-batch cannot be derived: {problem or 'not given'}", micro is None)
    return derived_micro, derived_accumulation


@dataclass(frozen=True)
class ConfigFit:
    """A config as DeepSpeed will run it, sized: the one answer `check` and `plan --config` give."""

    candidate: Candidate
    settings: EstimateSettings
    estimate: MemoryEstimate
    verdict: Verdict
    limit_bytes: int  # headroom x free: what peak + margin must stay under
    pinned_host_bytes: int  # of estimate.host_ram_bytes, page-locked (pin_memory, swap buffers)
    notes: tuple[str, ...] = ()
    mode_notes: tuple[str, ...] = ()  # of `notes`: what the config's memory mode does not do as written


def predict_config(
    config: dict[str, Any],
    model: ModelSummary,
    target: Target,
    base: EstimateSettings,
    grad_checkpointing: bool,
    headroom: float = 0.9,
    micro_batch: int | None = None,
    global_batch: int | None = None,
) -> ConfigFit:
    """Size `config` for `model` on `target`: its stage, offload, buckets, live-parameter limits, batch,
    precision and optimizer as written; `base` supplies what a config does not say (sequence length, attention,
    device, the stack, the precision HF fills for "auto"). Raises ConfigNotModelled when it cannot be sized."""
    from autotune.estimate import check_fit, estimate
    from autotune.estimate.knobs import ZeroKnobs

    zero = _validated_zero(config)
    if target.memlock_bytes is None:  # the config runs where it is checked: this process's ulimit -l binds it
        from autotune.hardware.machine_probe import probe_locked_memory

        target = replace(target, memlock_bytes=probe_locked_memory().binding_bytes)
    rung, note = effective_rung(config)
    if rung is None:
        raise ConfigNotModelled(note)
    micro, accumulation = _batch(config, target.world_size, micro_batch, global_batch)
    optimizer, optimizer_note = config_optimizer(config, base.optimizer)
    stage = int(zero.stage)
    section = section_of(config, ZERO)
    # the optimizer's temporaries are counted by name (settings.optimizer -> optimizers.optimizer_memory)
    knobs = ZeroKnobs.from_ds_config(section, model.hidden_size, stage, accumulation)
    settings = replace(
        base,
        precision=_precision(config, base.precision),
        reduce_bucket_elements=_reduce_bucket_elements(config),
        optimizer=optimizer,
        knobs=knobs,
    )
    # the modern memory mode the section runs (ratio, ZenFlow, ZeRO++, SuperOffload), cut by its sub_group_size
    mode, mode_notes = config_mode(section, rung)
    candidate = Candidate(rung, micro, grad_checkpointing, mode)
    predicted = estimate(model, target, candidate, settings)
    if mode.offload_ratio < 1.0 and not predicted.gpu_components.get("partial_offload_states"):
        per_rank = -(-model.trainable_params // target.world_size)
        mode_notes.append(moot_ratio_note(mode.offload_ratio, knobs.sub_group_size, per_rank))
    verdict = check_fit(predicted, target, headroom)
    notes = [n for n in (note, optimizer_note) if n] + mode_notes
    if isinstance(config.get("activation_checkpointing"), dict):
        notes.append(
            "the activation_checkpointing section acts only on models that call deepspeed.checkpointing;"
            " HF models checkpoint through gradient_checkpointing (--grad-checkpointing)"
        )
    if stage == 3:
        notes.append("assumes the model is built under deepspeed.zero.Init (HF Trainer and accelerate do)")
    if accumulation is None and stage == 1:
        notes.append("gradient accumulation not known: ZeRO-1's full-gradient buffer is counted")
    return ConfigFit(
        candidate,
        settings,
        predicted,
        verdict,
        limit_bytes=int(headroom * target.free_memory_bytes),
        pinned_host_bytes=_pinned(zero, predicted),
        notes=tuple(notes),
        mode_notes=tuple(mode_notes),
    )


def _pinned(zero: Any, predicted: MemoryEstimate) -> int:
    """Page-locked host bytes: offloaded states where the offload section sets pin_memory (DeepSpeed pins them,
    runtime/zero/offload_config.py), and the NVMe swap buffers, which are always pinned (swap_tensor/)."""
    from autotune.estimate.pinned import pinned_host_bytes

    sections = [s for s in (zero.offload_optimizer, zero.offload_param) if s is not None and str(s.device) != "none"]
    return pinned_host_bytes(predicted.host_components, any(getattr(s, "pin_memory", False) for s in sections))


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
    from autotune.request.context import runtime_stack

    base = EstimateSettings(
        seq_len=seq_len,
        precision="fp32",  # a bf16/fp16 section set to "auto" is sized as fp32 here, as before
        stack=runtime_stack(context.target, assumed.device if assumed else "cuda"),
        native_pinning=native_pinning(),  # what the job's DeepSpeed pins with mlock (estimate/pinned.py)
    )
    if assumed:
        base = replace(
            base,
            attention=assumed.attention,
            device=assumed.device,
            optimizer=assumed.optimizer,
            decoder_seq_len=assumed.decoder_seq_len,
            kernels=assumed.kernels,
        )
    try:
        fitted = predict_config(
            config,
            model,
            context.target,
            base,
            grad_checkpointing=grad_checkpointing,
            headroom=assumed.headroom if assumed else 0.9,
        )
    except ConfigNotModelled as why:
        return None, [Finding(Severity.INFO, "", f"Fit not checked: {why}.", "fit")]
    candidate, predicted, verdict = fitted.candidate, fitted.estimate, fitted.verdict
    if not verdict.fits and assumed and assumed.measured_peak_bytes is not None:
        limit = int(assumed.headroom * context.target.free_memory_bytes)
        if assumed.measured_peak_bytes <= limit:  # a trial ran this config here: measured beats predicted
            verdict = replace(verdict, fits=True, reason="", shortfall_bytes=0)
            predicted = replace(predicted, gpu_peak_bytes=assumed.measured_peak_bytes)
    notes = fitted.notes
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
    # a mode DeepSpeed ignores or that acts otherwise than written is said, as plan --config says it
    modes = [Finding(Severity.INFO, ZERO, f"Memory mode: {note}.", "fit") for note in fitted.mode_notes]
    kernels = kernels_note(assumed.kernels) if assumed else None
    said = [Finding(Severity.INFO, "", f"Kernels: {kernels}.", "fit")] if kernels else []
    return result, [finding, *modes, *said]
