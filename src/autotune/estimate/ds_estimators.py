"""DeepSpeed's own model-state estimators, called without importing the ZeRO runtime.

`estimate_zero2_model_states_mem_needs` and `estimate_zero3_model_states_mem_needs` are plain
arithmetic, but the modules that hold them import torch and the whole ZeRO runtime (about 3 s on the
2-core dev machine), which would dominate `autotune plan`. We compile just those two function
definitions from the installed DeepSpeed source, so every figure is the installed version's own.
If the source cannot be read that way (e.g. a zipped install), we import the modules normally.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autotune.infra.environment import parse_without_device

ZERO2_FUNCTION = "estimate_zero2_model_states_mem_needs"
ZERO3_FUNCTION = "estimate_zero3_model_states_mem_needs"
ZERO2_MODULE = "runtime/zero/stage_1_and_2.py"
ZERO3_MODULE = "runtime/zero/stage3.py"


@dataclass(frozen=True)
class DeepSpeedEstimators:
    zero2: Callable[..., tuple[int, int]]  # (total_params, gpus_per_node, nodes, cpu_offload, buffer_factor)
    zero3: Callable[..., tuple[int, int, int]]
    origin: str  # where the functions came from, for reports


class EstimatorSourceError(RuntimeError):
    """The installed DeepSpeed source no longer holds the functions in the expected form."""


def _compile_function(path: Path, name: str) -> Callable:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            module = ast.Module(body=[node], type_ignores=[])
            namespace: dict = {"__builtins__": builtins}
            exec(compile(module, str(path), "exec"), namespace)  # DeepSpeed's own code, nothing else
            return namespace[name]
    raise EstimatorSourceError(f"{name} not found in {path}")


def compile_estimators() -> DeepSpeedEstimators:
    """The two functions compiled from the installed source files; torch is not imported."""
    spec = importlib.util.find_spec("deepspeed")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise EstimatorSourceError("deepspeed is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    return DeepSpeedEstimators(
        zero2=_compile_function(root / ZERO2_MODULE, ZERO2_FUNCTION),
        zero3=_compile_function(root / ZERO3_MODULE, ZERO3_FUNCTION),
        origin=f"compiled from {root}",
    )


def import_estimators() -> DeepSpeedEstimators:
    """The same functions by a normal import (slow: torch and the ZeRO runtime come with them)."""
    parse_without_device()  # never let the tuner process touch CUDA
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return DeepSpeedEstimators(
        zero2=getattr(stage_1_and_2, ZERO2_FUNCTION),
        zero3=getattr(stage3, ZERO3_FUNCTION),
        origin="imported",
    )


@cache
def deepspeed_estimators() -> DeepSpeedEstimators:
    """Compiled when possible (fast), imported otherwise. Cached: the installed files do not change."""
    try:
        return compile_estimators()
    except (OSError, SyntaxError, EstimatorSourceError):
        return import_estimators()
