"""Throughput reasoning for the search: which untried candidate could still beat the best measured one.

Three ordering assumptions, from DeepSpeed's documented escalation ladder, let the search stop early:
  A1. at the same micro-batch and checkpointing, a later rung is never faster than an earlier one
      (each rung adds communication or host traffic);
  A2. at the same rung and micro-batch, gradient checkpointing is slower (it recomputes the forward:
      ~8N instead of ~6N FLOPs per token, so at best 3/4 of the speed);
  A3. per-sample speed grows with micro-batch, as step time = fixed + per_sample * micro_batch.
A later candidate can therefore only win through a larger micro-batch, and by no more than the
step-time line fitted on the measured group allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.ladder import Candidate

CHECKPOINTING_SPEED = 0.75  # 6N / 8N FLOPs per token: recompute adds one forward pass

# Relative per-sample speed priors, used only to order untried candidates and to pick a plan-only
# recommendation; they encode the ladder's documented order, not a measurement, and measured trials
# replace them.
PRIOR_RUNG_SPEED = {
    "z0": 1.0,
    "z1": 0.99,
    "z2": 0.97,
    "z2+offload_opt": 0.5,
    "z3": 0.85,
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


@dataclass(frozen=True)
class StepLine:
    """step_seconds = fixed_s + per_sample_s * micro_batch, fitted on one (rung, checkpointing) group."""

    fixed_s: float
    per_sample_s: float

    def samples_per_s(self, micro_batch: int, speed_factor: float = 1.0) -> float:
        return micro_batch / (self.fixed_s + self.per_sample_s * micro_batch / speed_factor)


def fit_step_line(points: list[tuple[int, float]]) -> StepLine | None:
    """Least-squares line through (micro_batch, step seconds); None with fewer than two micro-batches.

    The fixed part is clamped at zero (a negative intercept is noise) and the slope kept positive.
    """
    distinct = {mb for mb, _ in points}
    if len(distinct) < 2:
        return None
    n = len(points)
    mean_x = sum(mb for mb, _ in points) / n
    mean_y = sum(t for _, t in points) / n
    sxx = sum((mb - mean_x) ** 2 for mb, _ in points)
    sxy = sum((mb - mean_x) * (t - mean_y) for mb, t in points)
    slope = sxy / sxx
    if slope <= 0:
        return None
    intercept = max(0.0, mean_y - slope * mean_x)
    return StepLine(fixed_s=intercept, per_sample_s=slope)


def no_faster_per_sample(best: Candidate, other: Candidate) -> bool:
    """A1 + A2: `other` is at best as fast as `best` at any equal micro-batch."""
    later_or_same_rung = other.rung.order >= best.rung.order
    ckpt_no_better = other.grad_checkpointing or not best.grad_checkpointing
    return later_or_same_rung and ckpt_no_better


def could_beat(
    best: Candidate, best_samples_per_s: float, best_line: StepLine | None, other: Candidate, other_max_micro_batch: int
) -> tuple[bool, str]:
    """Whether `other`, at up to `other_max_micro_batch`, might be faster than the best measured config."""
    if not no_faster_per_sample(best, other):
        return True, ""
    if other_max_micro_batch <= best.micro_batch:
        return False, (
            f"cannot beat {best.key}: no faster per sample and its largest micro-batch ({other_max_micro_batch})"
            f" is not above {best.micro_batch}"
        )
    if best_line is None:
        return True, ""
    factor = CHECKPOINTING_SPEED if other.grad_checkpointing and not best.grad_checkpointing else 1.0
    bound = best_line.samples_per_s(other_max_micro_batch, factor)
    if bound <= best_samples_per_s:
        return False, (
            f"cannot beat {best.key}: even at micro-batch {other_max_micro_batch} the step-time line fitted on"
            f" {best.rung.value} bounds it at {bound:.2f} samples/s <= {best_samples_per_s:.2f} measured"
        )
    return True, ""
