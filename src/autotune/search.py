"""The search: walk the ladder fastest-first, find each rung's largest micro-batch with real trials,
and stop once no remaining candidate can beat the best measured one.

Pure logic: trials arrive through an injected `run` callable, so the same loop serves real DeepSpeed
trials, cached results and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from autotune.estimate import calibrate, calibrate_oom, check_fit, estimate
from autotune.estimate.types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware import Target
from autotune.ladder import Candidate, Rung
from autotune.models import ModelSummary
from autotune.speed import (
    BoundContext,
    GroupMeasurements,
    checkpointing_cost,
    could_beat,
    dominated_rungs,
    optimizer_saving_s,
)
from autotune.stop import StopReason
from autotune.trial.types import TrialResult
from autotune.units import format_bytes

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
    host_limit_bytes: int | None = None  # GPU trials: per-node host RAM headroom (offload pins host buffers)
    gpus_per_node: int = 1

    @property
    def host_peak_bytes(self) -> int | None:
        """Worst node's summed host RSS peak over its ranks (ranks are numbered node by node)."""
        per_node: dict[int, int] = {}
        for rank in self.result.ranks:
            if rank.host_rss_peak_bytes:
                node = rank.rank // max(1, self.gpus_per_node)
                per_node[node] = per_node.get(node, 0) + rank.host_rss_peak_bytes
        return max(per_node.values()) if per_node else None

    @property
    def over_host_headroom(self) -> bool:
        peak = self.host_peak_bytes
        return self.host_limit_bytes is not None and peak is not None and peak > self.host_limit_bytes

    @property
    def within_headroom(self) -> bool:
        peak = self.result.peak_memory_bytes
        return self.result.ok and (peak is None or peak <= self.limit_bytes) and not self.over_host_headroom

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
            "host_peak_bytes": self.host_peak_bytes,
            "host_limit_bytes": self.host_limit_bytes,
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
    margin: float | None = None  # best vs runner-up, relative, after any re-measurement
    noise: float | None = None  # the larger relative step-time spread of the two
    remeasured: bool = False

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
            "margin": self.margin,
            "noise": self.noise,
            "remeasured": self.remeasured,
        }


