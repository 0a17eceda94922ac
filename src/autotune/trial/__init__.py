"""Real trials: does this ds_config run on this hardware, and how fast?

Nothing here imports torch: workers do, in their own processes, so the tuner never holds GPU memory.
The launchers are imported on first use (module __getattr__), so `autotune.trial.types` alone stays
cheap for callers that only need the types (the cache, a cache hit).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.trial.hostfile import HostfileLauncher
    from autotune.trial.local import LocalLauncher
    from autotune.trial.processes import tagged_processes
    from autotune.trial.slurm import SlurmLauncher
    from autotune.trial.types import RankMetrics, TrialLauncher, TrialResult, TrialSpec, TrialStatus
    from autotune.trial.warm import FreshAfterWarm, WarmWorkerPool

_WHERE = {
    "FreshAfterWarm": "autotune.trial.warm",
    "HostfileLauncher": "autotune.trial.hostfile",
    "LocalLauncher": "autotune.trial.local",
    "RankMetrics": "autotune.trial.types",
    "SlurmLauncher": "autotune.trial.slurm",
    "TrialLauncher": "autotune.trial.types",
    "TrialResult": "autotune.trial.types",
    "TrialSpec": "autotune.trial.types",
    "TrialStatus": "autotune.trial.types",
    "WarmWorkerPool": "autotune.trial.warm",
    "tagged_processes": "autotune.trial.processes",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'autotune.trial' has no attribute {name!r}")


def run_trial(spec: TrialSpec, launcher: TrialLauncher | None = None) -> TrialResult:
    """Run one trial to completion; every process it started is gone when this returns."""
    if launcher is None:
        from autotune.trial.local import LocalLauncher

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
