"""Real trials: does this ds_config run on this hardware, and how fast?

Nothing here imports torch: workers do, in their own processes, so the tuner never holds GPU memory.
The launchers are imported on first use (module __getattr__), so `autotune.trial.trial_types` alone stays
cheap for callers that only need the types (the cache, a cache hit).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.trial.launch.hostfile import HostfileLauncher
    from autotune.trial.launch.local import LocalLauncher
    from autotune.trial.launch.processes import tagged_processes
    from autotune.trial.launch.slurm import SlurmLauncher
    from autotune.trial.launch.warm import FreshAfterWarm, WarmWorkerPool
    from autotune.trial.trial_types import RankMetrics, TrialLauncher, TrialResult, TrialSpec, TrialStatus

_WHERE = {
    "FreshAfterWarm": "autotune.trial.launch.warm",
    "HostfileLauncher": "autotune.trial.launch.hostfile",
    "LocalLauncher": "autotune.trial.launch.local",
    "RankMetrics": "autotune.trial.trial_types",
    "SlurmLauncher": "autotune.trial.launch.slurm",
    "TrialLauncher": "autotune.trial.trial_types",
    "TrialResult": "autotune.trial.trial_types",
    "TrialSpec": "autotune.trial.trial_types",
    "TrialStatus": "autotune.trial.trial_types",
    "WarmWorkerPool": "autotune.trial.launch.warm",
    "tagged_processes": "autotune.trial.launch.processes",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'autotune.trial' has no attribute {name!r}")


def run_trial(spec: TrialSpec, launcher: TrialLauncher | None = None) -> TrialResult:
    """Run one trial to completion; every process it started is gone when this returns."""
    if launcher is None:
        from autotune.trial.launch.local import LocalLauncher

        launcher = LocalLauncher()
    return launcher.run(spec)


__all__ = [
    "FreshAfterWarm",
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
