"""Learn from real trials: a per-sample (activation) scale per checkpointing setting and a fixed offset.

Each measured trial is one observation: measured = fixed + offset + scale * variable, where fixed and
variable are the uncalibrated prediction's micro-batch-independent and -dependent parts. The slope comes
only from trials of the same rung and checkpointing at different micro-batches (a fixed-effects fit),
because the fixed parts of different rungs carry different errors; the offset is set so the latest
trial's group is predicted exactly, since runtime overheads carry over to the next rung.

Each checkpointing setting has its own slope, fitted on its own trials and lifted by its own OOM bounds. Full
checkpointing keeps each layer's input instead of its activations and rebuilds one layer at a time in backward: a
different memory structure. Without it every layer keeps all its intermediates, so whatever the model misses or
overcounts inside a layer (a kernel that keeps an fp32 copy or a mask, a fused op that keeps less) counts once per
layer; with it those intermediates live for one layer's window, and the per-sample bytes are mostly layer inputs and
logits. One measured ratio therefore does not hold for the other setting (on tests/fakes/machines.py's
SimulatedMachine, gpt2-large: 0.69x the model without checkpointing, 1.02x with it). Until a setting's own trial has
run, it borrows the other's slope (Calibration.activation_scale): the offset was fitted together with that slope, and
what both settings share (the logits, the allocator's fragmentation, memory the model does not know of) is in it.

A trial that ran out of memory is a lower bound: its peak was above the memory it had. `calibrate_oom` keeps
it, and every fit afterwards is lifted until the bound holds: through its setting's slope when a smaller
micro-batch of the same group ran (the line from that success must clear the bound), else through the offset.
The next guess then moves by what the model now says, not by one step of a grid.
"""

from __future__ import annotations

from autotune.core.ladder import Candidate
from autotune.estimate.estimate_types import Calibration, EstimateSettings, checkpointing_setting, setting_of_key
from autotune.estimate.peak import VARIABLE_COMPONENTS, estimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary

MIN_SCALE = 0.2
MAX_SCALE = 5.0
# An OOM says only "above the limit"; the bound is placed this far above it so that the next guess clears it.
OOM_CLEARANCE = 0.02


def _group(key: str) -> str:
    """Candidate key without its micro-batch: 'z2/mb4/ckpt' -> 'z2/ckpt'; a mode stays in the group
    ('z3+offload_opt/mb4/nockpt/ratio0.3' -> 'z3+offload_opt/nockpt/ratio0.3')."""
    parts = key.split("/")
    return "/".join(parts[:1] + parts[2:])


def _fit_scale(observations: list[dict], prior: float) -> float:
    """Within-group least squares slope of (measured - fixed) against variable, over one setting's observations."""
    groups: dict[str, list[dict]] = {}
    for observation in observations:
        groups.setdefault(_group(observation["key"]), []).append(observation)
    numerator = denominator = 0.0
    for members in groups.values():
        mean_v = sum(o["variable"] for o in members) / len(members)
        mean_r = sum(o["measured"] - o["fixed"] for o in members) / len(members)
        for o in members:
            numerator += (o["variable"] - mean_v) * (o["measured"] - o["fixed"] - mean_r)
            denominator += (o["variable"] - mean_v) ** 2
    if denominator <= 0:
        return prior
    return min(MAX_SCALE, max(MIN_SCALE, numerator / denominator))


def _split(model: ModelSummary, target: Target, candidate: Candidate, settings: EstimateSettings) -> tuple[int, int]:
    """(micro-batch-independent, micro-batch-dependent) bytes of the uncalibrated prediction."""
    raw = estimate(model, target, candidate, settings)
    variable = sum(raw.gpu_components.get(name, 0) for name in VARIABLE_COMPONENTS)
    return raw.gpu_peak_bytes - variable, variable


