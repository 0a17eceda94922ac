"""The plan-only recommendation: what `autotune plan` marks and what plan-only `tune` writes.

One function, so the two can never disagree: among the (rung, checkpointing) rows the memory model says
fit, each at the largest micro-batch of the request's grid that fits, the one with the highest prior
speed (speed.prior_speed: the ladder's documented order, checkpointing's extra forward pass, and the
per-step fixed cost a larger micro-batch amortises).

Host RAM is a limit like GPU memory (estimate.check_fit): probed when the GPUs are this machine's, given by
--host-memory when planning for another. When it is not known, a row that offloads to host RAM cannot be
checked, so a row that needs no offload is preferred when one fits, and the need is printed beside the pick.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.core.ladder import LADDER, Candidate
from autotune.estimate import MemoryEstimate, Plan, PlanRow, check_fit, estimate, plan
from autotune.modes.mode_summary import ModeSummary
from autotune.request.context import TuneContext
from autotune.search.speed import prior_speed
from autotune.tuning.for_context import planned_modes


@dataclass(frozen=True)
class Recommendation:
    plan: Plan
    candidate: Candidate | None  # None: nothing fits
    row: PlanRow | None  # the plan row the candidate comes from
    estimate: MemoryEstimate | None = None  # at the candidate's micro-batch (the row's may be larger)
    host_unknown: bool = False  # no host RAM limit was known: the pick's host need could not be checked
    passed_over: PlanRow | None = None  # a faster fit left out because its host offload could not be checked

    @property
    def grid_note(self) -> str:
        """Why the pick's micro-batch is below the row's largest fit, or ""."""
        if self.row is None or self.candidate is None or self.row.micro_batch == self.candidate.micro_batch:
            return ""
        return (
            f"micro-batch {self.row.micro_batch} is the largest that fits; {self.candidate.micro_batch} is the"
            " largest in the search grid at or below it"
        )


def largest_in_grid(grid: list[int], limit: int) -> int | None:
    return max((m for m in grid if m <= limit), default=None)


def offloads_to_host(candidate: Candidate) -> bool:
    """Optimizer states or parameters in host RAM: the rungs whose host need is large."""
    return candidate.rung.offload_optimizer == "cpu" or candidate.rung.offload_param == "cpu"


def fixed_micro_batch_plan(ctx: TuneContext, micro_batch: int) -> Plan:
    """Every rung evaluated at one micro-batch (plan --micro-batch): a row fits or not at exactly that size."""
    settings, target, headroom = ctx.settings, ctx.target, ctx.request.search.headroom
    rows = []
    for rung in LADDER:
        for checkpointing in (False, True):
            predicted = estimate(ctx.model, target, Candidate(rung, micro_batch, checkpointing), settings)
            verdict = check_fit(predicted, target, headroom)
            rows.append(PlanRow(rung, checkpointing, micro_batch if verdict.fits else None, predicted, verdict=verdict))
    return Plan(ctx.model, target, settings, headroom, global_batch=ctx.request.training.global_batch, rows=rows)


def plan_for(ctx: TuneContext) -> Plan:
    """The plan of `ctx`: searched micro-batches, or the request's fixed one."""
    if ctx.request.search.micro_batch is not None:
        return fixed_micro_batch_plan(ctx, ctx.request.search.micro_batch)
    return plan(
        ctx.model, ctx.target, ctx.settings, ctx.request.search.headroom, global_batch=ctx.request.training.global_batch
    )


def recommend(ctx: TuneContext) -> Recommendation:
    """Plan every rung for `ctx` and pick the fastest predicted to fit."""
    result = plan_for(ctx)
    options: list[tuple[Candidate, PlanRow]] = []
    for row in result.rows:
        micro_batch = largest_in_grid(ctx.grid, row.micro_batch) if row.micro_batch else None
        if micro_batch and row.rung in ctx.rungs:
            options.append((Candidate(row.rung, micro_batch, row.grad_checkpointing), row))
    host_unknown = ctx.target.host_ram_bytes is None and ctx.request.hardware.device != "cpu"
    if not options:
        return Recommendation(result, None, None, host_unknown=host_unknown)

    def preference(option: tuple[Candidate, PlanRow]) -> tuple[bool, float]:
        unchecked = host_unknown and offloads_to_host(option[0])
        return (not unchecked, prior_speed(option[0]))

    candidate, row = max(options, key=preference)
    fastest, fastest_row = max(options, key=lambda option: prior_speed(option[0]))
    at_pick = row.estimate
    if candidate.micro_batch != row.estimate.candidate.micro_batch:
        at_pick = estimate(ctx.model, ctx.target, candidate, ctx.settings)
    passed_over = fastest_row if fastest != candidate else None
    return Recommendation(result, candidate, row, at_pick, host_unknown=host_unknown, passed_over=passed_over)


def mode_summary(ctx: TuneContext) -> ModeSummary:
    """The modern modes for `ctx` as predictions (the search's own plan-only records): shown beside the pick,
    never in its place."""

    return ModeSummary.from_records(planned_modes(ctx))


def host_line(recommendation: Recommendation) -> str:
    """The pick's host RAM (and NVMe) need per node, against the limit when one is known; "" when nothing fits."""
    from autotune.core.units import format_bytes
    from autotune.estimate.pinned import pinned_host_bytes

    predicted, target = recommendation.estimate, recommendation.plan.target
    if predicted is None or predicted.device == "cpu":
        return ""
    pinned = pinned_host_bytes(predicted.host_components)  # dsconfig writes pin_memory true for every offload
    need = f"host RAM {format_bytes(predicted.host_ram_bytes)} per node"
    if pinned:
        need += f" ({format_bytes(pinned)} of it pinned: pin_memory)"
    if predicted.nvme_bytes:
        need += f", NVMe {format_bytes(predicted.nvme_bytes)} per node"
    if target.host_ram_bytes is None:
        return f"needs {need}; not checked: host RAM of the nodes not known (pass --host-memory)"
    origin = "available here" if target.measured else "given by --host-memory"
    return f"needs {need}, within the {format_bytes(target.host_ram_bytes)} {origin}"


def passed_over_line(recommendation: Recommendation) -> str:
    """Why a faster fit was not picked (its host offload could not be checked), or ""."""
    from autotune.core.units import format_bytes

    passed = recommendation.passed_over
    if passed is None:
        return ""
    return (
        f"{passed.rung.label} (micro-batch {passed.micro_batch}) is predicted faster but needs host RAM"
        f" {format_bytes(passed.estimate.host_ram_bytes)} per node, which is not known here: preferred a config"
        " without host offload (--host-memory lets it be checked)"
    )
