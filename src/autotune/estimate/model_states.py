"""Model states (parameters, gradients, optimizer states) per rank, from DeepSpeed's own estimators.

DeepSpeed's `estimate_zero2/3_model_states_mem_needs` give the device figure for stages 2 and 3 and the host figure
for CPU offload; we call them and add what they lack, each addition named: stage 0 and ZeRO-1, frozen parameters,
fp32 training, optimizers other than Adam, and the offloaded host side counted from DeepSpeed's own allocations.

Reasoning and sources: estimate/README.md#model_states
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.ladder import Rung
from autotune.estimate.ds_estimators import DeepSpeedEstimators, deepspeed_estimators
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.pinned import pinned_bytes
from autotune.hardware.specs import Target
from autotune.models import ModelSummary
from autotune.training.optimizers import optimizer_memory

BYTES_16BIT = 2
BYTES_FP32 = 4
# Host bytes per trainable parameter of the rank's partition with the optimizer offloaded at stages 1-2, read in
# deepspeed 0.19.8 runtime/zero/stage_1_and_2.py: the fp32 master partition (560-565, pinned with pin_memory),
# a buffer of the 16-bit group's dtype for copying the updated weights back (566-575, pinned; fp32 when training
# in fp32), the fp32 gradient partition (935-941, pinned) and Adam's two fp32 moments (pageable). Each pinned
# tensor costs the next power of two on CUDA (estimate/pinned.py). DeepSpeed's estimator says max(4 x GPUs, 16)
# per parameter for the job (stage_1_and_2.py:4027): the 4 x GPUs term is every rank holding an fp32 copy of the
# model while loading it, before the optimizer exists. autotune's trials build on the meta device; a user's
# loader that materialises the model on every rank's CPU adds that transient on top.
OFFLOAD_MASTER_BYTES_PER_PARAM = 4
OFFLOAD_GRADIENT_BYTES_PER_PARAM = 4
OFFLOAD_MOMENTS_BYTES_PER_PARAM = 8


@dataclass(frozen=True, kw_only=True)
class ModelStates:
    """Per rank: on the device (GPU, or the process itself on the CPU backend), in host RAM, on NVMe."""

    device_bytes: int
    host_bytes: int
    nvme_bytes: int
    device_components: dict[str, int] = field(default_factory=dict)
    deepspeed_device_bytes: int = 0  # what DeepSpeed's estimator alone says for the device, for comparison
    step_only_bytes: int = 0  # part of device_bytes alive only in the optimizer step (fp32 gradients)
    step_temporary_bytes: int = 0  # what the optimizer step allocates on top, freed when it ends
    host_pageable_bytes: int = 0  # part of host_bytes never page-locked (the offloaded optimizer's moments)


def _zero2(ds: DeepSpeedEstimators, params: int, gpus: int, nodes: int, offload: bool) -> tuple[int, int]:
    """(host bytes for the whole job, device bytes per GPU) from DeepSpeed's stage-2 estimator."""
    return ds.zero2(params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload, additional_buffer_factor=1.0)


def _zero3(
    ds: DeepSpeedEstimators, model: ModelSummary, params: int, target: Target, offload_opt: bool, offload_param: bool
) -> tuple[int, int]:
    """(host bytes per node, device bytes per GPU) from DeepSpeed's stage-3 estimator (zero_init, as HF does)."""
    host, device, _ = ds.zero3(
        params,
        model.largest_layer_params,
        num_gpus_per_node=target.gpus_per_node,
        num_nodes=target.nodes,
        cpu_offload=offload_opt,
        cpu_offload_params=offload_param,
        zero_init=True,
        additional_buffer_factor=1.0,
    )
    return host, device


def _fp32_widening(rung: Rung, trainable: int, world: int) -> int:
    """Extra bytes per rank when the 'fp16' copies DeepSpeed counts are really fp32 (precision fp32)."""
    extra = BYTES_FP32 - BYTES_16BIT
    if rung.stage == 0:
        # plain torch AdamW: weights and grads widen, and the fp32 master + fp32 grad copies do not exist
        return extra * 2 * trainable - (BYTES_FP32 + BYTES_FP32) * trainable
    if rung.stage == 1:
        return extra * trainable + extra * trainable  # full weights and full grads
    if rung.stage == 2:
        return extra * trainable + extra * trainable // world  # full weights, partitioned grads
    return 2 * extra * trainable // world  # stage 3: both partitioned


