"""The search: walk the ladder fastest-first, find each rung's largest micro-batch with real trials,
and stop once no remaining candidate can beat the best measured one.

Pure logic: trials arrive through an injected `run` callable, so the same loop serves real DeepSpeed
trials, cached results and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from autotune.estimate import calibrate, check_fit, estimate
from autotune.estimate.types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware import Target
from autotune.ladder import Candidate, Rung
from autotune.models import ModelSummary
from autotune.speed import StepLine, could_beat, fit_step_line, work_units
from autotune.stop import StopReason
from autotune.trial.types import TrialResult

MEMORY_FAILURES = ("oom_gpu", "oom_host", "over_budget")
RULED_OUT_MARGIN = 0.15  # skip without a trial only when the prediction is this far over the limit
TRY_MARGIN = 0.10  # a micro-batch predicted within this much over the limit is still worth a trial


@dataclass(frozen=True)
class SearchLimits:
    max_trials: int = 12
    time_budget_s: float | None = None
    headroom: float = 0.9


@dataclass(frozen=True)
class TrialRecord:
    candidate: Candidate
    result: TrialResult
    predicted_peak_bytes: int
    limit_bytes: int
    from_cache: bool = False

    @property
    def within_headroom(self) -> bool:
        peak = self.result.peak_memory_bytes
        return self.result.ok and (peak is None or peak <= self.limit_bytes)

    @property
    def memory_failure(self) -> bool:
        return self.result.status in MEMORY_FAILURES or (self.result.ok and not self.within_headroom)

    def to_dict(self) -> dict:
        return {
            "candidate": self.candidate.to_dict(),
            "result": self.result.to_dict(),
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "limit_bytes": self.limit_bytes,
            "within_headroom": self.within_headroom,
            "from_cache": self.from_cache,
        }


@dataclass(frozen=True)
class SkipRecord:
    rung: Rung
    grad_checkpointing: bool
    reason: str

    def to_dict(self) -> dict:
        return {"rung": self.rung.value, "grad_checkpointing": self.grad_checkpointing, "reason": self.reason}


@dataclass(frozen=True)
class SearchEvent:
    kind: str  # "trial_start" | "trial_end" | "skip"
    candidate: Candidate | None = None
    message: str = ""
    record: TrialRecord | None = None


@dataclass
class SearchOutcome:
    best: TrialRecord | None
    trials: list[TrialRecord] = field(default_factory=list)
    skipped: list[SkipRecord] = field(default_factory=list)
    calibration: Calibration = field(default_factory=Calibration)
    stop_reason: StopReason | None = None
    stop_message: str = ""  # the reason in words, for people

    @property
    def trials_launched(self) -> int:
        return sum(not t.from_cache for t in self.trials)

    def to_dict(self) -> dict:
        return {
            "best": self.best.to_dict() if self.best else None,
            "trials": [t.to_dict() for t in self.trials],
            "skipped": [s.to_dict() for s in self.skipped],
            "calibration": asdict(self.calibration),
            "stop_reason": self.stop_reason.value if self.stop_reason else None,
            "stop_message": self.stop_message,
        }


RunTrial = Callable[[Candidate], tuple[TrialResult, bool]]  # -> (result, came from cache)


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

    def __post_init__(self) -> None:
        self.limit_bytes = int(self.limits.headroom * self.target.free_memory_bytes)
        self.outcome = SearchOutcome(best=None, calibration=self.calibration)
        self._started = self.clock()
        self._launched = 0

    # -- predictions -------------------------------------------------------------------------------
    def _estimate(self, candidate: Candidate) -> MemoryEstimate:
        return estimate(self.model, self.target, candidate, self.settings, self.calibration)

    def _predicted_max(self, rung: Rung, ckpt: bool, margin: float) -> int | None:
        """Largest eligible micro-batch whose predicted peak is within (1 + margin) of the limit."""
        best = None
        for mb in self.micro_batches:
            predicted = self._estimate(Candidate(rung, mb, ckpt))
            if predicted.gpu_peak_bytes > self.limit_bytes * (1 + margin):
                break
            if check_fit(predicted, self.target, self.limits.headroom).fits or margin > 0:
                best = mb
        return best

    # -- budget ------------------------------------------------------------------------------------
    def _budget_left(self) -> str:
        """'' while budget is left; else the reason in words (the enum is set on the outcome)."""
        if self._launched >= self.limits.max_trials:
            return self._stop(StopReason.TRIAL_BUDGET, f"trial budget spent ({self.limits.max_trials} trials)")
        budget = self.limits.time_budget_s
        if budget is not None and self.clock() - self._started >= budget:
            return self._stop(StopReason.TIME_BUDGET, f"time budget spent ({budget:.0f} s)")
        return ""

    def _stop(self, reason: StopReason, message: str) -> str:
        self.outcome.stop_reason, self.outcome.stop_message = reason, message
        return message

    # -- trials ------------------------------------------------------------------------------------
    def _trial(self, candidate: Candidate) -> TrialRecord:
        predicted = self._estimate(candidate)
        self.observe(SearchEvent("trial_start", candidate, predicted.candidate.describe()))
        result, cached = self.run(candidate)
        self._launched += 0 if cached else 1
        record = TrialRecord(candidate, result, predicted.gpu_peak_bytes, self.limit_bytes, cached)
        self.outcome.trials.append(record)
        peak = result.peak_memory_bytes
        if peak and (result.ok or result.status == "over_budget"):
            self.calibration = calibrate(self.calibration, self.model, self.target, candidate, self.settings, peak)
            self.outcome.calibration = self.calibration
        self.observe(SearchEvent("trial_end", candidate, result.status, record))
        return record

    def _skip(self, rung: Rung, ckpt: bool, reason: str) -> None:
        self.outcome.skipped.append(SkipRecord(rung, ckpt, reason))
        self.observe(SearchEvent("skip", Candidate(rung, self.micro_batches[0], ckpt), reason))

    def _next_micro_batch(self, rung: Rung, ckpt: bool, ok: int | None, bad: int | None, guided: bool) -> int | None:
        """Next micro-batch strictly between the largest that ran and the smallest that did not."""
        between = [m for m in self.micro_batches if (ok is None or m > ok) and (bad is None or m < bad)]
        if not between:
            return None
        predicted = [
            m
            for m in between
            if self._estimate(Candidate(rung, m, ckpt)).gpu_peak_bytes <= self.limit_bytes * (1 + TRY_MARGIN)
        ]
        if guided and predicted:
            return predicted[-1]
        if ok is not None and not predicted:
            return None  # the calibrated model rules out everything above what ran
        return between[len(between) // 2]

    def _search_group(self, rung: Rung, ckpt: bool, seed: int) -> None:
        """Largest micro-batch that runs for one (rung, checkpointing) group, seeded by the prediction."""
        ok: int | None = None
        bad: int | None = None
        mb: int | None = seed
        guided = True
        while mb is not None:
            if self._budget_left():
                return
            record = self._trial(Candidate(rung, mb, ckpt))
            if record.within_headroom:
                ok = mb
                self._consider_best(record)
            elif record.memory_failure:
                bad = mb
                guided = ok is None and guided  # a wrong guess above a success falls back to bisection
            else:
                if ok is None:
                    self._skip(rung, ckpt, f"trial failed: {record.result.status}: {record.result.error or ''}".strip())
                return
            mb = self._next_micro_batch(rung, ckpt, ok, bad, guided)

    def _consider_best(self, record: TrialRecord) -> None:
        best = self.outcome.best
        speed = record.result.samples_per_s or 0.0
        if best is None or speed > (best.result.samples_per_s or 0.0):
            self.outcome.best = record

    def _best_line(self) -> StepLine | None:
        """Step-time line of the best config's (rung, checkpointing) group, from its trials that fitted."""
        best = self.outcome.best
        if best is None:
            return None
        points = [
            (work_units(t.candidate), self._micro_step_seconds(t))
            for t in self.outcome.trials
            if t.within_headroom
            and t.result.samples_per_s
            and t.candidate.rung is best.candidate.rung
            and t.candidate.grad_checkpointing == best.candidate.grad_checkpointing
        ]
        return fit_step_line(points)

    def _micro_step_seconds(self, record: TrialRecord) -> float:
        """Seconds per micro-batch on one rank; independent of gradient accumulation and world size."""
        return record.candidate.micro_batch * self.target.world_size / (record.result.samples_per_s or 1.0)

    # -- the walk ----------------------------------------------------------------------------------
    def run_search(self) -> SearchOutcome:
        groups = [(rung, ckpt) for rung in self.rungs for ckpt in (False, True)]
        for index, (rung, ckpt) in enumerate(groups):
            if reason := self._budget_left():
                for rest_rung, rest_ckpt in groups[index:]:
                    self._skip(rest_rung, rest_ckpt, f"not tried: {reason}")
                break
            smallest = self._estimate(Candidate(rung, self.micro_batches[0], ckpt))
            if smallest.gpu_peak_bytes > self.limit_bytes * (1 + RULED_OUT_MARGIN):
                verdict = check_fit(smallest, self.target, self.limits.headroom)
                self._skip(rung, ckpt, f"ruled out by the memory model: {verdict.reason}")
                continue
            reachable = self._predicted_max(rung, ckpt, TRY_MARGIN) or self.micro_batches[0]
            best = self.outcome.best
            if best is not None:
                speed = (best.result.samples_per_s or 0.0) / self.target.world_size  # per rank, like the line
                other = Candidate(rung, reachable, ckpt)
                beatable, why = could_beat(best.candidate, speed, self._best_line(), other)
                if not beatable:
                    self._skip(rung, ckpt, why)
                    continue
            seed = self._predicted_max(rung, ckpt, 0.0) or self.micro_batches[0]
            self._search_group(rung, ckpt, seed)
        if self.outcome.stop_reason is None:
            if self.outcome.best:
                self._stop(StopReason.NO_BETTER, "no remaining candidate can beat the best measured")
            else:
                self._stop(StopReason.EXHAUSTED, "every rung was ruled out or failed")
        return self.outcome
