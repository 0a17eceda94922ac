"""What a search records and reports: its limits, each trial and skip, the pick's verdict, its events, its outcome,
and why each launch happened. Plain values shared by the search's state (`state.py`) and walks, the tuner, the report
builders and the benchmarks. The verdict is decided in `pick_decision.py` and rendered in autotune.report.pick."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.measurement import Speed
from autotune.core.stop import StopReason
from autotune.estimate.estimate_types import Calibration
from autotune.modes.search_view import ModeRecord
from autotune.trial.trial_types import TrialResult

MEMORY_FAILURES = ("oom_gpu", "oom_host", "over_budget")
TIME_BUDGET_CUT = "stopped at the time budget"  # a trial's error when --time-budget ended it (tuning/trials.py)
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


@dataclass(frozen=True)
class Verdict:
    """What the pick is and how sure: the runner-up, the margin between their medians, and whether it is a tie
    (decided by autotune.search.pick_decision; a plain value here because the outcome holds it)."""

    pick: Candidate
    speed: Speed
    runner_up: Candidate | None = None
    runner_up_speed: Speed | None = None
    tie: bool = False
    remeasured: bool = False

    @property
    def margin(self) -> float | None:
        """Pick over runner-up, relative to the runner-up's median (negative when a tie picked the slower)."""
        if self.runner_up_speed is None:
            return None
        return self.speed.median / self.runner_up_speed.median - 1

    @property
    def spread(self) -> float:
        """The larger relative half-width of the two medians' intervals: the noise the margin is weighed by."""
        widths = [s.stats.half_width for s in (self.speed, self.runner_up_speed) if s is not None]
        return max(widths)

    def to_dict(self) -> dict:
        return {
            "pick": self.pick.to_dict(),
            "speed": self.speed.to_dict(),
            "runner_up": self.runner_up.to_dict() if self.runner_up else None,
            "runner_up_speed": self.runner_up_speed.to_dict() if self.runner_up_speed else None,
            "margin": self.margin,
            "spread": self.spread,
            "tie": self.tie,
            "remeasured": self.remeasured,
        }


# "prepare": the tuner's own work before or between trials (building DeepSpeed's ops, replacing warm workers)
SearchEventKind = Literal["prepare", "trial_start", "trial_end", "skip"]


@dataclass(frozen=True)
class SearchEvent:
    kind: SearchEventKind
    candidate: Candidate | None = None
    message: str = ""
    record: TrialRecord | None = None
    # the tuner's expected-total event, before the first trial: the search's trial budget (--max-trials or derived,
    # search/trial_budget.py), for the observers that count trials against it (progress lines, the hook)
    trial_budget: int | None = None


@dataclass(kw_only=True)
class SearchOutcome:
    best: TrialRecord | None
    trials: list[TrialRecord] = field(default_factory=list)
    skipped: list[SkipRecord] = field(default_factory=list)
    calibration: Calibration = field(default_factory=Calibration)
    stop_reason: StopReason | None = None
    stop_message: str = ""  # the reason in words, for people
    margin: float | None = None  # pick vs runner-up, relative, after any re-measurement (Verdict)
    noise: float | None = None  # the larger relative half-width of the two medians' intervals
    remeasured: bool = False
    verdict: Verdict | None = None  # the pick, runner-up, speeds with spreads, tie or not
    modes: list[ModeRecord] = field(default_factory=list)  # every mode considered on every rung, and its fate
    # processes the launcher started for the trials: warm workers run trial after trial in one until one fails
    # (trial/launch/warm.py); None where every trial had its own process (then it equals trials_launched)
    process_starts: int | None = None
    # the pick's trial in a fresh process, where the other trials ran in warm workers whose device memory no fresh
    # process had confirmed (GPUs): its confirmation launch, or its own trial where that was the first its processes
    # ran (Pick.confirm_fresh); its peak is what the report states for the pick
    fresh_confirmation: TrialRecord | None = None

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
            "fresh_confirmation": self.fresh_confirmation.to_dict() if self.fresh_confirmation else None,
            "launches_by_purpose": self.launches_by_purpose(),
        }


class LaunchPurpose:
    """Why the search launched a trial: the report counts launches by these, so a user can see where they go."""

    FIRST = "first of a group"  # a (rung, checkpointing, mode) group's first trial, at its predicted boundary
    BOUNDARY = "boundary walk"  # within a group, between the largest that ran and the smallest that did not
    CONFIRM = "boundary confirmation"  # the pick's next micro-batch (`Pick.confirm_boundary`)
    RATIO = "offload ratio"  # partial offload: the smallest fitting ratio at a micro-batch
    CLOSE_CALL = "close-call re-measurement"  # interleaved rounds of a tie (autotune.search.pick_decision)
    FRESH = "fresh-process confirmation"  # the pick once more in a process of its own (`Pick.confirm_fresh`)


RunTrial = Callable[[Candidate], tuple[TrialResult, bool]]  # -> (result, came from cache)
