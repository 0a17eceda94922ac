"""Own-command trials timed by wall clock: the step boundaries the step hook records, read from outside.

The hook (trial/own_command/step_hook/sitecustomize.py) makes each rank of the user's command append the time of every
optimizer step boundary to a file; the tuner reads those files while the command runs, turns them into whole
optimizer step times (the slowest rank's gap between two boundaries) and stops the command once their median
is known well enough (autotune.core.measurement.enough_steps), as a synthetic trial stops measuring.

Steps up to the engine's profiled step are warm-up: the first ones build the optimizer state, and the profiled
one runs DeepSpeed's flops profiler (script.py), which slows it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STEP_LOG_ENV = "AUTOTUNE_STEP_LOG"
HOOK_DIR = Path(__file__).resolve().parent / "step_hook"


def hook_env(env: Mapping[str, str], log_stem: Path) -> dict[str, str]:
    """The command's environment with the step hook first on PYTHONPATH and told where to write."""
    paths = [str(HOOK_DIR), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "PYTHONPATH": os.pathsep.join(paths), STEP_LOG_ENV: str(log_stem)}


def read_boundaries(log_stem: Path, world_size: int) -> list[list[float]]:
    """Each rank's boundary times so far (a line being written is left for the next read)."""
    ranks = []
    for rank in range(world_size):
        try:
            text = Path(f"{log_stem}.rank{rank}").read_text()
        except OSError:
            text = ""
        lines = text.split("\n")[:-1]  # only lines with their newline: complete
        ranks.append([float(line) for line in lines if line])
    return ranks


def step_times(boundaries: list[list[float]], warmup_steps: int) -> list[float]:
    """Whole optimizer steps after the first `warmup_steps`: per step, the slowest rank's gap between its two
    boundaries. Only steps every rank has finished count."""
    if not boundaries or not all(boundaries):
        return []
    done = min(len(times) for times in boundaries)
    return [max(times[k + 1] - times[k] for times in boundaries) for k in range(max(1, warmup_steps) - 1, done - 1)]
