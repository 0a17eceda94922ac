"""estimate() and check_fit(): one candidate's memory, component by component, and whether it fits."""

from __future__ import annotations

from dataclasses import replace

from autotune.core.ladder import Candidate
from autotune.core.units import format_bytes
from autotune.core.versions import version_tuple
from autotune.estimate.activations import activation_breakdown
from autotune.estimate.buffers import (
    deepspeed_buffers,
    lazy_gradient_bytes,
    reserve_left_after_reuse,
    tied_gradient_bytes,
    unpartitioned_model_bytes,
)
from autotune.estimate.constants import CPU_PROCESS_BASELINE_BYTES
from autotune.estimate.estimate_types import Calibration, EstimateSettings, MemoryEstimate, Verdict
from autotune.estimate.knobs import ZeroKnobs, as_deepspeed_runs
from autotune.estimate.margin import gpu_margins
from autotune.estimate.mode_terms import mode_memory
from autotune.estimate.model_states import model_states
from autotune.estimate.pinned import mlocked_bytes, pins_through_cuda
from autotune.estimate.runtime import (
    Overhead,
    allocator_reserve_fraction,
    cuda_context,
    nccl_buffers,
    nvls_buffers,
    unpressured_reserve_fraction,
)
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.modes.applies import ratio_sub_group_size

# Components that grow with the micro-batch; Calibration.activation_scale (per checkpointing) multiplies them.
VARIABLE_COMPONENTS = ("activations", "logits", "backward_window")


def runtime_overheads(target: Target, settings: EstimateSettings) -> dict[str, Overhead]:
    """CUDA context and NCCL communicators for the stack the settings describe (see estimate/runtime.py)."""
    return {
        "cuda_context": cuda_context(settings.stack),
        "nccl_buffers": nccl_buffers(target.world_size, settings.stack),
        "nccl_nvls_buffers": nvls_buffers(target.gpus_per_node, settings.stack),
    }


def _activation_components(model: ModelSummary, candidate: Candidate, settings: EstimateSettings) -> dict[str, int]:
    breakdown = activation_breakdown(model, settings, candidate.grad_checkpointing)
    mb = candidate.micro_batch
    return {
        "activations": breakdown.saved(mb),
        "logits": breakdown.logits(mb),
        "backward_window": breakdown.layer_window_excess(mb),
    }


def _scaled(components: dict[str, int], calibration: Calibration | None, grad_checkpointing: bool) -> dict[str, int]:
    if calibration is None:
        return components
    scale = calibration.activation_scale(grad_checkpointing)
    return {name: round(value * scale) for name, value in components.items()}


def phase_overlap(backward: int, step_only: int, step_temporary: int, tied_gradients: int) -> int:
    """Correction for peaks that never coexist, added to the sum of all components.

    Activations live during backward; DeepSpeed's fp32 gradient copy (counted in its model-state figure)
    and the optimizer step's temporaries exist only in the step, and a tied embedding's extra gradients
    only at the very end of backward, both after the activations are freed. The true peak is the largest
    of those moments: negative when the activations dominate, positive when the step does.
    """
    return max(backward, step_only + step_temporary, tied_gradients) - backward - step_only


def _effective_knobs(model: ModelSummary, target: Target, candidate: Candidate, knobs: ZeroKnobs) -> ZeroKnobs:
    """The sub_group_size DeepSpeed runs: with an offload ratio below 1 autotune's configs write their own
    (dsconfig, modes.ratio_sub_group_size); a user's config keeps what it says."""
    if candidate.mode.offload_ratio >= 1.0 or knobs.sub_group_size_as_written:
        return knobs
    return replace(knobs, sub_group_size=ratio_sub_group_size(model.trainable_params, target.world_size))


