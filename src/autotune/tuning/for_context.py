"""The search for one tuning context: its rungs, grid, limits, global batch and the modes that apply here.

Shared by `tune()` (with real trials) and the plan-only recommendation (with none: the memory model's
predictions only), so both walk the very same search.
"""

from __future__ import annotations

from collections.abc import Callable

from autotune.core.ladder import Candidate
from autotune.modes.applies import ModeFacts, considered_modes, facts_for, ratio_grid
from autotune.modes.search_view import ModeRecord
from autotune.request.context import TuneContext
from autotune.search.records import RunTrial, SearchEvent, SearchLimits
from autotune.search.trial_budget import derived_max_trials, search_shape
from autotune.search.walk import Search
from autotune.training.optimizers import optimizer_kind
from autotune.trial.trial_types import TrialResult


def mode_facts(ctx: TuneContext) -> ModeFacts:
    """What autotune.modes.applies needs to decide which modes apply to this tuning run."""
    request = ctx.request
    ds_optimizer = optimizer_kind(request.training.optimizer).ds_type is not None
    return facts_for(
        ctx.target,
        request.hardware.device,
        ds_optimizer,
        ctx.precision,
        allow_approximate=request.search.allow_approximate,
    )


def trial_budget(ctx: TuneContext) -> int:
    """--max-trials where given; else the budget this run's rungs and modes need (search/trial_budget.py)."""
    given = ctx.request.search.max_trials
    if given is not None:
        return given
    facts = mode_facts(ctx)
    options = [option for rung in ctx.rungs for option in considered_modes(rung, facts)]
    return derived_max_trials(search_shape(ctx.rungs, options))


def never_run(candidate: Candidate) -> tuple[TrialResult, bool]:
    """The trial runner of a plan: a search that reaches a trial here is a bug, not a measurement."""
    raise AssertionError(f"plan-only: no trial may run ({candidate.key})")


def planned_modes(ctx: TuneContext) -> list[ModeRecord]:
    """Plan-only: the modes considered per rung with the memory model's prediction, none trial-verified."""
    return context_search(ctx, never_run).plan_modes()


def context_search(
    ctx: TuneContext,
    run: RunTrial,
    observe: Callable[[SearchEvent], None] = lambda event: None,
    confirm_fresh: RunTrial | None = None,
    time_left_s: float | None = None,
) -> Search:
    """The search for this context: its rungs, grid, limits, global batch and the modes that apply here;
    `confirm_fresh` runs the pick in a process of its own where `run` uses warm workers (Search.confirm_fresh);
    `time_left_s`: what is left of --time-budget when the search starts (the tune spent the rest), default all."""
    request = ctx.request
    budget = request.search.time_budget_s if time_left_s is None else time_left_s
    facts = mode_facts(ctx)
    return Search(
        ctx.model,
        ctx.target,
        ctx.settings,
        run,
        rungs=ctx.rungs,
        micro_batches=ctx.grid,
        limits=SearchLimits(trial_budget(ctx), budget, request.search.headroom),
        observe=observe,
        global_batch=request.training.global_batch,
        modes=lambda rung: considered_modes(rung, facts),
        offload_ratios=tuple(r for r in ratio_grid() if 0.0 < r < 1.0),
        confirm_fresh=confirm_fresh,
    )
