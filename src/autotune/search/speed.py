"""Throughput reasoning for the search: which untried candidate could still beat the best measured one.

The ladder's order is NOT assumed to be the speed order: a candidate is dropped unmeasured only when a measured group
bounds it, through A1 (dominance between rungs, less the optimizer-pass saving of partitioning), A2 (checkpointing
costs at least 1 + layer share / 3), A3 (step time linear in micro-batch within a group) or A4 (a modern mode is
bounded only by its own measurements, save partial offload by ZeRO-3). The margin for noise is the measured spread:
a bound is taken at the fast end of its measurements' intervals and must fall below the low end of the best's.

Reasoning and sources: search/README.md#speed
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.ladder import Candidate, Mode, Rung

OPTIMIZER_BYTES_PER_PARAM = 28  # Adam pass: 16 bytes read + 12 written per fp32 parameter (deepspeed csrc/adam)

# A1 edges: rung -> rungs that do at least its work at the same micro-batch (README.md#speed).
DOMINATES: dict[Rung, tuple[Rung, ...]] = {
    Rung.Z0: (Rung.Z1,),
    Rung.Z1: (Rung.Z2,),
    Rung.Z2: (Rung.Z2_OFFLOAD_OPT,),
    Rung.Z3: (Rung.Z3_OFFLOAD_OPT,),
    Rung.Z3_OFFLOAD_OPT: (Rung.Z3_OFFLOAD_ALL,),
    Rung.Z3_OFFLOAD_ALL: (Rung.Z3_NVME_OPT,),
    Rung.Z3_NVME_OPT: (Rung.Z3_NVME_ALL,),
}

# Relative per-sample speed priors, used only to ORDER untried candidates and to pick a plan-only
# recommendation (the documented escalation ladder's order); they never prune: bounds come from
# measurements through A1-A3 above.
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
PRIOR_CHECKPOINTING_SPEED = 0.75  # prior only: 6N / 8N FLOPs per token
PRIOR_FIXED_SAMPLES = 1.0  # prior: per-step fixed cost worth one sample's compute


def prior_speed(candidate: Candidate) -> float:
    """Relative samples/s of a candidate before any trial (higher is faster); ordering only."""
    rung = PRIOR_RUNG_SPEED[candidate.rung.value]
    ckpt = PRIOR_CHECKPOINTING_SPEED if candidate.grad_checkpointing else 1.0
    mb = candidate.micro_batch
    return rung * ckpt * mb / (mb + PRIOR_FIXED_SAMPLES)


def dominated_rungs(rung: Rung) -> set[Rung]:
    """Every rung that does at least `rung`'s work at the same micro-batch (transitive closure of A1)."""
    seen: set[Rung] = set()
    frontier = [rung]
    while frontier:
        for nxt in DOMINATES.get(frontier.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def checkpointing_cost(total_params: int, embedding_params: int) -> float:
    """A2: lower bound on the per-sample cost factor of full checkpointing: 1 + (layer share) / 3."""
    share = max(0.0, min(1.0, (total_params - embedding_params) / max(1, total_params)))
    return 1.0 + share / 3.0


def optimizer_saving_s(total_params: int, world_size: int, bandwidth_gbs: float | None) -> float | None:
    """Most a partitioned optimizer can save per step over the unpartitioned one; None when unknown."""
    if not bandwidth_gbs:
        return None
    return OPTIMIZER_BYTES_PER_PARAM * total_params * (1 - 1 / max(1, world_size)) / (bandwidth_gbs * 1e9)


@dataclass(frozen=True)
class StepLine:
    """Per-rank micro-step seconds = fixed_s + per_sample_s * micro_batch, fitted on one group (A3)."""

    fixed_s: float
    per_sample_s: float

    def seconds(self, micro_batch: float) -> float:
        return self.fixed_s + self.per_sample_s * micro_batch


def fit_step_line(points: list[tuple[float, float]]) -> StepLine | None:
    """Least-squares line through (micro-batch, step seconds); None with fewer than two distinct x.

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
    return StepLine(fixed_s=max(0.0, mean_y - slope * mean_x), per_sample_s=slope)


@dataclass(frozen=True)
class GroupMeasurements:
    """What was measured for one (rung, checkpointing) group: (micro-batch, per-rank micro-step seconds), and how
    much faster than those medians its steps could be within their measured spread (`fast_end`: the largest median /
    interval low end over the group's trials; 1 when the steps had none)."""

    rung: Rung
    grad_checkpointing: bool
    points: tuple[tuple[int, float], ...]
    mode: Mode = field(default_factory=Mode)
    fast_end: float = 1.0


@dataclass(frozen=True)
class BoundContext:
    checkpointing_cost: float  # A2 factor for this model
    optimizer_saving_s: float | None  # partitioning's most saving per step; None: unknown


def _bounds(group: GroupMeasurements, other: Candidate, ctx: BoundContext) -> float | None:
    """Upper bound on `other`'s per-rank samples/s from one measured group, or None if it gives none."""
    if other.grad_checkpointing != group.grad_checkpointing and group.grad_checkpointing:
        return None  # A2 only bounds a checkpointed candidate by a non-checkpointed group
    if other.mode != group.mode and not _zero3_bounds_partial_offload(group, other):
        return None  # A4: a mode is bounded only by its own measurements
    if other.rung is not group.rung:
        if other.rung not in dominated_rungs(group.rung):
            return None
        saving = 0.0 if other.rung.stage == group.rung.stage else ctx.optimizer_saving_s
        if saving is None:
            return None
    else:
        saving = 0.0
    ckpt = ctx.checkpointing_cost if other.grad_checkpointing and not group.grad_checkpointing else 1.0
    line = fit_step_line([(float(mb), s) for mb, s in group.points])
    if line is not None:
        seconds = line.fixed_s + line.per_sample_s * other.micro_batch * ckpt
    else:  # A3 alone: the group's per-sample time at any micro-batch >= other's bounds other's from below
        at_or_above = [s / mb for mb, s in group.points if mb >= other.micro_batch]
        if not at_or_above:
            return None
        seconds = min(at_or_above) * other.micro_batch * ckpt
    seconds -= saving
    return other.micro_batch / seconds if seconds > 0 else None


def _partial_offload_only(mode: Mode) -> bool:
    return mode.offload_ratio != 1.0 and Mode(offload_ratio=mode.offload_ratio) == mode


def _zero3_bounds_partial_offload(group: GroupMeasurements, other: Candidate) -> bool:
    """A4's exception: classic ZeRO-3 (nothing offloaded) measured, a partial optimizer offload candidate."""
    return (
        group.mode.is_classic
        and group.rung.offload_optimizer is None
        and _partial_offload_only(other.mode)
        and other.rung in dominated_rungs(group.rung)
    )


def could_beat(
    best: tuple[float, float], groups: list[GroupMeasurements], other: Candidate, ctx: BoundContext, *, loses_ties: bool
) -> tuple[bool, str]:
    """Whether `other` (at its largest reachable micro-batch) might still become the pick over the best measured.

    `best` is the best's interval per rank (measurement.Speed low and high). A measured group bounds `other` through
    A1-A3, taken at the fast end of the group's own spread (`fast_end`). The pick rule (pick_decision.decide) says
    what that bound must clear: a candidate the rule places after the best in a tie (`loses_ties`: less simple)
    becomes the pick only by beating it, its interval wholly above the best's, so it is dropped once its bound is no
    higher than the best's high end; any other candidate could take the pick in a tie, so it is dropped only once its
    bound is below the best's low end. The margin for noise is the spread measured, not a fixed one.
    """
    bounds = [(bound * g.fast_end, g) for g in groups if (bound := _bounds(g, other, ctx)) is not None]
    if not bounds:
        return True, ""
    bound, group = min(bounds, key=lambda item: item[0])
    low, high = best
    if bound <= high if loses_ties else bound < low:
        mode = "" if group.mode.is_classic else f"/{'+'.join(group.mode.parts)}"
        source = f"{group.rung.value}{'/ckpt' if group.grad_checkpointing else ''}{mode}"
        clears = f"{high:.2f}, the best's high end, and it would lose a tie" if loses_ties else f"{low:.2f} measured"
        return False, (
            f"cannot beat the best measured: at micro-batch {other.micro_batch} the measurements of {source}"
            f" bound it at {bound:.2f} samples/s per rank (their spread included) <= {clears}"
        )
    return True, ""
