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

ZeRO++ keeps process groups in module globals of deepspeed/utils/groups.py (0.19.8), which no engine.destroy() drops:
- hpZ: `_create_zero_param_parallel_group` (called from runtime/zero/stage3.py:753 and partition_parameters.py:1119)
  asserts `_ZERO_PARAM_INTRA_PARALLEL_GROUP is None` (groups.py:938-939) and then sets it (952): a warm worker's
  second hpZ trial fails that assertion (its model built under zero.Init), or, built outside it, silently runs on
  the first trial's group whatever its own hpZ size (stage3.py:267-273 takes a group already there; measured:
  benchmarks/zeropp_group_reuse_cpu.py, hpZ 4 got the size-2 group), unless the first one's group is released;
- qgZ: engine.py:2161 calls `_get_local_all_to_all_group`, which puts new groups into `_ALL_TO_ALL_GROUP` on every
  call (groups.py:738-765) without destroying the last ones: each qgZ trial leaves its communicators behind.
`deepspeed.comm.destroy_process_group(group)` (comm/comm.py:186-196) destroys one and drops DeepSpeed's references to
it (`groups._release_process_group_references`, groups.py:89-150); a group this rank is not a member of is
`GroupMember.NON_GROUP_MEMBER`, which it returns early for (comm.py:190-191): nothing to destroy, so that entry is
dropped from the dict here. Across nodes only: on one node ZeRO++ does not apply (modes/applies.py).
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


def zeropp_groups_left() -> int:
    """How many ZeRO++ process groups DeepSpeed still holds in its globals (0 when none, or no DeepSpeed)."""
    try:
        from deepspeed.utils import groups
    except ImportError:
        return 0
    hpz = getattr(groups, "_ZERO_PARAM_INTRA_PARALLEL_GROUP", None)
    return (hpz is not None) + len(getattr(groups, "_ALL_TO_ALL_GROUP", {}) or {})


def release_zeropp_groups() -> int:
    """Destroy the hpZ and qgZ process groups a finished engine left in DeepSpeed's globals; returns how many are
    still held afterwards (0: released; more: this process must not run another ZeRO++ trial)."""
    try:
        import deepspeed.comm as dist
        import torch.distributed
        from deepspeed.utils import groups
    except ImportError:
        return 0
    hpz = getattr(groups, "_ZERO_PARAM_INTRA_PARALLEL_GROUP", None)
    all_to_all = getattr(groups, "_ALL_TO_ALL_GROUP", None)
    made = [hpz, *(all_to_all or {}).values()]
    non_member = torch.distributed.GroupMember.NON_GROUP_MEMBER  # an int (-100), not a group

    def outside(group: Any) -> bool:
        return isinstance(group, int) and group == non_member

    for group in made:
        if group is not None and not outside(group):
            dist.destroy_process_group(group)
    if isinstance(all_to_all, dict):
        for name, group in list(all_to_all.items()):
            if outside(group):  # never a group of this rank's: nothing was made here to destroy
                del all_to_all[name]
    return zeropp_groups_left()


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
