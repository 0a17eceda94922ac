"""Throughput reasoning for the search: which untried candidate could still beat the best measured one.

Three ordering assumptions, from DeepSpeed's documented escalation ladder, let the search stop early:
  A1. at the same micro-batch and checkpointing, a later rung is never faster than an earlier one
      (each rung adds communication or host traffic);
  A2. at the same rung and micro-batch, gradient checkpointing costs at least one extra forward pass:
      ~8N instead of ~6N FLOPs per token, so at most 3/4 of the speed (measured on the CPU backend:
      0.61); only this direction is used, so a candidate without checkpointing is never pruned by
      a line measured with it;
  A3. per-sample speed grows with micro-batch, as step time = fixed + per_sample * micro_batch.
A later candidate can therefore only win through a larger micro-batch, and by no more than the
step-time line fitted on the measured group allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.ladder import Candidate

CHECKPOINTING_SPEED = 0.75  # 6N / 8N FLOPs per token: recompute adds one forward pass
BOUND_SLACK = 0.05  # a bound must clear the best measured speed by this much before a candidate is dropped

# Relative per-sample speed priors, used only to order untried candidates and to pick a plan-only
# recommendation; they encode the ladder's documented order, not a measurement, and measured trials
# replace them. They decrease along the ladder, as A1 assumes.
PRIOR_RUNG_SPEED = {
    "z0": 1.0,
    "z1": 0.99,
    "z2": 0.97,
    "z2+offload_opt": 0.6,
    "z3": 0.55,
    "z3+offload_opt": 0.45,
    "z3+offload_opt+param": 0.3,
    "z3+nvme_opt": 0.15,
    "z3+nvme_opt+param": 0.1,
}
PRIOR_FIXED_SAMPLES = 1.0  # prior: per-step fixed cost worth one sample's compute


def prior_speed(candidate: Candidate) -> float:
    """Relative samples/s of a candidate before any trial (higher is faster)."""
    rung = PRIOR_RUNG_SPEED[candidate.rung.value]
    ckpt = CHECKPOINTING_SPEED if candidate.grad_checkpointing else 1.0
    mb = candidate.micro_batch
    return rung * ckpt * mb / (mb + PRIOR_FIXED_SAMPLES)


def work_units(candidate: Candidate) -> float:
    """Samples' worth of compute in one step: checkpointing makes each sample cost 1/CHECKPOINTING_SPEED."""
    return candidate.micro_batch / (CHECKPOINTING_SPEED if candidate.grad_checkpointing else 1.0)


@dataclass(frozen=True)
class StepLine:
    """Per-rank micro-step seconds = fixed_s + per_unit_s * work_units, fitted on one group's trials (A3)."""

    fixed_s: float
    per_unit_s: float

    def samples_per_s(self, candidate: Candidate) -> float:
        return candidate.micro_batch / (self.fixed_s + self.per_unit_s * work_units(candidate))


def fit_step_line(points: list[tuple[float, float]]) -> StepLine | None:
    """Least-squares line through (work units, step seconds); None with fewer than two distinct x.

    The fixed part is clamped at zero (a negative intercept is noise) and the slope must be positive.
    """
    distinct = {x for x, _ in points}
    if len(distinct) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(t for _, t in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (t - mean_y) for x, t in points)
    slope = sxy / sxx
    if slope <= 0:
        return None
    return StepLine(fixed_s=max(0.0, mean_y - slope * mean_x), per_unit_s=slope)


def could_beat(
    best: Candidate, best_samples_per_s: float, best_line: StepLine | None, other: Candidate
) -> tuple[bool, str]:
    """Whether `other` (at its largest reachable micro-batch) might be faster than the best measured config.

    Speeds are per rank (samples/s divided by world size), the unit of `best_line`.
    `best_line` is fitted on the best config's rung; by A1 it bounds every later rung. An earlier rung
    is always worth a look.
    """
    if other.rung.order < best.rung.order or (best.grad_checkpointing and not other.grad_checkpointing):
        return True, ""
    if other.micro_batch <= best.micro_batch:  # A1 + A2: no faster per sample, and no larger micro-batch
        return False, (
            f"cannot beat {best.key}: no faster per sample and its largest micro-batch ({other.micro_batch})"
            f" is not above {best.micro_batch}"
        )
    if best_line is None:
        return True, ""
    bound = best_line.samples_per_s(other)
    if bound * (1 + BOUND_SLACK) <= best_samples_per_s:
        return False, (
            f"cannot beat {best.key}: even at micro-batch {other.micro_batch} the step-time line fitted on"
            f" {best.rung.value} bounds it at {bound:.2f} samples/s per rank < {best_samples_per_s:.2f} measured"
        )
    return True, ""