def _step_phase(rung: Rung, trainable: int, world: int, precision: str, knobs: ZeroKnobs) -> tuple[int, int]:
    """(fp32 gradient bytes that exist only during the step, step temporaries) on the device, per rank.

    DeepSpeed's figure counts the fp32 gradient copy ("4_grads_32bit") as resident, but it is built in
    the optimizer step, after backward has freed the activations. Stage 0 (FP16_Optimizer) converts each
    gradient to fp32 and then flattens them, so both copies coexist: 24 B/param at the step, measured on
    gpt2 (124M) with the CPU backend (benchmarks/estimate_accuracy.py). Stages 1-2 flatten the 16-bit
    partition before converting it (stage_1_and_2.py, step). Stage 3 steps one sub-group at a time: the fp32
    gradient is made per sub-group and dropped after it (stage3.py:2702-2706 `_prepare_sub_group`, 2728-2733
    `_release_sub_group`), so it is bounded by sub_group_size (stage3.py:1210-1231). The optimizer's own
    temporaries (knobs.OPTIMIZER_STEP_TEMPORARY_BYTES: none for fused Adam, 4 B/element for torch's foreach
    AdamW) cover what one step call sees: the whole partition at stages 0-2, one sub-group at stage 3
    (stage3.py:1235-1262 passes one sub-group's flat fp32 tensor). Offloaded optimizers do all of this on the host.
    """
    if rung.offload_optimizer:
        return 0, 0
    temporary_per_element = knobs.step_temporary_bytes_per_element
    if precision == "fp32":
        stepped = trainable if rung.stage == 0 else trainable // world
        if rung.stage == 3:
            stepped = min(stepped, knobs.sub_group_size)
        return 0, temporary_per_element * stepped
    if rung.stage == 0:
        return BYTES_FP32 * trainable, (BYTES_FP32 + temporary_per_element) * trainable
    partition = trainable // world
    if rung.stage in (1, 2):
        return BYTES_FP32 * partition, (BYTES_16BIT + temporary_per_element) * partition
    sub_group = min(partition, knobs.sub_group_size)
    return BYTES_FP32 * sub_group, temporary_per_element * sub_group


def offloaded_stage12_host(partition: int, precision: str, rounded: bool) -> tuple[int, int]:
    """(pinned, pageable) host bytes of one rank's optimizer-offloaded partition at stages 1-2: three pinned
    tensors (fp32 master, 16-bit copy-back buffer, fp32 gradient), each its own allocation, and Adam's moments.
    `rounded`: pinned through torch's CUDA host allocator (estimate/pinned.py). One flat group per tensor, as
    DeepSpeed's own optimizer makes; HF Trainer's second (no-decay) group holds only norms and biases."""
    copy_back = BYTES_FP32 if precision == "fp32" else BYTES_16BIT
    tensors = (OFFLOAD_MASTER_BYTES_PER_PARAM, copy_back, OFFLOAD_GRADIENT_BYTES_PER_PARAM)
    pinned = sum(pinned_bytes(per_param * partition, rounded) for per_param in tensors)
    return pinned, OFFLOAD_MOMENTS_BYTES_PER_PARAM * partition


