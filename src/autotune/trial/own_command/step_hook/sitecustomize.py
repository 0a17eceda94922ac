"""Times the optimizer steps of the user's own training command, from outside its code.

An own-command trial (autotune/trial/own_command/script.py) puts this directory first on PYTHONPATH, so every Python
process of the command imports this file at start-up (the `site` module imports `sitecustomize`). With
AUTOTUNE_STEP_LOG set, it patches DeepSpeed's engine as that module is imported, and nothing else:

- `DeepSpeedEngine.step`: when a call advanced `global_steps` (an optimizer step boundary: deepspeed 0.19.8
  runtime/engine.py:3558), the rank appends the wall-clock time to AUTOTUNE_STEP_LOG.rank<R>. The tuner reads
  the gaps between boundaries: whole optimizer steps, with every micro-step, the optimizer and offload's host
  work, and the script's own data loading in between.
- `DeepSpeedEngine._autotuning_exit` (runtime/engine.py:3705, called at step end_profile_step + 1): the engine
  still writes its profiled-step metric, but the `exit()` after it is caught, so the job keeps training and
  the tuner decides when enough steps were timed (then it stops the job, as after any trial).

Stdlib only: the command may run an interpreter that has no autotune installed. A `sitecustomize` the
environment already had (later on sys.path) is still run, first.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

ENGINE_MODULE = "deepspeed.runtime.engine"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_next_sitecustomize() -> None:
    others = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _record_boundaries(engine_class: Any, log_stem: str) -> None:  # DeepSpeedEngine: deepspeed has no types
    step = engine_class.step
    autotuning_exit = engine_class._autotuning_exit

    def timed_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.global_steps
        try:
            return step(self, *args, **kwargs)
        finally:
            if self.global_steps != before:
                with open(f"{log_stem}.rank{self.global_rank}", "a") as log:
                    log.write(f"{time.time():.6f}\n")

    def metric_without_exit(self: Any) -> None:
        with contextlib.suppress(SystemExit):
            autotuning_exit(self)

    engine_class.step = timed_step
    engine_class._autotuning_exit = metric_without_exit


class _EngineHook(importlib.abc.MetaPathFinder):
    """Finds DeepSpeed's engine module as usual and patches its class once the module has run."""

    def __init__(self, log_stem: str) -> None:
        self.log_stem = log_stem

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != ENGINE_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module
        log_stem = self.log_stem

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _record_boundaries(module.DeepSpeedEngine, log_stem)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_run_next_sitecustomize()
if os.environ.get("AUTOTUNE_STEP_LOG"):
    sys.meta_path.insert(0, _EngineHook(os.environ["AUTOTUNE_STEP_LOG"]))
