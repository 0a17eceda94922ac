"""The default trial budget (`--max-trials` when not given): derived from what the search spends, not a flat number.

The search stops by itself once no untried candidate can beat the best measured one; the trial budget only stops one
that goes on longer, so it must leave every group the trials its walk needs. What the walk spends:

- every (rung, checkpointing) group and every (mode, checkpointing) group is walked once (ladder_walk.py
  LadderWalk.walk, mode_walk.py ModeWalk.walk) unless the memory model rules it out or a measured group bounds it;
- a group's walk: its first trial at the micro-batch the memory model predicts measures two points of the group's
  memory line (the micro-batch and half of it, TrialResult.smaller_peak_point), and the next trial goes where that
  measured line crosses the limit (state.py SearchState.peak_line, ladder_walk.py next_micro_batch): one trial to
  seed the group, one to correct the model's guess (on the simulated cluster: 70 of 111 walked groups took one
  trial, 38 two, 3 three; benchmarks/records/search-defaults_sim_2026-11-29.md);
- a partial-offload ratio has its own cap, RATIO_MICRO_BATCHES x RATIO_TRIES per checkpointing setting (mode_walk.py);
- after the walk, one trial confirms the pick's micro-batch boundary (pick_decision.py Pick.confirm_boundary) and a
  close call is re-measured in ROUNDS interleaved rounds of the pick and its runner-up (pick_decision.py);
- the pick's fresh-process confirmation runs outside the trial budget (Pick.confirm_fresh): no term.

Measured on the simulated GPU cluster (15 scenarios, benchmarks/search_defaults.py): this budget never binds there
(every search stopped by itself within 17 budgeted trials) and keeps the pick at the integer-exhaustive best in all
15, where the former flat 12 lost the pick in 2 of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.core.ladder import Rung
from autotune.modes.applies import ModeOption
from autotune.modes.search_view import is_ratio_mode
from autotune.search.mode_walk import RATIO_MICRO_BATCHES, RATIO_TRIES
from autotune.search.pick_decision import ROUNDS

CHECKPOINTING_SETTINGS = 2  # ladder_walk.py LadderWalk.walk: each rung with and without gradient checkpointing
SEED_AND_CORRECTION = 2  # a group's first trial, and the one its measured memory line places (see above)
BOUNDARY_CONFIRMATION = 1  # pick_decision.py Pick.confirm_boundary: one trial at the pick's next micro-batch
CLOSE_CALL = 2 * ROUNDS  # pick_decision.py: ROUNDS interleaved rounds of the pick and its runner-up


@dataclass(frozen=True)
class SearchShape:
    """What the tuner knows before the first trial: the rungs, and the modes that apply and can run here."""

    rungs: int
    mode_groups: int  # applicable, trial-verifiable modes other than the offload ratio, one per (rung, mode)
    ratio_modes: int  # applicable, trial-verifiable partial-offload options, one per rung

    @property
    def groups(self) -> int:
        """(rung or mode, checkpointing) groups the walk may visit, the offload ratio apart."""
        return CHECKPOINTING_SETTINGS * (self.rungs + self.mode_groups)

    @property
    def ratio_trials(self) -> int:
        """The offload ratio's own cap (mode_walk.py): per rung and checkpointing setting."""
        return self.ratio_modes * CHECKPOINTING_SETTINGS * RATIO_MICRO_BATCHES * RATIO_TRIES


def search_shape(rungs: list[Rung], options: Iterable[ModeOption]) -> SearchShape:
    """Count the groups from the rungs and the mode options the search is given (modes.applies.considered_modes)."""
    runnable = [option for option in options if option.applies and option.trial_verifiable]
    ratio = sum(is_ratio_mode(option.mode) for option in runnable)
    return SearchShape(rungs=len(rungs), mode_groups=len(runnable) - ratio, ratio_modes=ratio)


def derived_max_trials(shape: SearchShape) -> int:
    """Two trials per group, the offload ratio's cap, the boundary confirmation and a close call (module docstring):
    33 for the 7 rungs of one node without modes."""
    return SEED_AND_CORRECTION * shape.groups + shape.ratio_trials + BOUNDARY_CONFIRMATION + CLOSE_CALL