def relative_spread(step_times_s: list[float]) -> float:
    """(slowest - fastest) / median of a trial's measured steps; 0 with fewer than two."""
    if len(step_times_s) < 2:
        return 0.0
    ordered = sorted(step_times_s)
    return (ordered[-1] - ordered[0]) / ordered[len(ordered) // 2]


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
    global_batch: int | None = None  # fixed global batch: accumulation scales with 1 / micro-batch

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
                and candidate.micro_batch >= slow.micro_batch
                and (candidate.grad_checkpointing or not slow.grad_checkpointing)
            ):
                return slow
        return None

    def _trial(self, candidate: Candidate) -> TrialRecord:
        predicted = self._estimate(candidate)
        if slow := self._would_time_out(candidate):
            result = TrialResult(status="timeout", error=f"not run: {slow.key} timed out earlier in this run")
            record = TrialRecord(candidate, result, predicted.gpu_peak_bytes, self.limit_bytes, from_cache=True)
            self.outcome.trials.append(record)
            return record
        self.observe(SearchEvent("trial_start", candidate, predicted.candidate.describe()))
        result, cached = self.run(candidate)
        self._launched += 0 if cached else 1
        if result.status == "timeout":
            self._timed_out.append(candidate)
        record = TrialRecord(
            candidate,
            result,
            predicted.gpu_peak_bytes,
            self.limit_bytes,
            cached,
            self.host_limit_bytes,
            self.target.gpus_per_node,
        )
        self.outcome.trials.append(record)
        peak = result.peak_memory_bytes
        if peak and (result.ok or result.status == "over_budget"):
            self.calibration = calibrate(self.calibration, self.model, self.target, candidate, self.settings, peak)
            self.outcome.calibration = self.calibration
        elif result.status in MEMORY_FAILURES:  # no peak, but a lower bound: it needed more than the memory it had
            limit = self.target.free_memory_bytes
            self.calibration = calibrate_oom(self.calibration, self.model, self.target, candidate, self.settings, limit)
            self.outcome.calibration = self.calibration
        self.observe(SearchEvent("trial_end", candidate, result.status, record))
        return record

    def _skip(self, rung: Rung, ckpt: bool, reason: str) -> None:
        self.outcome.skipped.append(SkipRecord(rung, ckpt, reason))
        self.observe(SearchEvent("skip", Candidate(rung, self.micro_batches[0], ckpt), reason))

    def _fits_with(self, candidate: Candidate, calibration: Calibration) -> bool:
        predicted = estimate(self.model, self.target, candidate, self.settings, calibration)
        return predicted.gpu_peak_bytes <= self.limit_bytes * (1 + TRY_MARGIN)

    def _next_micro_batch(self, rung: Rung, ckpt: bool, ok: int | None, bad: int | None, guided: bool) -> int | None:
        """Next micro-batch strictly between the largest that ran and the smallest that did not, among
        those the calibrated memory model does not rule out (no trial on a predicted non-fit)."""
        between = [m for m in self.micro_batches if (ok is None or m > ok) and (bad is None or m < bad)]
        if not between:
            return None
        if ok is None and bad is not None:
            return self._after_first_failure(rung, ckpt, bad, between)
        predicted = [m for m in between if self._fits_with(Candidate(rung, m, ckpt), self.calibration)]
        if not predicted:
            return None if ok is not None else between[0]
        return predicted[-1] if guided else predicted[len(predicted) // 2]

    def _after_first_failure(self, rung: Rung, ckpt: bool, bad: int, below: list[int]) -> int:
        """Nothing of this group ran yet and `bad` did not fit: jump by the memory model, not one grid step.

        The failed trial shows the true peak at `bad` is above the free memory (or the measured peak, if
        it was reported). Calibrating on that lower bound gives a model that is at least as pessimistic
        as the truth there; the largest micro-batch it says fits is the next try. If it says none, the
        smallest is tried once (the bound may be pessimistic for small micro-batches).
        """
        failed = next((t for t in reversed(self.outcome.trials) if t.candidate == Candidate(rung, bad, ckpt)), None)
        peak = failed.result.peak_memory_bytes if failed else None
        at_least = max(peak or 0, self.target.free_memory_bytes)
        pessimistic = calibrate(
            self.calibration, self.model, self.target, Candidate(rung, bad, ckpt), self.settings, at_least
        )
        fitting = [m for m in below if self._fits_with(Candidate(rung, m, ckpt), pessimistic)]
        return fitting[-1] if fitting else below[0]

    def _search_group(self, rung: Rung, ckpt: bool, seed: int) -> None:
        """Largest micro-batch that runs for one (rung, checkpointing) group, seeded by the prediction.

        A timeout before anything in the group ran is retried once at a smaller micro-batch (shorter
        steps) before the group is abandoned; a timeout bounds the group from above like an OOM.
        """
        ok: int | None = None
        bad: int | None = None
        mb: int | None = seed
        guided = True
        retried_timeout = False
        while mb is not None:
            if self._stop_if_spent():
                return
            record = self._trial(Candidate(rung, mb, ckpt))
            if record.over_host_headroom:  # host buffers barely depend on the micro-batch: the rung is out
                peak, limit = format_bytes(record.host_peak_bytes or 0), format_bytes(self.host_limit_bytes or 0)
                self._skip(rung, ckpt, f"host RAM peak {peak} per node > {limit} ({self.limits.headroom:.0%} of RAM)")
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
                        self._skip(rung, ckpt, f"trial timed out at the smallest micro-batch: {record.result.error}")
                        return
                    mb = smaller[len(smaller) // 2]
                    continue
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

    def _measured_groups(self) -> list[GroupMeasurements]:
        """Per (rung, checkpointing): (micro-batch, per-rank micro-step seconds) of every trial that fitted,
        with the second point each launch timed at a smaller micro-batch."""
        points: dict[tuple[Rung, bool], list[tuple[int, float]]] = {}
        for t in self.outcome.trials:
            if t.within_headroom and t.result.samples_per_s:
                key = (t.candidate.rung, t.candidate.grad_checkpointing)
                points.setdefault(key, []).append((t.candidate.micro_batch, self._micro_step_seconds(t)))
                if smaller := self._smaller_point(t):
                    points[key].append(smaller)
        return [GroupMeasurements(rung, ckpt, tuple(p)) for (rung, ckpt), p in points.items()]

    def _smaller_point(self, record: TrialRecord) -> tuple[int, float] | None:
        """The launch's second point as it would run on its own: its micro-step plus its share of the
        optimizer step (with a fixed global batch the smaller micro-batch accumulates more steps)."""
        r = record.result
        if not (r.smaller_micro_batch and r.smaller_micro_step_s and r.optimizer_step_s is not None):
            return None
        accumulation = max(1, r.accumulation)
        if self.global_batch is not None:
            accumulation = accumulation * record.candidate.micro_batch / r.smaller_micro_batch
        return r.smaller_micro_batch, r.smaller_micro_step_s + r.optimizer_step_s / accumulation

    def _micro_step_seconds(self, record: TrialRecord) -> float:
        """Seconds per micro-batch on one rank; independent of gradient accumulation and world size."""
        return record.candidate.micro_batch * self.target.world_size / (record.result.samples_per_s or 1.0)

    # -- noise ------------------------------------------------------------------------------------------
    def _speeds(self, candidate: Candidate) -> list[TrialRecord]:
        return [
            t for t in self.outcome.trials if t.candidate == candidate and t.within_headroom and t.result.samples_per_s
        ]

    def _mean_speed(self, candidate: Candidate) -> float:
        records = self._speeds(candidate)
        return sum(t.result.samples_per_s or 0.0 for t in records) / max(1, len(records))

    def _rank_key(self, candidate: Candidate) -> tuple[float, int, int]:
        """Faster first; on an exact tie the earlier rung (less offload, less host RAM), then no checkpointing."""
        return self._mean_speed(candidate), -candidate.rung.order, -int(candidate.grad_checkpointing)

    def _settle_close_call(self) -> None:
        """When the two best differ by less than their measured step-time spread, re-measure both,
        interleaved (runner-up, then best), and decide on the mean; the margin goes in the outcome."""
        fitted = {t.candidate for t in self.outcome.trials if t.within_headroom and t.result.samples_per_s}
        ranked = sorted(fitted, key=self._rank_key, reverse=True)
        if len(ranked) < 2:
            return
        first, second = ranked[0], ranked[1]
        noise = max(relative_spread(t.result.step_times_s) for c in (first, second) for t in self._speeds(c))
        margin = (self._mean_speed(first) - self._mean_speed(second)) / self._mean_speed(second)
        if margin < noise and not self._budget_left():
            self.outcome.remeasured = True
            for candidate in (second, first):
                record = self._trial(candidate)
                if not record.within_headroom:
                    break
            ranked = sorted((first, second), key=self._rank_key, reverse=True)
            first, second = ranked
            margin = (self._mean_speed(first) - self._mean_speed(second)) / self._mean_speed(second)
        best = max(self._speeds(first), key=lambda t: t.result.samples_per_s or 0.0)
        self.outcome.best = best
        self.outcome.margin, self.outcome.noise = margin, noise

    # -- the walk ----------------------------------------------------------------------------------
    def run_search(self) -> SearchOutcome:
        groups = [(rung, ckpt) for rung in self.rungs for ckpt in (False, True)]
        for index, (rung, ckpt) in enumerate(groups):
            if reason := self._stop_if_spent():
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
                beatable, why = could_beat(speed, self._measured_groups(), other, self.bound_context)
                if not beatable:
                    self._skip(rung, ckpt, why)
                    continue
            seed = self._predicted_max(rung, ckpt, 0.0) or self.micro_batches[0]
            self._search_group(rung, ckpt, seed)
        self._settle_close_call()
        if self.outcome.stop_reason is None:
            if self.outcome.best:
                self.outcome.stop_reason = StopReason.NO_BETTER
                self.outcome.stop_message = "no remaining candidate can beat the best measured"
            else:
                self.outcome.stop_reason = StopReason.EXHAUSTED
                self.outcome.stop_message = "every rung was ruled out or failed"
        return self.outcome