def offloaded_stage3_host(
    trainable: int, world: int, precision: str, sub_group_size: int, offload_param: bool, rounded: bool
) -> tuple[int, int]:
    """(pinned, pageable) host bytes per rank of ZeRO-3 with the optimizer offloaded to the CPU, read in
    deepspeed 0.19.8 runtime/zero/stage3.py: per sub-group an fp32 master copy (1157-1161, `.to(cpu).clone()`,
    pageable) and a pinned fp32 gradient buffer (1337-1342); Adam's moments (pageable); one flat buffer of the
    rank's gradient partitions in the gradient-accumulation dtype, the model's (790-795, pinned; engine.py:1806-1807);
    with parameters offloaded, the 16-bit partitions in one pinned flat buffer (895-910). DeepSpeed's estimator
    says 16 (18 with parameters) bytes per parameter; the gradient flat buffer is what it leaves out. Sub-groups
    hold about sub_group_size elements of the rank's share (whole parameters, _create_fp16_sub_groups).
    The per-parameter pinned partitions zero.Init makes with parameter offload (partition_parameters.py:1843),
    which torch's host allocator keeps cached after they are moved into the flat buffer, are a buffer of their
    own (buffers.zero_init_pinned_partitions)."""
    partition = -(-trainable // world)
    sub_groups = max(1, -(-partition // max(1, sub_group_size)))  # cut from the rank's share (stage3.py:1212-1226)
    chunk = -(-partition // sub_groups)
    sixteen_bit = BYTES_FP32 if precision == "fp32" else BYTES_16BIT
    pinned = sub_groups * pinned_bytes(BYTES_FP32 * chunk, rounded) + pinned_bytes(sixteen_bit * partition, rounded)
    if offload_param:
        pinned += pinned_bytes(sixteen_bit * partition, rounded)
    pageable = (BYTES_FP32 + OFFLOAD_MOMENTS_BYTES_PER_PARAM) * partition
    return pinned, pageable


def model_states(
    model: ModelSummary,
    target: Target,
    rung: Rung,
    precision: str,
    estimators: DeepSpeedEstimators | None = None,
    knobs: ZeroKnobs | None = None,
    optimizer: str = "adamw",
    pinned_rounding: bool = False,
) -> ModelStates:
    """`pinned_rounding`: pinned host tensors go through torch's CUDA host allocator (a GPU run with
    pin_memory), which rounds each to a power of two (estimate/pinned.py)."""
    ds = estimators or deepspeed_estimators()
    knobs = knobs or ZeroKnobs()
    trainable = model.trainable_params
    frozen = model.total_params - trainable
    world = target.world_size
    gpus, nodes = target.gpus_per_node, target.nodes
    weight_bytes = BYTES_FP32 if precision == "fp32" else BYTES_16BIT
    components: dict[str, int] = {}
    host = nvme = pageable = 0
    if rung.stage in (0, 1, 2):
        offload = rung.offload_optimizer is not None
        replicated = rung.stage == 0  # stage 0 holds everything on every rank: ZeRO-2 at a single rank
        _job_host, device = _zero2(
            ds, trainable, 1 if replicated else gpus, 1 if replicated else nodes, offload=offload
        )
        components["model_states"] = device
        if rung.stage == 1 and knobs.zero1_keeps_full_gradient:
            components["zero1_unpartitioned_grads"] = BYTES_16BIT * trainable - BYTES_16BIT * trainable // world
        components["frozen_params"] = weight_bytes * frozen
        if offload:
            pinned, pageable = offloaded_stage12_host(-(-trainable // world), precision, pinned_rounding)
            host = pinned + pageable
    else:
        _node_host, device = _zero3(
            ds,
            model,
            trainable,
            target,
            offload_opt=rung.offload_optimizer is not None,
            offload_param=rung.offload_param is not None,
        )
        components["model_states"] = device
        frozen_share = weight_bytes * frozen // world
        if rung.offload_param is None:
            components["frozen_params"] = frozen_share
        per_rank_host = 0
        if rung.offload_optimizer == "cpu":
            pinned, pageable = offloaded_stage3_host(
                trainable,
                world,
                precision,
                knobs.sub_group_size,
                offload_param=rung.offload_param == "cpu",
                rounded=pinned_rounding,
            )
            per_rank_host = pinned + pageable
        if rung.offload_optimizer == "nvme":
            # The optimizer part of what DeepSpeed would hold in host RAM goes to NVMe: the difference
            # between its "optimizer offloaded" and "nothing offloaded" host figures.
            with_params_host, _ = _zero3(ds, model, trainable, target, offload_opt=True, offload_param=True)
            optimizer_host, _ = _zero3(ds, model, trainable, target, offload_opt=True, offload_param=False)
            params_host = (with_params_host - optimizer_host) // gpus
            nvme = optimizer_host // gpus
            per_rank_host = params_host if rung.offload_param == "cpu" else 0
            nvme += params_host if rung.offload_param == "nvme" else 0
        host = per_rank_host
        if rung.offload_param == "cpu":
            host += frozen_share
        elif rung.offload_param == "nvme":
            nvme += frozen_share
    if precision == "fp32":
        components["fp32_widening"] = _fp32_widening(rung, trainable, world)
    step_only, step_temporary = _step_phase(rung, trainable, world, precision, knobs=knobs)
    flattened = not (rung.stage == 0 and precision == "fp32")  # see optimizer_memory
    chosen = optimizer_memory(
        optimizer, trainable if rung.stage == 0 else trainable // world, flattened, model.largest_layer_params
    )
    if rung.offload_optimizer is None:
        if chosen.state_delta_bytes:
            components["optimizer_states_vs_adam"] = chosen.state_delta_bytes
        step_temporary += chosen.step_temporary_bytes
    else:  # the optimizer and its step run where its states live
        if rung.offload_optimizer == "nvme":
            nvme += chosen.state_delta_bytes
        else:
            host += chosen.state_delta_bytes
            pageable += chosen.state_delta_bytes
        host += chosen.step_temporary_bytes
        pageable += chosen.step_temporary_bytes
    return ModelStates(
        device_bytes=sum(components.values()),
        host_bytes=host,
        nvme_bytes=nvme,
        device_components=components,
        deepspeed_device_bytes=components["model_states"],
        step_only_bytes=step_only,
        step_temporary_bytes=step_temporary,
        host_pageable_bytes=pageable,
    )
