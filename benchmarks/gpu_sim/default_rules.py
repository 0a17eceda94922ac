"""Candidate default limits for `autotune tune` (issue 45), each a rule a tuner could apply, for search_defaults.py.

A rule gives the search its --max-trials and --time-budget from what the tuner knows before the first trial (the
rungs it searches, the modes that apply, the device), or after the first trial (its wall). The derived trial
budgets count what the search's own structure spends (src/autotune/search/):

- `walk.py run_search`: every (rung, checkpointing) group is walked once, `_rung_group`, unless the memory model
  rules it out or a measured group bounds it (speed.py A1-A4); then each applicable mode on its rung the same way
  (`mode_walk.py _mode_group`); a partial-offload ratio costs at most RATIO_MICRO_BATCHES x RATIO_TRIES trials per
  checkpointing setting (mode_walk.py);
- a group's walk: its first trial at the predicted boundary measures two points of the group's memory line (the
  micro-batch and half of it, `TrialResult.smaller_peak_point`), and `_next_micro_batch` puts the next trial where
  that measured line crosses the limit (`_peak_line`): one trial to seed the group, one to correct the model's
  guess; a third only where the line is not straight;
- after the walk: one boundary confirmation for the pick (`pick_walk.py _confirm_boundary`, one trial at the next
  micro-batch), and a close call's interleaved re-measurement, ROUNDS rounds of the two candidates
  (`close_call.py`, 2 x 2 trials);
- the pick's fresh-process confirmation runs outside the trial budget (`pick_walk.py _confirm_fresh`), so no term.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.core.ladder import Rung
from autotune.modes.applies import ModeOption
from autotune.modes.search_view import is_ratio_mode
from autotune.search.mode_walk import RATIO_MICRO_BATCHES, RATIO_TRIES
from autotune.search.pick_decision import ROUNDS

CHECKPOINTING_SETTINGS = 2  # walk.py run_search: every rung with and without gradient checkpointing
BOUNDARY_CONFIRMATION = 1  # pick_walk.py _confirm_boundary: one trial at the pick's next micro-batch
CLOSE_CALL = 2 * ROUNDS  # close_call.py settle: ROUNDS interleaved rounds of the pick and its runner-up
SEED_AND_CORRECTION = 2  # a group's first trial, and the one its measured memory line places (walk.py _peak_line)


@dataclass(frozen=True)
class SearchShape:
    """What the tuner knows before the first trial: the rungs, and the modes that apply and can be run here."""

    rungs: int
    mode_groups: int  # applicable, trial-verifiable non-ratio modes, one per (rung, mode)
    ratio_modes: int  # applicable, trial-verifiable partial-offload options, one per rung

    @property
    def groups(self) -> int:
        """(rung or mode, checkpointing) groups the walk may visit, ratio modes apart."""
        return CHECKPOINTING_SETTINGS * (self.rungs + self.mode_groups)

    @property
    def ratio_trials(self) -> int:
        """Partial offload's own cap (mode_walk.py): per rung and checkpointing setting."""
        return self.ratio_modes * CHECKPOINTING_SETTINGS * RATIO_MICRO_BATCHES * RATIO_TRIES


def search_shape(rungs: list[Rung], options: dict[Rung, list[ModeOption]]) -> SearchShape:
    """Count the groups from the options the Search is given (autotune.modes.applies.considered_modes)."""
    runnable = [o for rung in rungs for o in options.get(rung, []) if o.applies and o.trial_verifiable]
    ratio = sum(is_ratio_mode(o.mode) for o in runnable)
    return SearchShape(rungs=len(rungs), mode_groups=len(runnable) - ratio, ratio_modes=ratio)


def one_per_group(shape: SearchShape) -> int:
    """Every group's first trial, partial offload's cap, the boundary confirmation and a close call."""
    return shape.groups + shape.ratio_trials + BOUNDARY_CONFIRMATION + CLOSE_CALL


def two_per_group(shape: SearchShape) -> int:
    """Every group's first trial and the one its measured line places, partial offload's cap, the boundary
    confirmation and a close call."""
    return SEED_AND_CORRECTION * shape.groups + shape.ratio_trials + BOUNDARY_CONFIRMATION + CLOSE_CALL


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


# `autotune tune`'s defaults at commit 90893db, for GPU and CPU alike: request/tune_request.py TUNE_TIME_BUDGET_S
# and SearchAsk.max_trials (tests/test_search_defaults.py checks them while they stand).
TODAY_TIME_BUDGET_S = 600.0
TODAY_MAX_TRIALS = 12

# A budget of K x the run's *mean* trial wall is K trials exactly (n walls summed over their mean is n), so it is
# the trial budget again and is not a rule of its own; K x the *first* trial's wall is (first_trial_units).
RULES = (
    Rule("unbounded", "no trial or time budget: what the search needs", _fixed(None)),
    Rule("today", "600 s and 12 trials, for GPU and CPU alike", _fixed(TODAY_MAX_TRIALS), TODAY_TIME_BUDGET_S),
    Rule("12 trials", "(b) today's trial budget, no time budget on GPUs", _fixed(TODAY_MAX_TRIALS)),
    Rule("one per group", "(a) a trial per group + boundary + close call, no time budget", one_per_group),
    Rule("two per group", "(a) seed and line correction per group + boundary + close call", two_per_group),
    Rule("two per group, 600 s", "(a) with today's 600 s kept on GPUs", two_per_group, TODAY_TIME_BUDGET_S),
    Rule(
        "two per group, 600 s, no cut",
        "(d) as above, the trial running at the deadline finishes",
        two_per_group,
        TODAY_TIME_BUDGET_S,
        cut_at_deadline=False,
    ),
    Rule(
        "two per group as first-trial walls",
        "(c) the two-per-group count as time: that many first-trial walls (at least 600 s)",
        two_per_group,
        TODAY_TIME_BUDGET_S,
        first_trial_units=two_per_group,
    ),
)
