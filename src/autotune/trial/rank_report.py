"""What one worker rank writes when its trial ends, and how the parent finds it.

The file is the only channel from a rank to the parent: it must carry the failure as well as the
figures, because a rank that raised is still alive enough to say why.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.infra.atomic import atomic_write_json
from autotune.trial.trial_types import RankMetrics, TrialStatus

# What a rank that is still healthy reports: a trial that ran, or one that stopped itself over the search's limit
# after its warm-up (TrialSpec.stop_over_bytes; trial/worker/train_steps.py). A warm worker serves on after either.
HEALTHY_STATUSES: tuple[TrialStatus, ...] = ("ok", "over_budget")


@dataclass(frozen=True)
class RankReport:
    rank: int
    status: TrialStatus
    error: str | None = None
    memory: RankMetrics | None = None
    step_times_s: list[float] = field(default_factory=list)  # all-reduced max over ranks, warm-up excluded
    phases: dict[str, float] = field(default_factory=dict)  # seconds, in the order they happened
    micro_step_s: float | None = None  # see training.StepTimes
    optimizer_step_s: float | None = None
    accumulation: int = 1
    smaller_micro_batch: int | None = None
    smaller_micro_step_s: float | None = None
    smaller_step_s: float | None = None
    train_batch_size: int | None = None
    hardware_flops_per_token: float | None = None  # includes activation recompute
    model_flops_per_token: float | None = None  # excludes it: the MFU numerator
    engine_facts: dict = field(default_factory=dict)  # what the engine really runs (training.engine_mode_facts)
    host_rss_after_bytes: int | None = None  # warm workers: RSS once the trial's memory is freed (warm.py checks it)
    device_after_bytes: int | None = None  # warm GPU workers: device memory this process still holds then (ditto)
    # warm workers: pinned host bytes torch's host allocator still owns then (trial/worker/memory.py pinned_host_bytes)
    pinned_after_bytes: int | None = None
    # warm workers: ZeRO++ process groups DeepSpeed still holds then (deepspeed_globals.py zeropp_groups_left); any
    # makes the pool replace the workers, whose next hpZ trial would fail DeepSpeed's assertion
    zeropp_groups_after: int | None = None
    # how many trials this process ran before this one: 0 for a fresh trial and for a warm worker's first, which
    # start from the same process state (TrialResult.first_in_process)
    trial_in_process: int = 0
    # warm workers: the same three figures before their first trial, once the process group, one matmul and one
    # collective have run (worker.py serve, training.settle): what the pool measures growth from (warm.py)
    floor: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RankReport:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if values.get("memory") is not None:
            values["memory"] = RankMetrics(**values["memory"])
        return cls(**values)


def report_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.json"


def log_path(out_dir: Path, rank: int) -> Path:
    return out_dir / f"rank{rank}.log"


def pid_path(out_dir: Path, rank: int) -> Path:
    """Written by the rank at start, so the parent can watch its memory even under torchrun or srun."""
    return out_dir / f"rank{rank}.pid"


def request_path(pool_dir: Path, index: int) -> Path:
    """The warm pool's n-th instruction to its workers: a trial to run, or stop."""
    return pool_dir / "requests" / f"{index:06d}.json"


def write_report(out_dir: Path, report: RankReport) -> None:
    atomic_write_json(report_path(out_dir, report.rank), report.to_dict())


def read_reports(out_dir: Path, ranks: range) -> dict[int, RankReport]:
    """Reports of the ranks that wrote one; a missing or unreadable file means the rank died first."""
    reports = {}
    for rank in ranks:
        path = report_path(out_dir, rank)
        try:
            reports[rank] = RankReport.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
    return reports
