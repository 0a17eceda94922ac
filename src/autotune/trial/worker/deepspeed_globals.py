"""DeepSpeed's process-wide references to a finished engine, dropped so a warm worker's next trial starts clean.

`engine.destroy()` (deepspeed 0.19.8) removes ZeRO-3's hooks but leaves two module-level references that keep the
whole model, its optimizer and every partition alive for the life of the process (the leak users report in
DeepSpeed#7204, "Whenever the engine is destroyed and reinitialized, RAM seems to accumulate"):
- runtime/zero/parameter_offload.py:20 `FWD_MODULE_STACK`: `setup_zero_stage3_hooks` appends the top module
  (314-315) and nothing pops it (`DeepSpeedZeRoOffload.destroy`, 281-297, removes the hooks only);
- runtime/zero/partitioned_param_coordinator.py:632-633: `functools.lru_cache` on the method `__params_to_release`,
  a cache kept on the class and keyed by `self`, so it holds every coordinator, and through their traces the
  parameters.
A third leftover is native memory, not Python objects: with parameters offloaded to NVMe, ZeRO-3's
`AsyncPartitionedParameterSwapper` takes its swap buffers from DeepNVMe's page-locked allocator
(runtime/swap_tensor/partitioned_param_swapper.py:131 `buffers`, 396 `partitioned_swap_buffer`). That allocator is
one per process (ops/csrc/pin_memory/deepspeed_pin_tensor.cpp:27-31, a static shared manager) and its tensors come
from `from_blob` without a deleter (42-56), so the memory (mlock'ed) lives until `free_cpu_locked_tensor`, which
the parameter swapper never calls; the optimizer's swapper does, in `SwapBufferManager.__del__`
(runtime/swap_tensor/utils.py:232-245). Measured here: each ZeRO-3 trial with NVMe parameter offload left its worker
+957 MiB RSS (buffer_count 5 x buffer_size 1e8 x 2 bytes = 954 MiB), ZeRO-3 with NVMe optimizer offload +0.
A warm worker that kept any of them measured each later trial on top of the earlier ones' leftovers
(benchmarks/README.md, "Warm workers and DeepSpeed's leftovers").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# How far to look through decorators (instrument_w_nvtx wraps the lru_cache in a closure, without functools.wraps).
_WRAPPER_DEPTH = 3
# The parameter swapper's page-locked buffers and the handle each was allocated through (partitioned_param_swapper.py)
_SWAP_BUFFERS = (("aio_read_handle", "buffers"), ("aio_write_handle", "partitioned_swap_buffer"))


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
    if model is not None:
        release_nvme_param_buffers(model)


def release_nvme_param_buffers(model: Any) -> int:
    """Give back the page-locked swap buffers of the NVMe parameter swapper(s) `model`'s parameters point to.

    Returns the bytes freed. The tensors are dropped from the swapper too: their memory is gone, so nothing may
    read them again (the trial is over when this runs)."""
    freed = 0
    swappers = {id(s): s for p in model.parameters() if (s := getattr(p, "nvme_swapper", None)) is not None}
    for swapper in swappers.values():
        for handle_name, buffer_name in _SWAP_BUFFERS:
            handle, buffer = getattr(swapper, handle_name, None), getattr(swapper, buffer_name, None)
            if handle is None or buffer is None:
                continue
            size = buffer.numel() * buffer.element_size()
            if handle.free_cpu_locked_tensor(buffer):  # False: not DeepNVMe's (a GPUDirect buffer), left alone
                freed += size
                setattr(swapper, buffer_name, None)
    return freed


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