def estimate(
    model: ModelSummary,
    target: Target,
    candidate: Candidate,
    settings: EstimateSettings,
    calibration: Calibration | None = None,
) -> MemoryEstimate:
    """Per-GPU peak, host RAM per node and NVMe per node for one candidate.

    settings.device == "cpu" predicts the CPU backend instead: one rank's peak RSS, where the offloaded
    states and pinned buffers live in the same process as everything else.
    """
    deepspeed_version = version_tuple(settings.stack.deepspeed_version)
    settings = replace(settings, knobs=as_deepspeed_runs(settings.knobs, candidate.rung.stage, deepspeed_version))
    states = model_states(
        model,
        target,
        candidate.rung,
        settings.precision,
        knobs=_effective_knobs(model, target, candidate, settings.knobs),
        optimizer=settings.optimizer,
        pinned_rounding=pins_through_cuda(settings),
    )
    buffers = deepspeed_buffers(
        model, target, candidate.rung, settings, grad_checkpointing=candidate.grad_checkpointing
    )
    # a modern memory mode's own terms on top of the classic rung (estimate/mode_terms.py)
    modes = mode_memory(
        model,
        target,
        candidate,
        settings.precision,
        knobs=settings.knobs,
        bucket_elements=settings.reduce_bucket_elements,
    )
    device = {**states.device_components, **buffers.device_components, **modes.device_components}
    raw_activations = _activation_components(model, candidate, settings)
    activations = _scaled(raw_activations, calibration, candidate.grad_checkpointing)
    device.update(activations)
    backward = sum(activations.values())
    lazy, made_first = lazy_gradient_bytes(model, candidate.rung, settings)
    # gradients made during backward (counted resident in the states): the backward moment holds the
    # activations plus the first gradient, or all gradients at its end, whichever is more
    backward_beyond_gradients = max(backward + made_first, lazy) - lazy
    step_temporary = states.step_temporary_bytes + modes.step_temporary_bytes
    # the end of backward holds a tied embedding's gradients, or after them the offload path's temporaries of
    # the same gradient (estimate/buffers.py largest_gradient_made_last)
    end_of_backward = max(tied_gradient_bytes(model, settings), buffers.end_of_backward_bytes)
    overlap = phase_overlap(backward_beyond_gradients, states.step_only_bytes, step_temporary, end_of_backward)
    device["phase_overlap"] = overlap + backward_beyond_gradients - backward
    end_of_backward_margin = (
        phase_overlap(
            backward_beyond_gradients,
            states.step_only_bytes,
            step_temporary,
            max(end_of_backward, buffers.end_of_backward_bytes + buffers.end_of_backward_uncertainty),
        )
        - overlap
    )
    per_rank_host = {
        "offloaded_states": states.host_bytes - states.host_pageable_bytes,
        "offloaded_optimizer_moments": states.host_pageable_bytes,
        **buffers.host_components,
        **modes.host_components,
    }
    margins: dict[str, int] = {}
    cache_excess = 0
    if settings.device == "cpu":
        device.update(per_rank_host)
        device["process_baseline"] = CPU_PROCESS_BASELINE_BYTES
    else:
        if "unpartitioned_model_reserve" in device:  # later tensors reuse the cached blocks (buffers.py)
            device["unpartitioned_model_reserve"] = reserve_left_after_reuse(
                device["unpartitioned_model_reserve"], device, model, candidate.micro_batch, settings=settings
            )
        # from the uncalibrated allocations, so that calibration stays a linear fit (see calibration.py)
        uncalibrated = sum(device.values()) - sum(activations.values()) + sum(raw_activations.values())
        allocated = sum(device.values())
        device["allocator_slack"] = round(allocator_reserve_fraction() * uncalibrated)
        cache_excess = round((unpressured_reserve_fraction() - allocator_reserve_fraction()) * uncalibrated)
        runtime = runtime_overheads(target, settings)
        device.update({name: overhead.central for name, overhead in runtime.items()})
        unknown_init = 0
        if candidate.rung.stage == 3 and settings.knobs.zero_init is None:
            whole = unpartitioned_model_bytes(model, settings)
            unknown_init = reserve_left_after_reuse(whole, device, model, candidate.micro_batch, settings=settings)
        margins = gpu_margins(
            device,
            model,
            runtime,
            allocated,
            calibration=calibration,
            unknown_zero_init_bytes=unknown_init,
            grad_checkpointing=candidate.grad_checkpointing,
        )
        margins.update({name: value for name, value in buffers.device_uncertainty.items() if value > 0})
        if end_of_backward_margin > 0:
            margins["offload_gradient_check_version"] = end_of_backward_margin
    if calibration is not None and calibration.overhead_bytes:
        device["calibration_offset"] = calibration.overhead_bytes
    device = {name: value for name, value in device.items() if value}
    peak = max(0, sum(device.values()))
    ranks = target.gpus_per_node
    if settings.device == "cpu":
        host = {"ranks": ranks * peak}
    else:
        host = {"processes": ranks * CPU_PROCESS_BASELINE_BYTES}
        host.update({name: ranks * value for name, value in per_rank_host.items() if value})
    nvme = {"offloaded_states": ranks * states.nvme_bytes} if states.nvme_bytes else {}
    return MemoryEstimate(
        candidate=candidate,
        gpu_peak_bytes=peak,
        host_ram_bytes=sum(host.values()),
        nvme_bytes=sum(nvme.values()),
        gpu_components=device,
        host_components=host,
        device=settings.device,
        deepspeed_estimate_bytes=states.deepspeed_device_bytes,
        nvme_components=nvme,
        gpu_uncertainty=margins,
        gpu_unpressured_extra_bytes=cache_excess,
        mlocked_bytes_per_rank=mlocked_bytes(per_rank_host, settings.knobs.pin_memory, settings.native_pinning),
    )


