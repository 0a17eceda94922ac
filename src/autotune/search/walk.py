"""The search's entry point: walk the ladder fastest-first, find each rung's largest micro-batch with real trials,
then the modern modes from the budget left, and pick beyond noise; stop once no remaining candidate can beat the best
measured one.

`Search` keeps the constructor every caller uses and is a thin facade: it builds the one state (`state.py`) and the
collaborators that act on it, the ladder walk (`ladder_walk.py`), the mode walk (`mode_walk.py`) and the pick
(`pick_decision.py`), and runs them in order. Pure logic: trials arrive through an injected `run` callable, so the
same search serves real DeepSpeed trials, cached results and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from autotune.core.ladder import Rung
from autotune.estimate.estimate_types import Calibration, EstimateSettings
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.search_view import ModeRecord, ModesFor, no_modes
from autotune.search.ladder_walk import LadderWalk
from autotune.search.memory_model import MemoryModel
from autotune.search.mode_walk import ModeWalk
from autotune.search.pick_decision import Pick
from autotune.search.records import RunTrial, SearchEvent, SearchLimits, SearchOutcome
from autotune.search.relations import same_group
from autotune.search.state import SearchState

# What a caller builds a search with, importable from the entry point (tests/fakes, benchmarks/gpu_sim).
__all__ = ["MemoryModel", "Search", "same_group"]


@dataclass
class Search:
    """One tuning search; `run` executes a candidate for real (or replays it from the cache)."""

    model: ModelSummary
    target: Target
    settings: EstimateSettings
    run: RunTrial
    rungs: list[Rung]
    micro_batches: list[int]  # eligible micro-batches, ascending (global-batch divisibility already applied)
    limits: SearchLimits = field(default_factory=SearchLimits)
    observe: Callable[[SearchEvent], None] = lambda event: None
    calibration: Calibration = field(default_factory=Calibration)
    clock: Callable[[], float] = time.monotonic
    global_batch: int | None = None  # fixed global batch: accumulation scales with 1 / micro-batch
    modes: ModesFor = no_modes  # the memory modes to consider per rung (autotune.modes.applies); default: classic only
    offload_ratios: tuple[float, ...] = ()  # the offload ratio's real settings, ascending (see search_modes)
    memory: MemoryModel = field(default_factory=MemoryModel)
    # Runs a candidate in a process of its own, as the user's job starts, where `run` uses warm workers whose
    # device memory no fresh process has confirmed (GPUs): the pick is confirmed there before it is recommended
    # (`Pick.confirm_fresh`). None: `run` already measures as the job will (a fresh process per trial, or the CPU
    # backend's warm workers, measured equal to fresh ones).
    confirm_fresh: RunTrial | None = None

    # The state and its collaborators are built at first use, from the fields as they are then: a field set after
    # construction (a test swaps the memory model or the modes) is the one the walk uses, as it always was.
    @cached_property
    def state(self) -> SearchState:
        """The walk's one state, from this search's fields; the time budget counts from here."""
        return SearchState(
            model=self.model,
            target=self.target,
            settings=self.settings,
            run=self.run,
            rungs=self.rungs,
            micro_batches=self.micro_batches,
            limits=self.limits,
            observe=self.observe,
            calibration=self.calibration,
            clock=self.clock,
            global_batch=self.global_batch,
            modes=self.modes,
            offload_ratios=self.offload_ratios,
            memory=self.memory,
            confirm_fresh=self.confirm_fresh,
        )

    @cached_property
    def ladder(self) -> LadderWalk:
        """The classic ladder's walk over the state."""
        return LadderWalk(self.state)

    @cached_property
    def mode_walk(self) -> ModeWalk:
        """The modern modes' walk over the state; it walks a mode's rung with the ladder walk."""
        return ModeWalk(self.state, self.ladder)

    @cached_property
    def pick(self) -> Pick:
        """The pick's steps over the state; it continues the pick's group with the ladder walk."""
        return Pick(self.state, self.ladder)

    @property
    def outcome(self) -> SearchOutcome:
        """What the search has recorded so far (complete once `run_search` returns)."""
        return self.state.outcome

    @property
    def limit_bytes(self) -> int:
        """The device memory a trial's peak must stay within: the headroom's share of the free memory."""
        return self.state.limit_bytes

    def run_search(self) -> SearchOutcome:
        """The classic ladder first, exactly as without modes; then each applicable mode on its rung, from the
        budget left (a mode never takes a trial the classic ladder would have had); then the pick over everything
        measured, modes included: its boundary confirmed, the close call settled, its memory confirmed fresh."""
        groups = [(rung, ckpt) for rung in self.rungs for ckpt in (False, True)]
        options = self.mode_walk.consider_modes()
        self.ladder.walk(groups)
        self.mode_walk.walk(groups, options)
        self.pick.confirm_boundary()
        self.pick.settle_close_call()
        self.pick.confirm_fresh()
        self.mode_walk.finish_records()
        return self.state.finish()

    def plan_modes(self) -> list[ModeRecord]:
        """Plan-only (no trials on this machine): every mode predicted on every rung, nothing launched."""
        return self.mode_walk.plan_modes()
