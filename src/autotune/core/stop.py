"""Why a tuning stopped: an enum the hook and the report decide on, never a message prefix."""

from __future__ import annotations

from enum import Enum


class StopReason(str, Enum):
    NO_BETTER = "no_better_candidate"  # the speed bounds say nothing left can beat the best measured config
    EXHAUSTED = "exhausted"  # every rung was ruled out or failed
    TRIAL_BUDGET = "trial_budget"  # --max-trials spent
    TIME_BUDGET = "time_budget"  # --time-budget spent
    TERMINATED = "terminated"  # SIGTERM mid-search: the best verified so far was written (infra/terminate.py)
    PLAN_ONLY = "plan_only"  # no trials on this machine: a plan-only recommendation
    CACHE_HIT = "cache_hit"  # answered from the results cache

    @property
    def cut_short(self) -> bool:
        """The search stopped before it could finish: its answer is the best so far, not the best."""
        return self in (StopReason.TRIAL_BUDGET, StopReason.TIME_BUDGET, StopReason.TERMINATED)
