"""The plan-only recommendation: what `autotune plan` marks and what plan-only `tune` writes.

One function, so the two can never disagree: among the (rung, checkpointing) rows the memory model says
fit, each at the largest micro-batch of the request's grid that fits, the one with the highest prior
speed (speed.prior_speed: the ladder's documented order, checkpointing's extra forward pass, and the
per-step fixed cost a larger micro-batch amortises).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.context import TuneContext
from autotune.estimate import Plan, PlanRow, plan
from autotune.ladder import Candidate
from autotune.speed import prior_speed


@dataclass(frozen=True)
class Recommendation:
    plan: Plan
    candidate: Candidate | None  # None: nothing fits
    row: PlanRow | None  # the plan row the candidate comes from


def largest_in_grid(grid: list[int], limit: int) -> int | None:
    return max((m for m in grid if m <= limit), default=None)


def recommend(ctx: TuneContext) -> Recommendation:
    """Plan every rung for `ctx` and pick the fastest predicted to fit."""
    result = plan(ctx.model, ctx.target, ctx.settings, ctx.request.headroom, ctx.request.global_batch)
    options: list[tuple[Candidate, PlanRow]] = []
    for row in result.rows:
        micro_batch = largest_in_grid(ctx.grid, row.micro_batch) if row.micro_batch else None
        if micro_batch and row.rung in ctx.rungs:
            options.append((Candidate(row.rung, micro_batch, row.grad_checkpointing), row))
    if not options:
        return Recommendation(result, None, None)
    candidate, row = max(options, key=lambda option: prior_speed(option[0]))
    return Recommendation(result, candidate, row)
