"""The search: walk the ladder fastest-first, find each rung's largest micro-batch with real trials,
and stop once no remaining candidate can beat the best measured one.

Pure logic: trials arrive through an injected `run` callable, so the same loop serves real DeepSpeed
trials, cached results and tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.measurement import Speed, pooled
from autotune.core.stop import StopReason
from autotune.core.units import format_bytes
from autotune.estimate import calibrate, calibrate_oom, check_fit, estimate
from autotune.estimate.core import memlock_problem
from autotune.estimate.types import Calibration, EstimateSettings, MemoryEstimate
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.search_view import ModeChoice, ModeRecord, ModesFor, is_ratio_mode, no_modes, smallest_fitting_ratio
from autotune.search.close_call import Verdict, settle
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
from autotune.trial.types import TrialResult

MEMORY_FAILURES = ("oom_gpu", "oom_host", "over_budget")
RULED_OUT_MARGIN = 0.15  # skip without a trial only when the prediction is this far over the limit
TRY_MARGIN = 0.10  # a micro-batch predicted within this much over the limit is still worth a trial
# Offload-ratio knob (a modern memory mode), a budget choice, not a claim about speed: at most this many micro-batches
# per (rung, checkpointing), each with at most this many trials (the predicted smallest fitting ratio; after a miss, the
# next ratio up that the OOM-calibrated model, or two measured peaks, say fits; after a fit, one step down when the
# calibrated model allows it). Worst case 2 x 3 = 6 extra trials per checkpointing setting; usually 1-2
# (benchmarks/README.md, search quality).
RATIO_MICRO_BATCHES = 2
RATIO_TRIES = 3


@dataclass(frozen=True)
class MemoryModel:
    """The memory model the search predicts and learns with; the real one by default, a fake in tests."""

    estimate: Callable[..., MemoryEstimate] = estimate
    calibrate: Callable[..., Calibration] = calibrate
    calibrate_oom: Callable[..., Calibration] = calibrate_oom


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
    purpose: str = ""  # why the search launched it (LaunchPurpose), for the report of where launches go

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
            "purpose": self.purpose,
        }


@dataclass(frozen=True)
class SkipRecord:
    rung: Rung
    grad_checkpointing: bool
    reason: str
    mode: Mode = field(default_factory=Mode)

    def to_dict(self) -> dict:
        data: dict[str, Any] = {
            "rung": self.rung.value,
            "grad_checkpointing": self.grad_checkpointing,
            "reason": self.reason,
        }
        if not self.mode.is_classic:
            data["mode"] = self.mode.to_dict()
        return data


# "prepare": the tuner's own work before or between trials (building DeepSpeed's ops, replacing warm workers)
SearchEventKind = Literal["prepare", "trial_start", "trial_end", "skip"]


@dataclass(frozen=True)
class SearchEvent:
    kind: SearchEventKind
    candidate: Candidate | None = None
    message: str = ""
    record: TrialRecord | None = None


@dataclass(kw_only=True)
class SearchOutcome:
    best: TrialRecord | None
    trials: list[TrialRecord] = field(default_factory=list)
    skipped: list[SkipRecord] = field(default_factory=list)
    calibration: Calibration = field(default_factory=Calibration)
    stop_reason: StopReason | None = None
    stop_message: str = ""  # the reason in words, for people
    margin: float | None = None  # pick vs runner-up, relative, after any re-measurement (close_call.Verdict)
    noise: float | None = None  # the larger relative half-width of the two medians' intervals
    remeasured: bool = False
    verdict: Verdict | None = None  # the pick, runner-up, speeds with spreads, tie or not
    modes: list[ModeRecord] = field(default_factory=list)  # every mode considered on every rung, and its fate
    # processes the launcher started for the trials: warm workers run trial after trial in one until one fails
    # (trial/warm.py); None where every trial had its own process (then it equals trials_launched)
    process_starts: int | None = None

    @property
    def trials_launched(self) -> int:
        return sum(not t.from_cache for t in self.trials)

    def launches_by_purpose(self) -> dict[str, int]:
        """Trials run now (not from the cache), counted by why the search launched them (LaunchPurpose)."""
        counts: dict[str, int] = {}
        for t in self.trials:
            if not t.from_cache:
                counts[t.purpose] = counts.get(t.purpose, 0) + 1
        return counts

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
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "modes": [m.to_dict() for m in self.modes],
            "process_starts": self.process_starts,
            "launches_by_purpose": self.launches_by_purpose(),
        }


class LaunchPurpose:
    """Why the search launched a trial: the report counts launches by these, so a user can see where they go."""

    FIRST = "first of a group"  # a (rung, checkpointing, mode) group's first trial, at its predicted boundary
    BOUNDARY = "boundary walk"  # within a group, between the largest that ran and the smallest that did not
    CONFIRM = "boundary confirmation"  # the pick's next micro-batch (`Search._confirm_boundary`)
    RATIO = "offload ratio"  # partial offload: the smallest fitting ratio at a micro-batch
    CLOSE_CALL = "close-call re-measurement"  # interleaved rounds of a tie (autotune.search.close_call)


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


def same_group(a: Candidate, b: Candidate) -> bool:
    """Same rung, checkpointing and mode: the micro-batch is all that differs (one memory line, one speed line)."""
    return a.rung is b.rung and a.grad_checkpointing == b.grad_checkpointing and a.mode == b.mode


def holds_at_least_the_memory_of(candidate: Candidate, measured: Candidate) -> bool:
    """Whether `candidate` needs at least the device memory `measured` needed, by construction, not by the model:
    the same rung, a micro-batch no smaller (activations grow with it), checkpointing only if `measured` had it
    too (full checkpointing keeps each layer's input instead of its activations), and a mode that keeps no less on
    the device: the same mode, or a partial optimizer offload keeping at least as many optimizer sub-groups on
    the device (DeepSpeed keeps int((1 - ratio) x n) of them there, runtime/zero/stage3.py:1105; classic offload,
    ratio 1, keeps none). So where `measured` did not fit, `candidate` cannot: no trial is needed to know it."""
    if candidate.rung is not measured.rung or candidate.micro_batch < measured.micro_batch:
        return False
    if candidate.grad_checkpointing and not measured.grad_checkpointing:
        return False
    if candidate.mode == measured.mode:
        return True
    ratio_only = all(m.is_classic or is_ratio_mode(m) for m in (candidate.mode, measured.mode))
    return ratio_only and candidate.mode.offload_ratio <= measured.mode.offload_ratio


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
    modes: ModesFor = no_modes  # the memory modes to consider per rung (autotune.modes.applies); default: classic only
    offload_ratios: tuple[float, ...] = ()  # the offload ratio's real settings, ascending (see search_modes)
    memory: MemoryModel = field(default_factory=MemoryModel)

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
        return self.memory.estimate(self.model, self.target, candidate, self.settings, self.calibration)

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

    def _trial(self, candidate: Candidate, purpose: str = LaunchPurpose.FIRST) -> TrialRecord:
        predicted = self._estimate(candidate)
        if slow := self._would_time_out(candidate):
            result = TrialResult(status="timeout", error=f"not run: {slow.key} timed out earlier in this run")
            record = TrialRecord(
                candidate, result, predicted.gpu_peak_bytes, self.limit_bytes, from_cache=True, purpose=purpose
            )
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
            purpose,
        )
        self.outcome.trials.append(record)
        peak = result.peak_memory_bytes
        if peak and (result.ok or result.status == "over_budget"):
            self.calibration = self.memory.calibrate(
                self.calibration, self.model, self.target, candidate, self.settings, peak
            )
            self.outcome.calibration = self.calibration
        elif result.status in MEMORY_FAILURES and self._modelled_memory_failed(result):
            # no peak, but a lower bound: it needed more than the memory it had
            limit = self.target.free_memory_bytes
            self.calibration = self.memory.calibrate_oom(
                self.calibration, self.model, self.target, candidate, self.settings, limit
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
        predicted = self.memory.estimate(self.model, self.target, candidate, self.settings, calibration)
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
            return self._after_first_failure(rung, ckpt, bad, between, mode)
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
        TrialResult.smaller_peak_point). The calibration pools its slope over every group
        (autotune.estimate.calibration); within one group the measured line is the better guide to where the
        limit falls."""
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
            self.calibration, self.model, self.target, failed_candidate, self.settings, at_least
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
            mb = self._next_micro_batch(rung, ckpt, ok, bad, guided, mode)

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

    # -- the pick: beyond noise, or the simpler config (autotune.search.close_call) -----------------------------
    def _fitted(self, candidate: Candidate, since: int = 0) -> list[TrialRecord]:
        return [
            t
            for t in self.outcome.trials[since:]
            if t.candidate == candidate and t.within_headroom and t.result.samples_per_s
        ]

    def _speed(self, candidate: Candidate, since: int = 0) -> Speed | None:
        return pooled([(t.result.step_times_s, t.result.samples_per_s) for t in self._fitted(candidate, since)])

    def _remeasure(self, candidates: Sequence[Candidate], rounds: int) -> dict[Candidate, Speed] | None:
        """Interleaved rounds (A, B, A, B); each candidate's speed from these trials alone, None when the budget
        ran out or a trial did not fit."""
        since = len(self.outcome.trials)
        self.outcome.remeasured = True
        for _ in range(rounds):
            for candidate in candidates:
                if self._budget_spent() or not self._trial(candidate, LaunchPurpose.CLOSE_CALL).within_headroom:
                    return None
        speeds = {c: self._speed(c, since) for c in candidates}
        return {c: s for c, s in speeds.items() if s is not None}

    def _confirm_boundary(self) -> None:
        """The pick ends on the largest micro-batch of its group that ran; the memory model only predicted that the
        next one does not fit. Unless a trial already showed it (an OOM or over the headroom there or below), one
        trial at the next eligible micro-batch confirms the boundary, and a fit there walks the group on upward
        (its calibrated line now has two measured points). Repeated while the pick moves; offload ratios confirm
        their own setting (`_confirm_ratio`)."""
        confirmed: set[Candidate] = set()
        while (best := self.outcome.best) is not None and best.candidate not in confirmed:
            pick = best.candidate
            confirmed.add(pick)
            above = [m for m in self.micro_batches if m > pick.micro_batch]
            if not above or is_ratio_mode(pick.mode) or self._stop_if_spent():
                return
            group = [
                t
                for t in self.outcome.trials
                if same_group(t.candidate, pick) and t.candidate.micro_batch > pick.micro_batch
            ]
            if any(t.within_headroom for t in group):
                return  # a larger one ran and was slower: the boundary is not what limits the pick
            failed = [t.candidate.micro_batch for t in group if not t.within_headroom]
            if failed and min(failed) <= above[0]:
                return
            self._search_group(
                pick.rung,
                pick.grad_checkpointing,
                above[0],
                pick.mode,
                pick.micro_batch,
                min(failed, default=None),
                LaunchPurpose.CONFIRM,
            )

    def _settle_close_call(self) -> None:
        """The pick among everything measured: faster only beyond the measured spread; a tie is re-measured
        interleaved and then goes to the simpler, safer config. Verdict, margin and spread go in the outcome."""
        # in trial order (not a set's hash order), so an exact tie resolves the same way in every process
        fitted = dict.fromkeys(t.candidate for t in self.outcome.trials if t.within_headroom and t.result.samples_per_s)
        speeds = {c: s for c in fitted if (s := self._speed(c)) is not None}
        verdict = settle(speeds, self._remeasure)
        if verdict is None:
            return
        self.outcome.verdict = verdict
        self.outcome.best = max(self._fitted(verdict.pick), key=lambda t: t.result.samples_per_s or 0.0)
        self.outcome.margin, self.outcome.noise = verdict.margin, verdict.spread

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
        self._finish_mode_records()
        if self.outcome.stop_reason is None:
            if self.outcome.best:
                self.outcome.stop_reason = StopReason.NO_BETTER
                self.outcome.stop_message = "no remaining candidate can beat the best measured"
            else:
                self.outcome.stop_reason = StopReason.EXHAUSTED
                self.outcome.stop_message = "every rung was ruled out or failed"
        return self.outcome

    def plan_modes(self) -> list[ModeRecord]:
        """Plan-only (no trials on this machine): every mode considered on every rung, each applicable one
        predicted as a not-trial-verified mode would be in a search; nothing is launched."""
        for rung, options in self._consider_modes().items():
            for ckpt in (False, True):
                for choice, record in options:
                    record.trial_verifiable = False
                    self._plan_mode(rung, ckpt, choice.mode, record, "plan only: no trials on this machine")
        return self.outcome.modes

    # -- modern memory modes (beyond the classic ladder) ----------------------------------------
    def _consider_modes(self) -> dict[Rung, list[tuple[ModeChoice, ModeRecord]]]:
        """Ask, once per rung, which modes apply; every one considered gets a record in the outcome."""
        options: dict[Rung, list[tuple[ModeChoice, ModeRecord]]] = {}
        for rung in self.rungs:
            for choice in self.modes(rung):
                record = ModeRecord(rung, choice.mode, choice.applies, choice.reason, choice.trial_verifiable)
                self.outcome.modes.append(record)
                if choice.applies:
                    record.status = "not tried"
                    options.setdefault(rung, []).append((choice, record))
        return options

    def _mode_group(self, rung: Rung, ckpt: bool, choice: ModeChoice, record: ModeRecord) -> None:
        """One applicable mode on one (rung, checkpointing): planned when no trial can run it, else searched."""
        if not choice.trial_verifiable:
            self._plan_mode(rung, ckpt, choice.mode, record)
            return
        if reason := self._stop_if_spent():
            record.detail = record.detail or f"not tried: {reason}"
            return
        launched = self._launched
        if is_ratio_mode(choice.mode):
            self._search_ratio(rung, ckpt, record)
        else:
            self._rung_group(rung, ckpt, choice.mode)
        record.trials += self._launched - launched

    def _plan_mode(self, rung: Rung, ckpt: bool, mode: Mode, record: ModeRecord, why: str = "") -> None:
        """Predicted only: the largest micro-batch the memory model says fits with the mode (for the offload
        ratio, the smallest ratio that fits there). Never a trial, never the pick."""
        if record.status == "planned" and record.grad_checkpointing is False:
            return  # without checkpointing it already fits: that is the plan
        if is_ratio_mode(mode):
            ratios = self._ratio_settings(mode)
            # GPU memory falls as the ratio rises but host RAM grows: where the largest ratio is over a host
            # limit, a smaller one may still fit both (the host need falls with it), so walk down to it
            top = next(
                (mb for r in reversed(ratios) if (mb := self._predicted_max(rung, ckpt, 0.0, Mode(offload_ratio=r)))),
                None,
            )
            ratio = self._planned_ratio(rung, ckpt, top, ratios) if top else None
            mode = Mode(offload_ratio=ratio) if ratio else mode
        else:
            top = self._predicted_max(rung, ckpt, 0.0, mode)
        if top is None:
            record.status = record.status if record.status == "planned" else "no fit"
            record.detail = record.detail or "the memory model says nothing of it fits"
            return
        record.status, record.mode, record.micro_batch, record.grad_checkpointing = "planned", mode, top, ckpt
        record.predicted_peak_bytes = self._estimate(Candidate(rung, top, ckpt, mode)).gpu_peak_bytes
        record.detail = why or "this backend cannot run it: predicted only"

    def _planned_ratio(self, rung: Rung, ckpt: bool, micro_batch: int, ratios: list[float]) -> float | None:
        """The smallest offload ratio that fits at `micro_batch` for a plan, None when none does. No trial will
        confirm a plan: the ratio must fit with the model's margin (as a classic plan row must), not on the point
        prediction a search's trials then confirm. Bisect on the GPU alone (monotone in the ratio); the host need
        grows with the ratio, so the smallest GPU fit is the best for the host."""
        ratio = smallest_fitting_ratio(ratios, lambda r: self._fits_with_margin(rung, micro_batch, ckpt, r))
        if ratio and not check_fit(self._estimate(Candidate(rung, micro_batch, ckpt, Mode(offload_ratio=ratio))),
                                   self.target, self.limits.headroom).fits:  # fmt: skip
            return None
        return ratio

    def _ratio_settings(self, mode: Mode) -> list[float]:
        """The offload ratio's real settings strictly between 0 (ZeRO-3's neighbour) and 1 (full offload)."""
        ratios = sorted({r for r in self.offload_ratios if 0.0 < r < 1.0})
        return ratios or [mode.offload_ratio]

    def _fits(self, candidate: Candidate) -> bool:
        """The calibrated point prediction within the limit: a trial confirms it (an OOM moves the ratio up), so
        the spread a plan-only answer must allow for (check_fit's margin) would only buy a slower ratio."""
        if self._measured_over(candidate):
            return False
        return self._anchored_peak(candidate) <= self.limit_bytes

    def _anchored_peak(self, candidate: Candidate) -> int:
        """The candidate's peak from measured peaks of its rung and checkpointing among the classic and partial-offload
        settings, where there are any. Two measured at its micro-batch: the line through them
        (`_on_measured_ratio_line`). Else the nearest measured setting's peak plus the model's difference between the
        two: the model's error in what they share (weights, buffers, activations) cancels, only what differs stays
        predicted; where that setting's own memory line is measured (`_peak_line`), its peak is read off the line at
        this micro-batch, so the model's difference is the ratio's alone, not its activation slope. Nothing measured:
        the point prediction."""
        predicted = self._estimate(candidate).gpu_peak_bytes
        anchors = [
            t
            for t in self.outcome.trials
            if t.candidate.rung is candidate.rung
            and t.candidate.grad_checkpointing == candidate.grad_checkpointing
            and (t.candidate.mode.is_classic or is_ratio_mode(t.candidate.mode))
            and t.result.ok
            and t.result.peak_memory_bytes
            and not t.from_cache
        ]
        ratio = candidate.mode.offload_ratio
        same = [t for t in anchors if t.candidate.micro_batch == candidate.micro_batch]
        if (on_line := _on_measured_ratio_line(same, ratio)) is not None:
            return on_line
        if not anchors:
            return predicted
        nearest = min(
            anchors,
            key=lambda t: (
                abs(t.candidate.micro_batch - candidate.micro_batch),
                abs(t.candidate.mode.offload_ratio - ratio),
            ),
        )
        at_micro_batch = replace(nearest.candidate, micro_batch=candidate.micro_batch)
        line = self._peak_line(at_micro_batch)
        if line is not None:  # the nearest setting's own measured memory line, read at this micro-batch
            difference = predicted - self._estimate(at_micro_batch).gpu_peak_bytes
            return int(line.seconds(candidate.micro_batch)) + difference
        difference = predicted - self._estimate(nearest.candidate).gpu_peak_bytes
        return (nearest.result.peak_memory_bytes or 0) + difference

    def _within_try_margin(self, candidate: Candidate) -> bool:
        """Whether the peak anchored on this run's measurements (`_anchored_peak`) is within TRY_MARGIN of the limit:
        the model alone put it there, but a measured peak of the rung may already say it is further over."""
        if self._measured_over(candidate):
            return False
        return self._anchored_peak(candidate) <= self.limit_bytes * (1 + TRY_MARGIN)

    def _fits_with_margin(self, rung: Rung, mb: int, ckpt: bool, ratio: float) -> bool:
        """GPU peak plus the model's margin within the limit at `ratio` (check_fit's GPU test, without host)."""
        predicted = self._estimate(Candidate(rung, mb, ckpt, Mode(offload_ratio=ratio)))
        return predicted.gpu_peak_bytes + predicted.gpu_margin_bytes <= self.limit_bytes

    def _ratio_fits(self, rung: Rung, mb: int, ckpt: bool) -> Callable[[float], bool]:
        """Whether the calibrated memory model says partial offload at ratio r fits (for the bisection)."""
        return lambda r: self._fits(Candidate(rung, mb, ckpt, Mode(offload_ratio=r)))

    def _search_ratio(self, rung: Rung, ckpt: bool, record: ModeRecord) -> None:
        """Partial optimizer offload: at the largest micro-batches some ratio below 1 reaches, the smallest ratio
        the memory model says fits (bisection), confirmed by trials; compared with everything else by measured
        speed only. Walks down the micro-batches while each step lowers the ratio and the speed has not fallen:
        the same ratio at a smaller micro-batch is no faster (A3 in autotune.search.speed), a lower one may be."""
        ratios = self._ratio_settings(record.mode)
        top = self._predicted_max(rung, ckpt, TRY_MARGIN, Mode(offload_ratio=ratios[-1]))
        if top is None:
            self._skip(rung, ckpt, "ruled out by the memory model at every offload ratio", record.mode)
            return
        previous_ratio: float | None = None
        previous_speed: float | None = None
        points = 0
        for mb in reversed([m for m in self.micro_batches if m <= top]):
            if points >= RATIO_MICRO_BATCHES or self._stop_if_spent():
                return
            ratio = smallest_fitting_ratio(ratios, self._ratio_fits(rung, mb, ckpt))
            largest = Candidate(rung, mb, ckpt, Mode(offload_ratio=ratios[-1]))
            if ratio is None and mb == top and self._within_try_margin(largest):
                ratio = ratios[-1]  # within TRY_MARGIN of fitting at the largest ratio: worth one trial
            if ratio is None or (previous_ratio is not None and ratio >= previous_ratio):
                continue
            if why := self._bounded(Candidate(rung, mb, ckpt, Mode(offload_ratio=ratio))):
                self._skip(rung, ckpt, why, Mode(offload_ratio=ratio))
                return
            points += 1
            fitted, speed = self._confirm_ratio(rung, ckpt, mb, ratio, ratios)
            if fitted is None or speed is None:
                continue
            if previous_speed is not None and speed < previous_speed:
                return
            previous_ratio, previous_speed = fitted, speed

    def _confirm_ratio(
        self, rung: Rung, ckpt: bool, mb: int, ratio: float, ratios: list[float]
    ) -> tuple[float | None, float | None]:
        """Up to RATIO_TRIES trials at one micro-batch: an OOM at ratio r moves the next try up (the smallest
        larger ratio the OOM-calibrated model says fits, or, once two trials here reported peaks, the one the line
        through those peaks says fits: GPU memory is linear in the offloaded share); a fit lets the calibrated
        model try one smaller ratio. Returns the smallest ratio that ran within the headroom and its speed."""
        fitted: float | None = None
        failed: float | None = None
        speed: float | None = None
        current: float | None = ratio
        peaks: dict[float, int] = {}  # ratio -> measured peak at this micro-batch
        for _ in range(RATIO_TRIES):
            if current is None or self._stop_if_spent():
                break
            record = self._trial(Candidate(rung, mb, ckpt, Mode(offload_ratio=current)), LaunchPurpose.RATIO)
            if record.result.peak_memory_bytes:
                peaks[current] = record.result.peak_memory_bytes
            if record.within_headroom:
                self._consider_best(record)
                fitted, speed = current, record.result.samples_per_s
                lower = [r for r in ratios if r < current and (failed is None or r > failed)]
                current = smallest_fitting_ratio(lower, self._ratio_fits(rung, mb, ckpt))
            elif record.memory_failure and not record.over_host_headroom:
                failed = current
                higher = [r for r in ratios if r > current and (fitted is None or r < fitted)]
                if (needed := self._ratio_from_peaks(peaks)) is not None:
                    higher = [r for r in higher if r >= needed] or higher[-1:]
                current = smallest_fitting_ratio(higher, self._ratio_fits(rung, mb, ckpt)) or (
                    higher[0] if needed is not None and higher else None
                )
            else:
                break
        return fitted, speed

    def _ratio_from_peaks(self, peaks: dict[float, int]) -> float | None:
        """The ratio at which the line through the two latest measured peaks meets the limit; None with fewer
        than two points or a line that does not fall as the ratio rises (noise)."""
        if len(peaks) < 2:
            return None
        (r1, p1), (r2, p2) = list(peaks.items())[-2:]
        if r1 == r2 or (p2 - p1) / (r2 - r1) >= 0:
            return None
        slope = (p2 - p1) / (r2 - r1)
        return r2 + (self.limit_bytes - p2) / slope

    def _finish_mode_records(self) -> None:
        """Each verifiable mode's record takes its best measured trial (or says why nothing of it fitted)."""
        for record in self.outcome.modes:
            if not (record.applies and record.trial_verifiable):
                continue
            ratio = is_ratio_mode(record.mode)
            ran = [
                t
                for t in self.outcome.trials
                if t.candidate.rung is record.rung
                and (is_ratio_mode(t.candidate.mode) if ratio else t.candidate.mode == record.mode)
            ]
            fitted = [t for t in ran if t.within_headroom and t.result.samples_per_s]
            if fitted:
                best = max(fitted, key=lambda t: t.result.samples_per_s or 0.0)
                record.status, record.mode = "measured", best.candidate.mode
                record.micro_batch, record.grad_checkpointing = (
                    best.candidate.micro_batch,
                    best.candidate.grad_checkpointing,
                )
                record.samples_per_s, record.predicted_peak_bytes = best.result.samples_per_s, best.predicted_peak_bytes
                record.detail = f"{len(ran)} trial(s); fastest: {best.candidate.describe()}"
            elif ran:
                record.status = "no fit"
                record.detail = "tried: " + ", ".join(f"{t.candidate.key} {t.result.status}" for t in ran)
            else:
                skips = [s.reason for s in self.outcome.skipped if s.rung is record.rung and s.mode == record.mode]
                skips += [
                    s.reason for s in self.outcome.skipped if s.rung is record.rung and ratio and is_ratio_mode(s.mode)
                ]
                record.detail = record.detail or "; ".join(dict.fromkeys(skips)) or "not reached"


def _on_measured_ratio_line(same_micro_batch: list[TrialRecord], ratio: float) -> int | None:
    """The peak at `ratio` on the line through two peaks measured at its micro-batch (GPU memory is linear in the
    offloaded share: each ratio step moves whole optimizer sub-groups, runtime/zero/stage3.py:1103-1108): the two
    on either side of it where there are such, else the two nearest on one side (a trial confirms the guess: an
    OOM moves the ratio up). None with fewer than two measured ratios there."""
    by_ratio = {t.candidate.mode.offload_ratio: t.result.peak_memory_bytes or 0 for t in same_micro_batch}
    less = sorted(r for r in by_ratio if r < ratio)
    more = sorted(r for r in by_ratio if r > ratio)
    if less and more:
        r1, r2 = less[-1], more[0]
    elif len(more) >= 2:
        r1, r2 = more[0], more[1]
    elif len(less) >= 2:
        r1, r2 = less[-2], less[-1]
    else:
        return None
    p1, p2 = by_ratio[r1], by_ratio[r2]
    beyond = not (less and more)
    if beyond and p2 >= p1:  # no fall as the ratio rises: noise, not a line to extend beyond its points
        return None
    return int(p1 + (p2 - p1) * (ratio - r1) / (r2 - r1))
