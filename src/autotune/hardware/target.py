"""Decide what hardware a plan or tuning is for: probed GPUs, or a profile when planning remotely."""

from __future__ import annotations

from autotune.core.units import parse_bytes
from autotune.errors import UserError
from autotune.hardware.machine_probe import ProbeResult
from autotune.hardware.specs import GpuSpec, Target, generic_gpu, match_probed_gpu, resolve_gpu_type


def check_counts(gpus: int | None, nodes: int) -> None:
    if gpus is not None and gpus <= 0:
        raise UserError(f"--gpus must be positive (GPUs per node), got {gpus}")
    if nodes <= 0:
        raise UserError(f"--nodes must be positive, got {nodes}")


def resolve_target(
    probed: ProbeResult | None,
    gpus: int | None,
    nodes: int = 1,
    gpu_type: str | None = None,
    gpu_memory: str | None = None,
) -> Target:
    """Profile flags win (planning for elsewhere); otherwise the probed GPUs of this machine.

    A profile's free memory is its total: on a planned node nothing else is assumed to run. A probed
    target uses the smallest free memory across the visible GPUs, since every rank must fit.
    """
    check_counts(gpus, nodes)
    if gpu_type and gpu_memory:
        raise UserError("give either --gpu-type or --gpu-memory, not both")
    host_ram = probed.host.usable_ram_bytes if probed else None
    nvme = probed.host.nvme_free_bytes if probed else None
    spec: GpuSpec | None = None
    if gpu_type:
        spec = resolve_gpu_type(gpu_type)
    elif gpu_memory:
        spec = generic_gpu(parse_bytes(gpu_memory, what="--gpu-memory"))
    if spec is not None:
        return Target(
            spec, gpus or 1, nodes, spec.memory_bytes, host_ram_bytes=host_ram, nvme_free_bytes=nvme, measured=False
        )
    if probed is None or not probed.gpus:
        raise UserError(
            "no GPU visible on this machine: plan for the cluster with --gpu-type (e.g. a100-80gb)"
            " or --gpu-memory 80GiB, or tune on CPU with --device cpu"
        )
    visible = len(probed.gpus)
    if gpus is not None and gpus > visible:
        raise UserError(
            f"--gpus {gpus} but only {visible} GPU(s) are visible here; pass --gpu-type to plan for elsewhere"
        )
    used = probed.gpus[: gpus or visible]
    weakest = min(used, key=lambda g: g.free_bytes)
    profile = match_probed_gpu(weakest.name, weakest.total_bytes)
    spec = GpuSpec(
        key=profile.key if profile else "probed",
        name=weakest.name,
        memory_bytes=weakest.total_bytes,
        bf16=weakest.bf16,
        peak_bf16_tflops=profile.peak_bf16_tflops if profile else None,
        peak_fp16_tflops=profile.peak_fp16_tflops if profile else None,
        memory_bandwidth_gbs=profile.memory_bandwidth_gbs if profile else None,
        compute_capability=weakest.compute_capability,
        source="probe",
    )
    memlock = probed.host.locked.binding_bytes
    return Target(
        spec,
        len(used),
        nodes,
        weakest.free_bytes,
        host_ram_bytes=host_ram,
        nvme_free_bytes=nvme,
        measured=True,
        memlock_bytes=memlock,
    )
