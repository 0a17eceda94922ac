"""The search: walk the ladder fastest-first, find each rung's largest micro-batch with real trials,
and stop once no remaining candidate can beat the best measured one.

Pure logic: trials arrive through an injected `run` callable, so the same loop serves real DeepSpeed
trials, cached results and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.estimate import calibrate, calibrate_oom, check_fit, estimate
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate
from autotune.estimate.peak import memlock_problem
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.search_view import ModesFor, no_modes
from autotune.search.mode_walk import ModeWalk
from autotune.search.pick_walk import PickWalk
from autotune.search.records import (
    MEMORY_FAILURES,
    RULED_OUT_MARGIN,
    TRY_MARGIN,
    LaunchPurpose,
    RunTrial,
    SearchEvent,
    SearchLimits,
    SearchOutcome,
    SkipRecord,
    TrialRecord,
)
from autotune.search.relations import holds_at_least_the_memory_of, same_group
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


class EstimateFn(Protocol):
    """autotune.estimate.estimate's signature: what a memory model the search is given must accept."""

    def __call__(
        self,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        calibration: Calibration | None = None,
    ) -> MemoryEstimate: ...


class CalibrateFn(Protocol):
    """autotune.estimate.calibrate's signature (a measured peak)."""

    def __call__(
        self,
        calibration: Calibration,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        measured_peak_bytes: int,
    ) -> Calibration: ...


class CalibrateOomFn(Protocol):
    """autotune.estimate.calibrate_oom's signature (a lower bound: it ran out of memory)."""

    def __call__(
        self,
        calibration: Calibration,
        model: ModelSummary,
        target: Target,
        candidate: Candidate,
        settings: EstimateSettings,
        limit_bytes: int,
    ) -> Calibration: ...


@dataclass(frozen=True)
class MemoryModel:
    """The memory model the search predicts and learns with; the real one by default, a fake in tests. Typed by
    the real functions' signatures, so mypy checks every call the search makes, keywords included."""

    estimate: EstimateFn = estimate
    calibrate: CalibrateFn = calibrate
    calibrate_oom: CalibrateOomFn = calibrate_oom


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


