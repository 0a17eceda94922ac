"""The plan: for every rung of the ladder, with and without gradient checkpointing, the largest
micro-batch predicted to fit, its memory, and why the rung does not fit when it does not."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from autotune.core.ladder import LADDER, Candidate, Rung
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate, Verdict
from autotune.estimate.peak import check_fit, estimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary


def eligible_micro_batches(world_size: int, global_batch: int | None, limit: int) -> list[int]:
    """Micro-batches 1..limit; with a global batch, only those that divide it evenly across ranks."""
    if global_batch is None:
        return list(range(1, limit + 1))
    return [m for m in range(1, limit + 1) if global_batch % (m * world_size) == 0]


def largest_micro_batch(
    model: ModelSummary,
    target: Target,
    rung: Rung,
    grad_checkpointing: bool,
    settings: EstimateSettings,
    headroom: float = 0.9,
    calibration: Calibration | None = None,
    global_batch: int | None = None,
    limit: int = 1024,
) -> int | None:
    """Largest eligible micro-batch predicted to fit; None when not even the smallest does.

    Memory grows with the micro-batch, so a binary search over the eligible values is exact.
    """
    candidates = eligible_micro_batches(target.world_size, global_batch, limit)

    def fits(micro_batch: int) -> bool:
        predicted = estimate(
            model, target, Candidate(rung, micro_batch, grad_checkpointing), settings, calibration=calibration
        )
        return check_fit(predicted, target, headroom).fits

    low, high = 0, len(candidates) - 1
    best: int | None = None
    while low <= high:
        middle = (low + high) // 2
        if fits(candidates[middle]):
            best = candidates[middle]
            low = middle + 1
        else:
            high = middle - 1
    return best


@dataclass(frozen=True)
class PlanRow:
    rung: Rung
    grad_checkpointing: bool
    micro_batch: int | None  # largest that fits; None when none does
    estimate: MemoryEstimate  # at micro_batch, or at 1 when none fits
    verdict: Verdict

    def to_dict(self) -> dict:
        return {
            "rung": self.rung.value,
            "label": self.rung.label,
            "grad_checkpointing": self.grad_checkpointing,
            "micro_batch": self.micro_batch,
            "estimate": self.estimate.to_dict(),
            "verdict": asdict(self.verdict),
        }


@dataclass(frozen=True)
class Plan:
    model: ModelSummary
    target: Target
    settings: EstimateSettings
    headroom: float
    global_batch: int | None
    rows: list[PlanRow]

    @property
    def fitting_rows(self) -> list[PlanRow]:
        return [row for row in self.rows if row.micro_batch is not None]

    def to_dict(self) -> dict:
        summary = self.model.to_dict()
        summary.pop("config", None)
        return {
            "model": summary,
            "target": self.target.to_dict(),
            "settings": asdict(self.settings),
            "headroom": self.headroom,
            "global_batch": self.global_batch,
            "rows": [row.to_dict() for row in self.rows],
        }


def _indivisible(global_batch: int | None, world_size: int, headroom: float) -> str:
    return (
        f"no micro-batch that fits within {headroom:.0%} divides global batch {global_batch}"
        f" across {world_size} rank(s)"
    )


def plan(
    model: ModelSummary,
    target: Target,
    settings: EstimateSettings,
    headroom: float = 0.9,
    global_batch: int | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """One row per (rung, checkpointing) in ladder order, checkpointing off before on."""
    rows = []
    for rung in LADDER:
        for checkpointing in (False, True):
            micro_batch = largest_micro_batch(
                model,
                target,
                rung,
                checkpointing,
                settings=settings,
                headroom=headroom,
                calibration=calibration,
                global_batch=global_batch,
            )
            predicted = estimate(
                model, target, Candidate(rung, micro_batch or 1, checkpointing), settings, calibration=calibration
            )
            verdict = check_fit(predicted, target, headroom)
            if micro_batch is None and verdict.fits:  # memory allows micro-batch 1, the global batch does not
                verdict = Verdict(False, _indivisible(global_batch, target.world_size, headroom), 0, "global_batch")
            rows.append(PlanRow(rung, checkpointing, micro_batch, predicted, verdict=verdict))
    return Plan(model, target, settings, headroom, global_batch=global_batch, rows=rows)
