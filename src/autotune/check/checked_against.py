"""What a config is checked against: the world size, and the GPU when one is known."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.errors import UserError
from autotune.hardware.specs import Target
from autotune.hardware.target import check_counts, resolve_target


@dataclass(frozen=True)
class CheckContext:
    world_size: int
    world_size_source: str  # shown to the user: where the world size came from
    bf16_capable: bool | None = None  # None when the GPU is unknown
    target: Target | None = None  # for the fit prediction; None when no GPU is known
    for_hf_trainer: bool = False  # "auto" is expected: the HF Trainer fills it (same as consumer="hf-trainer")
    hardware_note: str = ""  # why no GPU is known, when none is
    consumer: str | None = None  # "deepspeed" | "hf-trainer" | "accelerate"; None: detect from the config


def resolve_context(
    gpus: int | None,
    nodes: int,
    gpu_type: str | None,
    gpu_memory: str | None,
    for_hf_trainer: bool = False,
    consumer: str | None = None,
) -> CheckContext:
    """--gpu-type / --gpu-memory plan for elsewhere; otherwise probe this machine.

    A machine without GPUs still gets a world size (--gpus, else 1 per node): the config checks need
    it, only the bf16 and fit checks need a GPU.
    """
    check_counts(gpus, nodes)
    probed = None
    if not (gpu_type or gpu_memory):
        from autotune.hardware.machine_probe import probe

        probed = probe()
    target: Target | None = None
    hardware_note = ""
    try:
        target = resolve_target(probed, gpus, nodes, gpu_type, gpu_memory=gpu_memory)
    except UserError as error:
        if gpu_type or gpu_memory:
            raise  # a bad --gpu-type is the user's to fix
        hardware_note = str(error)
    if gpus is not None:
        world_size, source = gpus * nodes, f"--gpus {gpus} x --nodes {nodes}"
    elif target is not None and target.measured:
        world_size, source = target.world_size, f"{target.gpus_per_node} probed GPU(s) x --nodes {nodes}"
    else:
        world_size, source = nodes, f"1 GPU per node (no --gpus) x --nodes {nodes}"
    known_gpu = target if target is not None and target.gpu.key != "custom" else None  # --gpu-memory: no bf16 word
    return CheckContext(
        world_size=world_size,
        world_size_source=source,
        bf16_capable=known_gpu.gpu.bf16 if known_gpu is not None else None,
        target=target,
        for_hf_trainer=for_hf_trainer,
        hardware_note=hardware_note,
        consumer=consumer,
    )