@dataclass
class Search(ModeWalk, PickWalk):
    """One tuning search; `run` executes a candidate for real (or replays it from the cache). The classic ladder
    is walked here, the modern modes after it by `ModeWalk` (mode_walk.py), over the same state."""

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
    # (`_confirm_fresh`). None: `run` already measures as the job will (a fresh process per trial, or the CPU
    # backend's warm workers, measured equal to fresh ones).
    confirm_fresh: RunTrial | None = None

    def __post_init__(self) -> None:
        self.limit_bytes = int(self.limits.headroom * self.target.free_memory_bytes)
        # GPU trials: the node's host RAM is held to the same headroom (the CPU backend's per-rank budget
        # already is host memory, so it needs no second limit).
        host_ram = self.target.host_ram_bytes
        self.host_limit_bytes = (
            int(self.limits.headroom * host_ram) if host_ram and self.settings.device != "cpu" else None
        )
        self.outcome = SearchOutcome(best=None, calibration=self.calibration)
        self._started = self.clock()
        self._launched = 0
        self._timed_out: list[Candidate] = []  # remembered for the run: never re-run, nor anything slower
        self.bound_context = BoundContext(
            checkpointing_cost=checkpointing_cost(self.model.total_params, self.model.embedding_params),
            optimizer_saving_s=optimizer_saving_s(
                self.model.total_params, self.target.world_size, self.target.gpu.memory_bandwidth_gbs
            ),
        )

    # -- predictions -------------------------------------------------------------------------------
    def _estimate(self, candidate: Candidate) -> MemoryEstimate:
        return self.memory.estimate(self.model, self.target, candidate, self.settings, calibration=self.calibration)

    def _predicted_max(self, rung: Rung, ckpt: bool, margin: float, mode: Mode = Mode()) -> int | None:
        """Largest eligible micro-batch whose predicted peak is within (1 + margin) of the limit (with no margin,
        also within check_fit's own margins). Memory grows with the micro-batch, so a bisection is exact and the
        integer grid costs log2(len) predictions, not one per micro-batch."""

        def fits(mb: int) -> bool:
            if self._measured_over(Candidate(rung, mb, ckpt, mode)):
                return False
            predicted = self._estimate(Candidate(rung, mb, ckpt, mode))
            if predicted.gpu_peak_bytes > self.limit_bytes * (1 + margin):
                return False
            return margin > 0 or check_fit(predicted, self.target, self.limits.headroom).fits

        return largest_where(self.micro_batches, fits)

    def _measured_over(self, candidate: Candidate) -> Candidate | None:
        """A candidate that measured over the device memory limit (an OOM on the device, or a peak over the
        headroom) and that `candidate` needs at least the memory of (`holds_at_least_the_memory_of`): then
        `candidate` cannot fit either, whatever the model predicts. Host-side failures say nothing of the device."""
        for t in self.outcome.trials:
            device_failure = t.memory_failure and not t.over_host_headroom
            if not device_failure or not (t.result.ok or self._modelled_memory_failed(t.result)):
                continue
            if holds_at_least_the_memory_of(candidate, t.candidate):
                return t.candidate
        return None

    # -- budget ------------------------------------------------------------------------------------
    def _budget_spent(self) -> tuple[StopReason, str] | None:
        """Which budget is spent, and the reason in words; None while budget is left."""
        if self._launched >= self.limits.max_trials:
            return StopReason.TRIAL_BUDGET, f"trial budget spent ({self.limits.max_trials} trials)"
        budget = self.limits.time_budget_s
        if budget is not None and self.clock() - self._started >= budget:
            return StopReason.TIME_BUDGET, f"time budget spent ({budget:.0f} s)"
        return None

    def _budget_left(self) -> str:
        spent = self._budget_spent()
        return spent[1] if spent else ""

    def _stop_if_spent(self) -> str:
        """Record the stop on the outcome when a budget is spent; the reason in words, else ''."""
        spent = self._budget_spent()
        if spent is None:
            return ""
        self.outcome.stop_reason, self.outcome.stop_message = spent
        return spent[1]

    # -- trials ------------------------------------------------------------------------------------
    def _would_time_out(self, candidate: Candidate) -> Candidate | None:
        """A timed-out candidate that does no more work than this one (same or dominating rung, same or
        smaller micro-batch, checkpointing no less): this one would time out too."""
        for slow in self._timed_out:
            same_or_more_work = candidate.rung is slow.rung or candidate.rung in dominated_rungs(slow.rung)
            if (
                same_or_more_work
                and candidate.mode == slow.mode  # a mode changes the work: only its own timeouts bound it
                and candidate.micro_batch >= slow.micro_batch
                and (candidate.grad_checkpointing or not slow.grad_checkpointing)
            ):
                return slow
        return None

    def _trial(
        self, candidate: Candidate, purpose: str = LaunchPurpose.FIRST, run: RunTrial | None = None
    ) -> TrialRecord:
        predicted = self._estimate(candidate)
        if slow := self._would_time_out(candidate):
            result = TrialResult(status="timeout", error=f"not run: {slow.key} timed out earlier in this run")
            record = TrialRecord(
                candidate, result, predicted.gpu_peak_bytes, self.limit_bytes, from_cache=True, purpose=purpose
            )
            self.outcome.trials.append(record)
            return record
        self.observe(SearchEvent("trial_start", candidate, predicted.candidate.describe()))
        result, cached = (run or self.run)(candidate)
        self._launched += 0 if cached else 1
        if result.status == "timeout":
            self._timed_out.append(candidate)
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
        peak = result.peak_memory_bytes
        if peak and (result.ok or result.status == "over_budget"):
            self.calibration = self.memory.calibrate(
                self.calibration, self.model, self.target, candidate, settings=self.settings, measured_peak_bytes=peak
            )
            self.outcome.calibration = self.calibration
        elif result.status in MEMORY_FAILURES and self._modelled_memory_failed(result):
            # no peak, but a lower bound: it needed more than the memory it had
            limit = self.target.free_memory_bytes
            self.calibration = self.memory.calibrate_oom(
                self.calibration, self.model, self.target, candidate, settings=self.settings, limit_bytes=limit
            )
            self.outcome.calibration = self.calibration
        self.observe(SearchEvent("trial_end", candidate, result.status, record))
        return record

    def _modelled_memory_failed(self, result: TrialResult) -> bool:
        """Whether the memory the model predicts (device memory; host RSS on the CPU backend) is what ran out. On a
        GPU run a host-side failure (a failed pinned host allocation, the host's OOM) says nothing about the
        device, so it must not push the device prediction up (trial/outcome.py classifies them)."""
        return self.settings.device == "cpu" or result.status == "oom_gpu"

    def _skip(self, rung: Rung, ckpt: bool, reason: str, mode: Mode = Mode()) -> None:
        self.outcome.skipped.append(SkipRecord(rung, ckpt, reason, mode))
        self.observe(SearchEvent("skip", Candidate(rung, self.micro_batches[0], ckpt, mode), reason))

    def _fits_with(self, candidate: Candidate, calibration: Calibration, margin: float = TRY_MARGIN) -> bool:
        predicted = self.memory.estimate(self.model, self.target, candidate, self.settings, calibration=calibration)
        return predicted.gpu_peak_bytes <= self.limit_bytes * (1 + margin)

    def _next_micro_batch(
        self, rung: Rung, ckpt: bool, ok: int | None, bad: int | None, guided: bool, mode: Mode = Mode()
    ) -> int | None:
        """Next micro-batch strictly between the largest that ran and the smallest that did not.

        Guided: the largest the memory model, calibrated on this run's measured peaks, puts within the limit (a
        trial is never spent on a predicted non-fit; the calibration fits its activation slope and offset on the
        measured points, so two peaks of a group draw that group's line). Once a guess above a fit failed, the
        midpoint of the predicted fits (bisection). None when the model says nothing between them fits: the
        largest that ran is the boundary, unless the pick's confirmation (`_confirm_boundary`) finds otherwise."""
        between = [
            m
            for m in self.micro_batches
            if (ok is None or m > ok)
            and (bad is None or m < bad)
            and not self._measured_over(Candidate(rung, m, ckpt, mode))
        ]
        if not between:
            return None
        if ok is None and bad is not None:
            return self._after_first_failure(rung, ckpt, bad, between, mode=mode)
        line = self._peak_line(Candidate(rung, between[0], ckpt, mode))
        if line is not None:  # the group's own measured peaks: memory is linear in the micro-batch
            top = largest_where(between, lambda m: line.seconds(m) <= self.limit_bytes)
        else:
            top = largest_where(between, lambda m: self._fits_with(Candidate(rung, m, ckpt, mode), self.calibration))
        if top is None:
            return None if ok is not None else between[0]
        predicted = [m for m in between if m <= top]
        return predicted[-1] if guided else predicted[len(predicted) // 2]

    def _peak_line(self, candidate: Candidate) -> StepLine | None:
        """Peak bytes = intercept + slope x micro-batch, fitted on the measured peaks of `candidate`'s group (two
        micro-batches at least; one trial gives two where its smaller micro-batch's peak was measured apart,
        TrialResult.smaller_peak_point). The calibration pools its slope over every group of the same
        checkpointing (autotune.estimate.calibration); within one group the measured line is the better guide to
        where the limit falls."""
        points: list[tuple[float, float]] = []
        for t in self.outcome.trials:
            if same_group(t.candidate, candidate) and t.result.ok and t.result.peak_memory_bytes and not t.from_cache:
                points.append((float(t.candidate.micro_batch), float(t.result.peak_memory_bytes)))
                if (smaller := t.result.smaller_peak_point) is not None:
                    points.append((float(smaller[0]), float(smaller[1])))
        # a trial stopped at a cap (over_budget) reports the cap, not its peak: no point of the line
        return fit_step_line(points)

    def _after_first_failure(self, rung: Rung, ckpt: bool, bad: int, below: list[int], mode: Mode = Mode()) -> int:
        """Nothing of this group ran yet and `bad` did not fit: jump by the memory model, not one grid step.

        The failed trial shows the true peak at `bad` is above the free memory (or the measured peak, if
        it was reported). Calibrating on that lower bound gives a model that is at least as pessimistic
        as the truth there; the largest micro-batch it says fits is the next try. If it says none, the
        middle of what is left (the bound may be pessimistic for small micro-batches; bisection, not a walk up
        from the smallest, on a dense integer grid).
        """
        failed_candidate = Candidate(rung, bad, ckpt, mode)
        failed = next((t for t in reversed(self.outcome.trials) if t.candidate == failed_candidate), None)
        # a run that finished over the headroom measured its true peak (already in the calibration); an OOM, or a
        # CPU trial stopped at its cap (over_budget), only says "more than this"
        peak = failed.result.peak_memory_bytes if failed and failed.result.ok else None
        at_least = peak or max(self.target.free_memory_bytes, (failed and failed.result.peak_memory_bytes) or 0)
        pessimistic = self.memory.calibrate(
            self.calibration,
            self.model,
            self.target,
            failed_candidate,
            settings=self.settings,
            measured_peak_bytes=at_least,
        )
        # within the limit itself: the calibrated model has this group's evidence; a margin over it would step
        # down one integer micro-batch per trial
        fitting = largest_where(below, lambda m: self._fits_with(Candidate(rung, m, ckpt, mode), pessimistic, 0.0))
        guess = fitting or below[len(below) // 2]
        blind = sum(
            same_group(t.candidate, failed_candidate) and t.memory_failure and not t.result.peak_memory_bytes
            for t in self.outcome.trials
        )
        # two OOMs without a measured peak in this group (the model misses memory it does not know of): halve the
        # interval too, so a dense integer grid costs log2 of its length in OOMs at worst, not one per step the
        # model moves; a peak measured over the headroom is the truth and its guess is kept
        return min(guess, below[len(below) // 2]) if blind >= 2 and not peak else guess

    def _search_group(
        self,
        rung: Rung,
        ckpt: bool,
        seed: int,
        mode: Mode = Mode(),
        ok: int | None = None,
        bad: int | None = None,
        purpose: str = LaunchPurpose.FIRST,
    ) -> None:
        """Largest micro-batch that runs for one (rung, checkpointing) group, seeded by the prediction; `ok` and
        `bad` carry what an earlier walk of the group found (the pick's confirmation continues one).

        A timeout before anything in the group ran is retried once at a smaller micro-batch (shorter
        steps) before the group is abandoned; a timeout bounds the group from above like an OOM. The walk
        stops early once the next micro-batch cannot beat the best measured (its own line, A3, bounds it).
        """
        mb: int | None = seed
        guided = True
        retried_timeout = False
        while mb is not None:
            if self._stop_if_spent():
                return
            if ok is not None and (why := self._bounded(Candidate(rung, mb, ckpt, mode))):
                self.observe(SearchEvent("skip", Candidate(rung, mb, ckpt, mode), why))
                return
            record = self._trial(Candidate(rung, mb, ckpt, mode), purpose)
            purpose = LaunchPurpose.BOUNDARY
            if record.over_host_headroom:  # host buffers barely depend on the micro-batch: the rung is out
                peak, limit = format_bytes(record.host_peak_bytes or 0), format_bytes(self.host_limit_bytes or 0)
                headroom = f"{self.limits.headroom:.0%} of RAM"
                self._skip(rung, ckpt, f"host RAM peak {peak} per node > {limit} ({headroom})", mode)
                return
            if record.within_headroom:
                ok = mb
                self._consider_best(record)
            elif record.memory_failure:
                bad = mb
                guided = ok is None and guided  # a wrong guess above a success falls back to bisection
            elif record.result.status == "timeout" and (ok is not None or not retried_timeout):
                smaller = [m for m in self.micro_batches if m < mb and (ok is None or m > ok)]
                bad = mb
                if ok is None:
                    retried_timeout = True
                    if not smaller:
                        why = f"trial timed out at the smallest micro-batch: {record.result.error}"
                        self._skip(rung, ckpt, why, mode)
                        return
                    mb = smaller[len(smaller) // 2]
                    continue
            else:
                if ok is None:
                    why = f"trial failed: {record.result.status}: {record.result.error or ''}".strip()
                    self._skip(rung, ckpt, why, mode)
                return
            mb = self._next_micro_batch(rung, ckpt, ok, bad, guided=guided, mode=mode)

    def _consider_best(self, record: TrialRecord) -> None:
        best = self.outcome.best
        speed = record.result.samples_per_s or 0.0
        if best is None or speed > (best.result.samples_per_s or 0.0):
            self.outcome.best = record

    def _measured_groups(self) -> list[GroupMeasurements]:
        """Per (rung, checkpointing, mode): (micro-batch, per-rank micro-step seconds) of every trial that fitted,
        with the second point each launch timed at a smaller micro-batch."""
        points: dict[tuple[Rung, bool, Mode], list[tuple[int, float]]] = {}
        for t in self.outcome.trials:
            if t.within_headroom and t.result.samples_per_s:
                key = (t.candidate.rung, t.candidate.grad_checkpointing, t.candidate.mode)
                points.setdefault(key, []).append((t.candidate.micro_batch, self._micro_step_seconds(t)))
                if smaller := self._smaller_point(t):
                    points[key].append(smaller)
        return [GroupMeasurements(rung, ckpt, tuple(p), mode) for (rung, ckpt, mode), p in points.items()]

    def _smaller_point(self, record: TrialRecord) -> tuple[int, float] | None:
        """The launch's second point as it would run on its own: its micro-step plus its share of the
        optimizer step (with a fixed global batch the smaller micro-batch accumulates more steps)."""
        r = record.result
        if not (r.smaller_micro_batch and r.smaller_micro_step_s and r.optimizer_step_s is not None):
            return None
        accumulation: float = max(1, r.accumulation)
        if self.global_batch is not None:
            accumulation = accumulation * record.candidate.micro_batch / r.smaller_micro_batch
        return r.smaller_micro_batch, r.smaller_micro_step_s + r.optimizer_step_s / accumulation

    def _micro_step_seconds(self, record: TrialRecord) -> float:
        """Seconds per micro-batch on one rank; independent of gradient accumulation and world size."""
        return record.candidate.micro_batch * self.target.world_size / (record.result.samples_per_s or 1.0)

    # -- the walk ----------------------------------------------------------------------------------
    def _rung_group(self, rung: Rung, ckpt: bool, mode: Mode = Mode()) -> None:
        """One (rung, checkpointing) group: ruled out, bounded, or searched. A mode other than the classic one is
        an alternative on its rung, bounded only by measurements of the same mode (no speed order between a mode
        and the classic rungs is assumed: GroupMeasurements are per mode)."""
        smallest = self._estimate(Candidate(rung, self.micro_batches[0], ckpt, mode))
        if locked := memlock_problem(smallest, self.target):  # a hard limit: the rank would abort, not OOM
            self._skip(rung, ckpt, f"ruled out: {locked}", mode)
            return
        if smallest.gpu_peak_bytes > self.limit_bytes * (1 + RULED_OUT_MARGIN):
            verdict = check_fit(smallest, self.target, self.limits.headroom)
            self._skip(rung, ckpt, f"ruled out by the memory model: {verdict.reason}", mode)
            return
        reachable = self._predicted_max(rung, ckpt, TRY_MARGIN, mode) or self.micro_batches[0]
        if why := self._bounded(Candidate(rung, reachable, ckpt, mode)):
            self._skip(rung, ckpt, why, mode)
            return
        seed = self._predicted_max(rung, ckpt, 0.0, mode) or self.micro_batches[0]
        self._search_group(rung, ckpt, seed, mode)

    def _bounded(self, candidate: Candidate) -> str:
        """Why the measurements so far say `candidate` cannot beat the best measured; '' when it might."""
        best = self.outcome.best
        if best is None:
            return ""
        speed = (best.result.samples_per_s or 0.0) / self.target.world_size  # per rank, like the line
        beatable, why = could_beat(speed, self._measured_groups(), candidate, self.bound_context)
        return "" if beatable else why

    def run_search(self) -> SearchOutcome:
        """The classic ladder first, exactly as without modes; then each applicable mode on its rung, from the
        budget left (a mode never takes a trial the classic ladder would have had); then the close-call check
        over everything measured, modes included."""
        groups = [(rung, ckpt) for rung in self.rungs for ckpt in (False, True)]
        options = self._consider_modes()
        for index, (rung, ckpt) in enumerate(groups):
            if reason := self._stop_if_spent():
                for rest_rung, rest_ckpt in groups[index:]:
                    self._skip(rest_rung, rest_ckpt, f"not tried: {reason}")
                break
            self._rung_group(rung, ckpt)
        for rung, ckpt in groups:
            for choice, record in options.get(rung, []):
                self._mode_group(rung, ckpt, choice, record)
        self._confirm_boundary()
        self._settle_close_call()
        self._confirm_fresh()
        self._finish_mode_records()
        if self.outcome.stop_reason is None:
            if self.outcome.best:
                self.outcome.stop_reason = StopReason.NO_BETTER
                self.outcome.stop_message = "no remaining candidate can beat the best measured"
            else:
                self.outcome.stop_reason = StopReason.EXHAUSTED
                self.outcome.stop_message = "every rung was ruled out or failed"
        return self.outcome