def _enforce_bounds(
    scale: float, offset: float, observations: list[dict], bounds: list[dict], group: str
) -> tuple[float, float]:
    """Lift (scale, offset) until every OOM bound of `group` is predicted above its limit; `scale` is the slope of
    the group's checkpointing setting."""
    for bound in sorted((b for b in bounds if _group(b["key"]) == group), key=lambda b: b["variable"]):
        needed = bound["limit"] * (1 + OOM_CLEARANCE)
        if bound["fixed"] + offset + scale * bound["variable"] >= needed:
            continue
        below = [o for o in observations if _group(o["key"]) == group and o["variable"] < bound["variable"]]
        if below:
            anchor = max(below, key=lambda o: o["variable"])
            anchored = anchor["measured"] - anchor["fixed"]  # offset + scale * variable at the success
            slope = (needed - bound["fixed"] - anchored) / (bound["variable"] - anchor["variable"])
            scale = min(MAX_SCALE, max(scale, slope))
            offset = anchored - scale * anchor["variable"]
        if bound["fixed"] + offset + scale * bound["variable"] < needed:
            offset = needed - bound["fixed"] - scale * bound["variable"]
    return scale, offset


def _with_scale(calibration: Calibration, setting: str, scale: float) -> dict[str, float]:
    """The calibration's slopes with `setting`'s set; the other setting's stays as its own trials left it."""
    return {**calibration.activation_scales, setting: scale}


def calibrate_oom(
    calibration: Calibration,
    model: ModelSummary,
    target: Target,
    candidate: Candidate,
    settings: EstimateSettings,
    limit_bytes: int,
) -> Calibration:
    """A new Calibration that knows `candidate` needs more than `limit_bytes` (it ran out of memory)."""
    fixed, variable = _split(model, target, candidate, settings)
    bound = {"key": candidate.key, "fixed": fixed, "variable": variable, "limit": int(limit_bytes)}
    bounds = [b for b in calibration.oom_bounds if b["key"] != candidate.key] + [bound]
    group = _group(candidate.key)
    scale, offset = _enforce_bounds(
        calibration.activation_scale(candidate.grad_checkpointing),
        calibration.overhead_bytes,
        calibration.observations,
        bounds,
        group=group,
    )
    return Calibration(
        activation_scales=_with_scale(calibration, checkpointing_setting(candidate.grad_checkpointing), scale),
        overhead_bytes=round(offset),
        samples=calibration.samples + 1,
        observations=list(calibration.observations),
        oom_bounds=bounds,
    )


def calibrate(
    calibration: Calibration,
    model: ModelSummary,
    target: Target,
    candidate: Candidate,
    settings: EstimateSettings,
    measured_peak_bytes: int,
) -> Calibration:
    """A new Calibration that also explains this trial's measured peak; the input is left unchanged. Only the
    slope of the trial's checkpointing setting is refitted."""
    fixed, variable = _split(model, target, candidate, settings)
    observation = {"key": candidate.key, "fixed": fixed, "variable": variable, "measured": int(measured_peak_bytes)}
    observations = [o for o in calibration.observations if o["key"] != candidate.key] + [observation]
    setting = checkpointing_setting(candidate.grad_checkpointing)
    same_setting = [o for o in observations if setting_of_key(o["key"]) == setting]
    scale = _fit_scale(same_setting, calibration.activation_scale(candidate.grad_checkpointing))
    latest_group = [o for o in observations if _group(o["key"]) == _group(candidate.key)]
    offset = sum(o["measured"] - o["fixed"] - scale * o["variable"] for o in latest_group) / len(latest_group)
    bounds = [b for b in calibration.oom_bounds if b["key"] != candidate.key]  # it ran: no longer a bound
    scale, offset = _enforce_bounds(scale, offset, observations, bounds, group=_group(candidate.key))
    return Calibration(
        activation_scales=_with_scale(calibration, setting, scale),
        overhead_bytes=round(offset),
        samples=calibration.samples + 1,
        observations=observations,
        oom_bounds=bounds,
    )
