"""The trial launcher shared by autotune and the exhaustive grid, so both pay the same per-trial cost."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from autotune.trial import LocalLauncher, WarmWorkerPool
from autotune.trial.trial_types import TrialLauncher


@contextmanager
def make_launcher(kind: str) -> Iterator[TrialLauncher]:
    """ "local": a fresh worker process per trial, autotune's default and what DeepSpeed's autotuner does too.
    "warm": one worker pool kept for the whole method (start-up paid once), closed afterwards.
    """
    if kind == "local":
        yield LocalLauncher()
        return
    if kind == "warm":
        with WarmWorkerPool() as pool:
            yield pool
        return
    raise ValueError(f"launcher must be local or warm, got {kind!r}")