def memlock_problem(estimate: MemoryEstimate, target: Target) -> str | None:
    """Why a candidate cannot run under this machine's `ulimit -l`, or None. A hard limit, not a prediction with
    a spread: DeepSpeed aborts the rank when mlock fails (estimate/pinned.py), so no trial is spent on it."""
    if target.memlock_bytes is None or estimate.mlocked_bytes_per_rank <= target.memlock_bytes:
        return None
    what = "NVMe swap buffers" if estimate.candidate.rung.needs_nvme else "pin_memory, DS_PIN_MEMORY_BACKEND=native"
    return (
        f"locks {format_bytes(estimate.mlocked_bytes_per_rank)} per rank with mlock ({what}) > ulimit -l"
        f" {format_bytes(target.memlock_bytes)} (RLIMIT_MEMLOCK, no CAP_IPC_LOCK): DeepSpeed would abort;"
        " raise `ulimit -l` or unset DS_PIN_MEMORY_BACKEND=native"
    )


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def check_fit(estimate: MemoryEstimate, target: Target, headroom: float = 0.9) -> Verdict:
    """Fits when every known limit holds; the reason names each limit broken, the shortfall the worst.

    On a GPU the peak must fit with its margin (estimate.gpu_uncertainty): a plan-only "fits" has to hold
    when every component comes out at the top of its known spread.
    """
    problems: list[tuple[str, int, str]] = []
    limit = int(headroom * target.free_memory_bytes)
    needed = estimate.gpu_peak_bytes + estimate.gpu_margin_bytes
    if needed > limit:
        what = "per-rank RSS" if estimate.device == "cpu" else "GPU peak"
        budget = "budget" if estimate.device == "cpu" else "free"
        margin = f" + {format_bytes(estimate.gpu_margin_bytes)} margin" if estimate.gpu_margin_bytes else ""
        problems.append(
            (
                f"{what} {format_bytes(estimate.gpu_peak_bytes)}{margin} > {format_bytes(limit)}"
                f" ({_percent(headroom)} of {format_bytes(target.free_memory_bytes)} {budget})",
                needed - limit,
                "gpu",
            )
        )
    if target.host_ram_bytes is not None and estimate.host_ram_bytes > target.host_ram_bytes:
        problems.append(
            (
                f"host RAM {format_bytes(estimate.host_ram_bytes)} > {format_bytes(target.host_ram_bytes)} available",
                estimate.host_ram_bytes - target.host_ram_bytes,
                "host",
            )
        )
    if locked := memlock_problem(estimate, target):
        problems.append((locked, estimate.mlocked_bytes_per_rank - (target.memlock_bytes or 0), "memlock"))
    if estimate.candidate.rung.needs_nvme:
        if target.nvme_free_bytes is None:
            problems.append(
                (
                    f"needs {format_bytes(estimate.nvme_bytes)} on NVMe but no NVMe path is known (pass --nvme-path)",
                    estimate.nvme_bytes,
                    "nvme_unknown",
                )
            )
        elif estimate.nvme_bytes > target.nvme_free_bytes:
            problems.append(
                (
                    f"NVMe {format_bytes(estimate.nvme_bytes)} > {format_bytes(target.nvme_free_bytes)} free",
                    estimate.nvme_bytes - target.nvme_free_bytes,
                    "nvme",
                )
            )
    if not problems:
        return Verdict(fits=True, reason="", shortfall_bytes=0)
    measured = [problem for problem in problems if problem[2] != "nvme_unknown"]  # a real overrun names the limit
    worst = max(measured or problems, key=lambda problem: problem[1])
    return Verdict(
        fits=False,
        reason="; ".join(text for text, _, _ in problems),
        shortfall_bytes=worst[1],
        limit=worst[2],
    )
