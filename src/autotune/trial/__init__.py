"""Real trials: does this ds_config run on this hardware, and how fast?

Nothing here imports torch: workers do, in their own processes, so the tuner never holds GPU memory.
"""

from __future__ import annotations

from autotune.trial.hostfile import HostfileLauncher
from autotune.trial.local import LocalLauncher
from autotune.trial.processes import tagged_processes
from autotune.trial.slurm import SlurmLauncher
from autotune.trial.types import RankMetrics, TrialLauncher, TrialResult, TrialSpec, TrialStatus
from autotune.trial.warm import WarmWorkerPool


def run_trial(spec: TrialSpec, launcher: TrialLauncher | None = None) -> TrialResult:
    """Run one trial to completion; every process it started is gone when this returns."""
    return (launcher or LocalLauncher()).run(spec)


__all__ = [
    "HostfileLauncher",
    "LocalLauncher",
    "RankMetrics",
    "SlurmLauncher",
    "TrialLauncher",
    "TrialResult",
    "TrialSpec",
    "TrialStatus",
    "WarmWorkerPool",
    "run_trial",
    "tagged_processes",
]
