"""One search's state and the primitives every part of the walk shares.

`SearchState` holds what the search was given (the model, target, settings, limits, the `run` callable, the rungs,
the micro-batch grid, the modes, the memory model) and what it learns (the outcome with its trials and skips, the
calibration, the launches, the timeouts). The ladder walk (`ladder_walk.py`), the mode walk (`mode_walk.py`) and the
pick (`pick_decision.py`) each hold this one object and act on it only through its fields and methods here, so mypy
checks every use and a rename is caught everywhere. Where the outcome's pick changes, `set_pick` does it.

Pure logic: trials arrive through the injected `run`, so the same state serves real DeepSpeed trials, cached results
and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.measurement import StepStats, speed_of
from autotune.core.stop import StopReason
from autotune.estimate import check_fit
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.search_view import ModesFor, no_modes
from autotune.search.memory_model import MemoryModel
from autotune.search.records import (
    MEMORY_FAILURES,
    TRY_MARGIN,
    LaunchPurpose,
    RunTrial,
    SearchEvent,
    SearchLimits,
    SearchOutcome,
    SkipRecord,
    TrialRecord,
    Verdict,
)
from autotune.search.relations import holds_at_least_the_memory_of, same_group, simplicity
from autotune.search.speed import (
    BoundContext,
    GroupMeasurements,
    StepLine,
    checkpointing_cost,
    could_beat,
    dominated_rungs,
    fit_step_line,
    optimizer_saving_s,
)
from autotune.trial.trial_types import TrialResult


def largest_where(values: list[int], holds: Callable[[int], bool]) -> int | None:
    """Largest of `values` (ascending) for which `holds`, a predicate true up to some point and false after it
    (memory that grows with the micro-batch); None when it holds for none. log2(len) calls."""
    low, high, found = 0, len(values) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if holds(values[middle]):
            found, low = values[middle], middle + 1
        else:
            high = middle - 1
    return found


@dataclass(kw_only=True)
class SearchState:
    """What one search was given and what it has learnt so far (see the module docstring)."""

    # what it was given (autotune.search.walk.Search's fields)
    model: ModelSummary
    target: Target
    settings: EstimateSettings
    run: RunTrial
    rungs: list[Rung]
    micro_batches: list[int]  # eligible micro-batches, ascending (global-batch divisibility already applied)
    limits: SearchLimits
    observe: Callable[[SearchEvent], None]
    calibration: Calibration  # where it starts; each measured peak or OOM refines it (`trial`)
    clock: Callable[[], float] = time.monotonic
    global_batch: int | None = None  # fixed global batch: accumulation scales with 1 / micro-batch
    modes: ModesFor = no_modes
    offload_ratios: tuple[float, ...] = ()
    memory: MemoryModel = field(default_factory=MemoryModel)
    confirm_fresh: RunTrial | None = None  # the pick's fresh-process run (autotune.search.walk.Search)
    # what follows from it, and what the walk learns
    limit_bytes: int = field(init=False)
    host_limit_bytes: int | None = field(init=False)
    outcome: SearchOutcome = field(init=False)
    started: float = field(init=False)  # the clock at the start: the time budget counts from here
    launched: int = field(init=False, default=0)
    timed_out: list[Candidate] = field(init=False, default_factory=list)  # never re-run, nor anything slower
    bound_context: BoundContext = field(init=False)

    def __post_init__(self) -> None:
        self.limit_bytes = int(self.limits.headroom * self.target.free_memory_bytes)
        # GPU trials: the node's host RAM is held to the same headroom (the CPU backend's per-rank budget
        # already is host memory, so it needs no second limit).
        host_ram = self.target.host_ram_bytes
        self.host_limit_bytes = (
            int(self.limits.headroom * host_ram) if host_ram and self.settings.device != "cpu" else None
        )
        self.outcome = SearchOutcome(best=None, calibration=self.calibration)
        self.started = self.clock()
        self.bound_context = BoundContext(
            checkpointing_cost=checkpointing_cost(self.model.total_params, self.model.embedding_params),
            optimizer_saving_s=optimizer_saving_s(
                self.model.total_params, self.target.world_size, self.target.gpu.memory_bandwidth_gbs
            ),
        )

    # -- predictions -------------------------------------------------------------------------------
    def estimate(self, candidate: Candidate) -> MemoryEstimate:
        """The memory model's prediction, calibrated on this run's measured peaks."""
        return self.memory.estimate(self.model, self.target, candidate, self.settings, calibration=self.calibration)

    def fits_with(self, candidate: Candidate, calibration: Calibration, margin: float = TRY_MARGIN) -> bool:
        """Whether the model under `calibration` (this run's, or a more pessimistic one) puts the peak within
        (1 + margin) of the limit."""
        predicted = self.memory.estimate(self.model, self.target, candidate, self.settings, calibration=calibration)
        return predicted.gpu_peak_bytes <= self.limit_bytes * (1 + margin)

    def predicted_max(self, rung: Rung, ckpt: bool, margin: float, mode: Mode = Mode()) -> int | None:
        """Largest eligible micro-batch whose predicted peak is within (1 + margin) of the limit (with no margin,
        also within check_fit's own margins). Memory grows with the micro-batch, so a bisection is exact and the
        integer grid costs log2(len) predictions, not one per micro-batch."""

        def fits(mb: int) -> bool:
            if self.measured_over(Candidate(rung, mb, ckpt, mode)):
                return False
            predicted = self.estimate(Candidate(rung, mb, ckpt, mode))
            if predicted.gpu_peak_bytes > self.limit_bytes * (1 + margin):
                return False
            return margin > 0 or check_fit(predicted, self.target, self.limits.headroom).fits

        return largest_where(self.micro_batches, fits)

    def measured_over(self, candidate: Candidate) -> Candidate | None:
        """A candidate that measured over the device memory limit (an OOM on the device, or a peak over the
        headroom) and that `candidate` needs at least the memory of (`holds_at_least_the_memory_of`): then
        `candidate` cannot fit either, whatever the model predicts. Host-side failures say nothing of the device."""
        for t in self.outcome.trials:
            device_failure = t.memory_failure and not t.over_host_headroom
            if not device_failure or not (t.result.ok or self.modelled_memory_failed(t.result)):
                continue
            if holds_at_least_the_memory_of(candidate, t.candidate):
                return t.candidate
        return None

    def modelled_memory_failed(self, result: TrialResult) -> bool:
        """Whether the memory the model predicts (device memory; host RSS on the CPU backend) is what ran out. On a
        GPU run a host-side failure (a failed pinned host allocation, the host's OOM) says nothing about the
        device, so it must not push the device prediction up (trial/outcome.py classifies them). A GPU trial over
        budget stopped itself over the device limit after warm-up (TrialSpec.stop_over_bytes)."""
        return self.settings.device == "cpu" or result.status in ("oom_gpu", "over_budget")

    def measured_true_peak(self, result: TrialResult) -> bool:
        """Whether the result's peak is the trial's own, not a bound: a run that finished, or a GPU trial stopped over
        the limit after its warm-up, whose boundary steps reached a real step's peak (TrialSpec.stop_over_bytes). A
        CPU trial over budget was stopped at its cap as it passed it, and reports the cap."""
        return result.ok or (result.status == "over_budget" and self.settings.device != "cpu")

    def peak_line(self, candidate: Candidate) -> StepLine | None:
        """Peak bytes = intercept + slope x micro-batch, fitted on the measured peaks of `candidate`'s group (two
        micro-batches at least; one trial gives two where its smaller micro-batch's peak was measured apart,
        TrialResult.smaller_peak_point). The calibration pools its slope over every group of the same
        checkpointing (autotune.estimate.calibration); within one group the measured line is the better guide to
        where the limit falls."""
        points: list[tuple[float, float]] = []
        for t in self.outcome.trials:
            peak = t.result.peak_memory_bytes
            if same_group(t.candidate, candidate) and peak and self.measured_true_peak(t.result) and not t.from_cache:
                points.append((float(t.candidate.micro_batch), float(peak)))
                if (smaller := t.result.smaller_peak_point) is not None:
                    points.append((float(smaller[0]), float(smaller[1])))
        return fit_step_line(points)

    # -- budget ------------------------------------------------------------------------------------
    def budget_spent(self) -> tuple[StopReason, str] | None:
        """Which budget is spent, and the reason in words; None while budget is left."""
        if self.launched >= self.limits.max_trials:
            return StopReason.TRIAL_BUDGET, f"trial budget spent ({self.limits.max_trials} trials)"
        budget = self.limits.time_budget_s
        if budget is not None and self.clock() - self.started >= budget:
            return StopReason.TIME_BUDGET, f"time budget spent ({budget:.0f} s)"
        return None

    def stop_if_spent(self) -> str:
        """Record the stop on the outcome when a budget is spent; the reason in words, else ''."""
        spent = self.budget_spent()
        if spent is None:
            return ""
        self.outcome.stop_reason, self.outcome.stop_message = spent
        return spent[1]

    def finish(self) -> SearchOutcome:
        """The stop reason when no budget stopped the walk: the best could not be beaten, or nothing fitted."""
        if self.outcome.stop_reason is None:
            if self.outcome.best:
                self.outcome.stop_reason = StopReason.NO_BETTER
                self.outcome.stop_message = "no remaining candidate can beat the best measured"
            else:
                self.outcome.stop_reason = StopReason.EXHAUSTED
                self.outcome.stop_message = "every rung was ruled out or failed"
        return self.outcome

    # -- trials and skips --------------------------------------------------------------------------
    def would_time_out(self, candidate: Candidate) -> Candidate | None:
        """A timed-out candidate that does no more work than this one (same or dominating rung, same or
        smaller micro-batch, checkpointing no less): this one would time out too."""
        for slow in self.timed_out:
            same_or_more_work = candidate.rung is slow.rung or candidate.rung in dominated_rungs(slow.rung)
            if (
                same_or_more_work
                and candidate.mode == slow.mode  # a mode changes the work: only its own timeouts bound it
                and candidate.micro_batch >= slow.micro_batch
                and (candidate.grad_checkpointing or not slow.grad_checkpointing)
            ):
                return slow
        return None

    def trial(
        self, candidate: Candidate, purpose: str = LaunchPurpose.FIRST, run: RunTrial | None = None
    ) -> TrialRecord:
        """Run `candidate` (through `run`, else the search's own), record it, and learn its memory: a measured
        peak calibrates the model, an OOM of the modelled memory bounds it from below. One a timeout already
        answers (`would_time_out`) is recorded without a launch."""
        predicted = self.estimate(candidate)
        if slow := self.would_time_out(candidate):
            result = TrialResult(status="timeout", error=f"not run: {slow.key} timed out earlier in this run")
            record = TrialRecord(
                candidate, result, predicted.gpu_peak_bytes, self.limit_bytes, from_cache=True, purpose=purpose
            )
            self.outcome.trials.append(record)
            return record
        self.observe(SearchEvent("trial_start", candidate, predicted.candidate.describe()))
        result, cached = (run or self.run)(candidate)
        self.launched += 0 if cached else 1
        if result.status == "timeout":
            self.timed_out.append(candidate)
        record = TrialRecord(
            candidate,
            result,
            predicted.gpu_peak_bytes,
            self.limit_bytes,
            from_cache=cached,
            host_limit_bytes=self.host_limit_bytes,
            gpus_per_node=self.target.gpus_per_node,
            purpose=purpose,
        )
        self.outcome.trials.append(record)
        self._learn_memory(candidate, result)
        self.observe(SearchEvent("trial_end", candidate, result.status, record))
        return record

    def _learn_memory(self, candidate: Candidate, result: TrialResult) -> None:
        """Calibrate on a measured peak, or on the lower bound an OOM of the modelled memory gives."""
        peak = result.peak_memory_bytes
        if peak and (result.ok or result.status == "over_budget"):
            self.calibration = self.memory.calibrate(
                self.calibration, self.model, self.target, candidate, settings=self.settings, measured_peak_bytes=peak
            )
            self.outcome.calibration = self.calibration
        elif result.status in MEMORY_FAILURES and self.modelled_memory_failed(result):
            # no peak, but a lower bound: it needed more than the memory it had
            limit = self.target.free_memory_bytes
            self.calibration = self.memory.calibrate_oom(
                self.calibration, self.model, self.target, candidate, settings=self.settings, limit_bytes=limit
            )
            self.outcome.calibration = self.calibration

    def skip(self, rung: Rung, ckpt: bool, reason: str, mode: Mode = Mode()) -> None:
        """Record a group left without (further) trials, and say why."""
        self.outcome.skipped.append(SkipRecord(rung, ckpt, reason, mode))
        self.observe(SearchEvent("skip", Candidate(rung, self.micro_batches[0], ckpt, mode), reason))

    # -- the pick ----------------------------------------------------------------------------------
    def set_pick(self, best: TrialRecord | None, verdict: Verdict | None = None) -> None:
        """The one place the outcome's pick changes: the best record, and the verdict with its margin and spread
        (none while the walk only keeps the fastest so far, or once a pick is dropped)."""
        self.outcome.best, self.outcome.verdict = best, verdict
        self.outcome.margin = verdict.margin if verdict else None
        self.outcome.noise = verdict.spread if verdict else None

    def consider_best(self, record: TrialRecord) -> None:
        """The walk's pick so far: the fastest record that fitted (the pick beyond noise is settled at the end)."""
        best = self.outcome.best
        speed = record.result.samples_per_s or 0.0
        if best is None or speed > (best.result.samples_per_s or 0.0):
            self.set_pick(record)

    # -- speed bounds ------------------------------------------------------------------------------
    def bounded(self, candidate: Candidate) -> str:
        """Why the measurements so far say `candidate` cannot reach the best measured; '' when it might."""
        best = self.outcome.best
        if best is None:
            return ""
        speed = speed_of(best.result.step_times_s, best.result.samples_per_s)
        median = best.result.samples_per_s or 0.0
        low, high = (speed.low, speed.high) if speed is not None else (median, median)
        world = self.target.world_size  # per rank, like the line
        loses_ties = simplicity(candidate) > simplicity(best.candidate)
        groups = self.measured_groups()
        beatable, why = could_beat(
            (low / world, high / world), groups, candidate, self.bound_context, loses_ties=loses_ties
        )
        return "" if beatable else why

    def measured_groups(self) -> list[GroupMeasurements]:
        """Per (rung, checkpointing, mode): (micro-batch, per-rank micro-step seconds) of every trial that fitted,
        with the second point each launch timed at a smaller micro-batch, and the group's fast end (the largest
        median / interval low end of its trials' steps: how much faster they could be within their spread)."""
        points: dict[tuple[Rung, bool, Mode], list[tuple[int, float]]] = {}
        fast_end: dict[tuple[Rung, bool, Mode], float] = {}
        for t in self.outcome.trials:
            if t.within_headroom and t.result.samples_per_s:
                key = (t.candidate.rung, t.candidate.grad_checkpointing, t.candidate.mode)
                points.setdefault(key, []).append((t.candidate.micro_batch, self._micro_step_seconds(t)))
                if smaller := self._smaller_point(t):
                    points[key].append(smaller)
                stats = StepStats.of(t.result.step_times_s)
                spread = stats.median_s / stats.low_s if stats is not None else 1.0
                fast_end[key] = max(fast_end.get(key, 1.0), spread)
        return [
            GroupMeasurements(rung, ckpt, tuple(p), mode, fast_end=fast_end[(rung, ckpt, mode)])
            for (rung, ckpt, mode), p in points.items()
        ]

    def _smaller_point(self, record: TrialRecord) -> tuple[int, float] | None:
        """The launch's second point as it would run on its own: its whole step where the launch timed one (no
        accumulation at either micro-batch), else its micro-step plus its share of the optimizer step (with a fixed
        global batch the smaller micro-batch accumulates more steps)."""
        r = record.result
        if r.smaller_micro_batch and r.smaller_step_s:
            return r.smaller_micro_batch, r.smaller_step_s
        if not (r.smaller_micro_batch and r.smaller_micro_step_s and r.optimizer_step_s is not None):
            return None
        accumulation: float = max(1, r.accumulation)
        if self.global_batch is not None:
            accumulation = accumulation * record.candidate.micro_batch / r.smaller_micro_batch
        return r.smaller_micro_batch, r.smaller_micro_step_s + r.optimizer_step_s / accumulation

    def _micro_step_seconds(self, record: TrialRecord) -> float:
        """Seconds per micro-batch on one rank; independent of gradient accumulation and world size."""
        return record.candidate.micro_batch * self.target.world_size / (record.result.samples_per_s or 1.0)
