"""DeepSpeed's process-wide references to a finished engine, dropped so a warm worker's next trial starts clean.

`engine.destroy()` (deepspeed 0.19.8) removes ZeRO-3's hooks but leaves two module-level references that keep the
whole model, its optimizer and every partition alive for the life of the process (the leak users report in
DeepSpeed#7204, "Whenever the engine is destroyed and reinitialized, RAM seems to accumulate"):
- runtime/zero/parameter_offload.py:20 `FWD_MODULE_STACK`: `setup_zero_stage3_hooks` appends the top module
  (314-315) and nothing pops it (`DeepSpeedZeRoOffload.destroy`, 281-297, removes the hooks only);
- runtime/zero/partitioned_param_coordinator.py:632-633: `functools.lru_cache` on the method `__params_to_release`,
  a cache kept on the class and keyed by `self`, so it holds every coordinator, and through their traces the
  parameters.
A warm worker that kept them measured each later trial on top of the earlier ones' leftovers (benchmarks/README.md,
"Warm workers and DeepSpeed's leftovers").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# How far to look through decorators (instrument_w_nvtx wraps the lru_cache in a closure, without functools.wraps).
_WRAPPER_DEPTH = 3


def release_engine_globals(model: Any) -> None:
    """Drop DeepSpeed's module-level references to `model` (and its submodules) and its cached coordinators.

    Call after `engine.destroy()` once no engine of this process is in use: the coordinator cache is the class's."""
    try:
        from deepspeed.runtime.zero import parameter_offload, partitioned_param_coordinator
    except ImportError:  # no DeepSpeed, or a version without ZeRO-3's offload module: nothing was kept
        return
    stack = getattr(parameter_offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list) and model is not None:
        owned = {id(module) for module in model.modules()}
        stack[:] = [module for module in stack if id(module) not in owned]
    coordinator = getattr(partitioned_param_coordinator, "PartitionedParameterCoordinator", None)
    for cache in lru_caches(vars(coordinator).values() if coordinator is not None else ()):
        cache.cache_clear()


def lru_caches(attributes: Iterable[Any]) -> Iterator[Any]:
    """The functools caches among `attributes`, also when a decorator wraps them (through __wrapped__ or a closure),
    each once."""
    seen: set[int] = set()
    for attribute in attributes:
        for cache in _caches_in(attribute, _WRAPPER_DEPTH):
            if id(cache) not in seen:
                seen.add(id(cache))
                yield cache


def _caches_in(value: Any, depth: int) -> Iterator[Any]:
    if callable(getattr(value, "cache_clear", None)) and callable(getattr(value, "cache_info", None)):
        yield value
        return
    if depth == 0:
        return
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None:
        yield from _caches_in(wrapped, depth - 1)
    for cell in getattr(value, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(contents):
            yield from _caches_in(contents, depth - 1)
