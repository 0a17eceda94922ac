"""Searches over the fake machines of tests/fakes/machines.py, built the same way by every search test:
`search_setup` (a real model's summary, a generic GPU target, bf16 settings) and `mode_search` (gpt2 on a
LinearMachine with the modern modes' options and offload ratios the test gives)."""

from __future__ import annotations

from tests.fakes.machines import GIB, LinearMachine, LinearMemory

from autotune.estimate.estimate_types import EstimateSettings
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.modes.applies import ratio_grid
from autotune.search.records import SearchLimits
from autotune.search.walk import Search


def search_setup(
    model_name: str, memory_gib: float, gpus: int, seq_len: int
) -> tuple[ModelSummary, Target, EstimateSettings]:
    model = summarize(resolve_model(model_name))
    memory = int(memory_gib * GIB)
    target = Target(generic_gpu(memory), gpus, 1, memory, host_ram_bytes=512 * GIB, measured=True)
    settings = EstimateSettings(seq_len=seq_len, precision="bf16")
    return model, target, settings


RATIOS = tuple(r for r in ratio_grid() if 0.0 < r < 1.0)


GRID = [1, 2, 4, 8]


def mode_search(
    machine: LinearMachine, memory: LinearMemory, options, rungs, max_trials: int = 30, headroom: float = 1.0
) -> Search:
    model = summarize(resolve_model("gpt2"))
    target = Target(
        generic_gpu(machine.memory_bytes),
        1,
        1,
        machine.memory_bytes,
        host_ram_bytes=512 * GIB,
        nvme_free_bytes=None,
        measured=True,
    )
    return Search(
        model,
        target,
        EstimateSettings(seq_len=128),
        machine.run,
        rungs=rungs,
        micro_batches=GRID,
        limits=SearchLimits(max_trials=max_trials, headroom=headroom),
        modes=lambda rung: options.get(rung, []),
        offload_ratios=RATIOS,
        memory=memory.model(),
    )
