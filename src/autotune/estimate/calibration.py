"""Learn from real trials: a per-sample (activation) scale and a fixed offset.

Each measured trial is one observation: measured = fixed + offset + scale * variable, where fixed and
variable are the uncalibrated prediction's micro-batch-independent and -dependent parts. The slope comes
only from trials of the same rung and checkpointing at different micro-batches (a fixed-effects fit),
because the fixed parts of different rungs carry different errors; the offset is set so the latest
trial's group is predicted exactly, since runtime overheads carry over to the next rung.
"""

from __future__ import annotations

from autotune.estimate.core import VARIABLE_COMPONENTS, estimate
from autotune.estimate.types import Calibration, EstimateSettings
from autotune.hardware import Target
from autotune.ladder import Candidate
from autotune.models import ModelSummary

MIN_SCALE = 0.2
MAX_SCALE = 5.0


def _group(key: str) -> str:
    """Candidate key without its micro-batch: 'z2/mb4/ckpt' -> 'z2/ckpt'."""
    rung, _, checkpointing = key.split("/")
    return f"{rung}/{checkpointing}"


def _fit_scale(observations: list[dict], prior: float) -> float:
    """Within-group least squares slope of (measured - fixed) against variable."""
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


def calibrate(
    calibration: Calibration,
    model: ModelSummary,
    target: Target,
    candidate: Candidate,
    settings: EstimateSettings,
    measured_peak_bytes: int,
) -> Calibration:
    """A new Calibration that also explains this trial's measured peak; the input is left unchanged."""
    raw = estimate(model, target, candidate, settings)
    variable = sum(raw.gpu_components.get(name, 0) for name in VARIABLE_COMPONENTS)
    observation = {
        "key": candidate.key,
        "fixed": raw.gpu_peak_bytes - variable,
        "variable": variable,
        "measured": int(measured_peak_bytes),
    }
    observations = [o for o in calibration.observations if o["key"] != candidate.key] + [observation]
    scale = _fit_scale(observations, calibration.activation_scale)
    latest_group = [o for o in observations if _group(o["key"]) == _group(candidate.key)]
    offset = sum(o["measured"] - o["fixed"] - scale * o["variable"] for o in latest_group) / len(latest_group)
    return Calibration(
        activation_scale=scale,
        overhead_bytes=round(offset),
        samples=calibration.samples + 1,
        observations=observations,
    )
