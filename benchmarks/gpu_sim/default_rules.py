"""Candidate default limits for `autotune tune` (issue 45), each a rule a tuner could apply, for search_defaults.py.

A rule gives the search its --max-trials and --time-budget from what the tuner knows before the first trial (the
rungs it searches, the modes that apply, the device), or after the first trial (its wall). The trial budget the code
adopted (commit 1abdede) is src's own rule, read from there: `autotune.search.trial_budget` (`SearchShape`,
`search_shape`, `derived_max_trials` and the constants its docstring sources), so the simulator measures the rule
the tuner applies, not a copy of it. The other rules are comparisons built on the same constants: one trial per
group instead of two, the derived count spent as first-trial walls, and the defaults the code had before (commit
90893db: 12 trials and 600 s for GPU and CPU alike).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.core.ladder import Rung
from autotune.modes.applies import ModeOption
from autotune.search.trial_budget import (
    BOUNDARY_CONFIRMATION,
    CLOSE_CALL,
    SearchShape,
    derived_max_trials,
    search_shape,
)


def scenario_shape(rungs: list[Rung], options: dict[Rung, list[ModeOption]]) -> SearchShape:
    """src's `search_shape` over the options the Search is given per rung (the simulator passes them by rung)."""
    return search_shape(rungs, [option for rung in rungs for option in options.get(rung, [])])


def one_per_group(shape: SearchShape) -> int:
    """A comparison: every group's first trial only (no line correction), with the derived rule's other terms."""
    return shape.groups + shape.ratio_trials + BOUNDARY_CONFIRMATION + CLOSE_CALL


@dataclass(frozen=True)
class Rule:
    """One candidate default: --max-trials from the search's shape (None: unbounded) and --time-budget in seconds
    (None: none). `first_trial_units`: instead, a time budget of that many first-trial walls (the tuner knows the
    first wall after trial 1; never below `time_budget_s` when both are given). `cut_at_deadline`: False lets the
    trial running at the deadline finish (the search still launches none after it)."""

    name: str
    why: str
    max_trials: Callable[[SearchShape], int | None]
    time_budget_s: float | None = None
    first_trial_units: Callable[[SearchShape], int | None] | None = None
    cut_at_deadline: bool = True

    def budget_s(self, shape: SearchShape, first_trial_s: float) -> float | None:
        units = self.first_trial_units(shape) if self.first_trial_units else None
        if units is None:
            return self.time_budget_s
        return max(self.time_budget_s or 0.0, units * first_trial_s)


def _fixed(trials: int | None) -> Callable[[SearchShape], int | None]:
    return lambda shape: trials


# `autotune tune`'s defaults at commit 90893db, for GPU and CPU alike (request/tune_request.py TUNE_TIME_BUDGET_S and
# SearchAsk.max_trials of that commit); commit 1abdede replaced them. The 600 s lives on as the CPU's default
# (request/tune_request.py CPU_TUNE_TIME_BUDGET_S), which is why the 600 s comparisons below still mean something.
FORMER_TIME_BUDGET_S = 600.0
FORMER_MAX_TRIALS = 12
FORMER = "90893db defaults"
DERIVED = "derived (1abdede default)"

# A budget of K x the run's *mean* trial wall is K trials exactly (n walls summed over their mean is n), so it is
# the trial budget again and is not a rule of its own; K x the *first* trial's wall is (first_trial_units).
RULES = (
    Rule("unbounded", "no trial or time budget: what the search needs", _fixed(None)),
    Rule(
        FORMER,
        "commit 90893db: 600 s and 12 trials, for GPU and CPU alike",
        _fixed(FORMER_MAX_TRIALS),
        FORMER_TIME_BUDGET_S,
    ),
    Rule("12 trials", "(b) 90893db's trial budget, no time budget on GPUs", _fixed(FORMER_MAX_TRIALS)),
    Rule("one per group", "(a) a trial per group + boundary + close call, no time budget", one_per_group),
    Rule(DERIVED, "src's derived_max_trials, no time budget: `autotune tune`'s GPU default", derived_max_trials),
    Rule("derived, 600 s", "(a) with the 600 s kept on GPUs", derived_max_trials, FORMER_TIME_BUDGET_S),
    Rule(
        "derived, 600 s, no cut",
        "(d) as above, the trial running at the deadline finishes",
        derived_max_trials,
        FORMER_TIME_BUDGET_S,
        cut_at_deadline=False,
    ),
    Rule(
        "derived as first-trial walls",
        "(c) the derived count as time: that many first-trial walls (at least 600 s)",
        derived_max_trials,
        FORMER_TIME_BUDGET_S,
        first_trial_units=derived_max_trials,
    ),
)
