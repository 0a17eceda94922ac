"""DeepSpeed's working buffers, sized from the config autotune.dsconfig.build_config emits.

Buckets are element counts (bytes = elements x the element size of what they hold), read per stage from deepspeed
0.19.8: reduce and prefetch buffers, the parameters ZeRO-3 keeps gathered (stage3_retention.py), NVMe swap buffers,
and the gradient transients around DeepSpeed's copies.

Reasoning and sources: estimate/README.md#buffers
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.ladder import Rung
from autotune.core.versions import version_tuple
from autotune.dsconfig.build_config import stage3_buckets
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.pinned import pinned_bytes, pins_through_cuda
from autotune.estimate.runtime import RuntimeStack
from autotune.estimate.stage3_retention import gathered_at_turn, weight_matrices
from autotune.hardware.specs import Target
from autotune.models import ModelSummary

ALLREDUCE_BUCKET_ELEMENTS = 500_000_000  # engine default, stage 0
OPTIMIZER_SWAP_BUFFERS = 4
SUB_GROUP_SIZE = 1_000_000_000
PARAM_SWAP_BUFFERS = 5
PARAM_SWAP_BUFFER_ELEMENTS = 100_000_000
# Parameters under the persistence threshold (10 * hidden) are norm weights and bias vectors; a GPT-2
# layer has the most of them: 2 LayerNorms (4h) + qkv, proj, fc, fc-proj biases (3h + h + 4h + h) = 13h.
PERSISTENT_ELEMENTS_PER_LAYER_PER_HIDDEN = 13


@dataclass(frozen=True)
class Buffers:
    device_components: dict[str, int] = field(default_factory=dict)  # per rank
    host_components: dict[str, int] = field(default_factory=dict)  # pinned, per rank
    # How far a device component may exceed its central figure because the stack leaves it open (bytes)
    device_uncertainty: dict[str, int] = field(default_factory=dict)
    # A temporary that exists only at the end of backward, when the activations are gone (with its version
    # uncertainty): it competes with them for the peak instead of adding to it (core.phase_overlap)
    end_of_backward_bytes: int = 0
    end_of_backward_uncertainty: int = 0

    @property
    def device_bytes(self) -> int:
        return sum(self.device_components.values())

    @property
    def host_bytes(self) -> int:
        return sum(self.host_components.values())


def _element_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _reduce_buffer_bytes(elements: int, count: int, model: ModelSummary, settings: EstimateSettings) -> int:
    """`count` buffers of `elements`; on the CPU backend only the pages gradients are written into count."""
    total = count * elements
    if settings.device == "cpu":
        total = min(total, model.trainable_params)  # buffers are refilled in turn; untouched pages cost nothing
    return total * _element_bytes(settings.precision)


def _overlap_comm(settings: EstimateSettings) -> bool:
    return True if settings.knobs.overlap_comm is None else settings.knobs.overlap_comm  # dsconfig emits True


def _stage12(model: ModelSummary, settings: EstimateSettings) -> dict[str, int]:
    knobs = settings.knobs
    if not knobs.contiguous_gradients:
        return {}
    elements = knobs.reduce_bucket_size or settings.reduce_bucket_elements
    count = 2 if _overlap_comm(settings) else 1
    return {"reduce_buckets": _reduce_buffer_bytes(elements, count, model, settings)}


def gathers_alias_partitions(target: Target, rung: Rung, settings: EstimateSettings) -> bool:
    """Stage 3 on one rank with the partition on the compute device: gathered parameters are the partitions."""
    return target.world_size == 1 and (rung.offload_param is None or settings.device == "cpu")


def _stage3(
    model: ModelSummary, target: Target, rung: Rung, settings: EstimateSettings, grad_checkpointing: bool
) -> dict[str, int]:
    knobs = settings.knobs
    sizes = stage3_buckets(model.hidden_size)
    element = _element_bytes(settings.precision)
    written = knobs.stage3_prefetch_bucket_size  # 0 is a user's "no prefetching", not "unset"
    prefetch = sizes["stage3_prefetch_bucket_size"] if written is None else written
    reduce = knobs.reduce_bucket_size or sizes["reduce_bucket_size"]
    persistent = PERSISTENT_ELEMENTS_PER_LAYER_PER_HIDDEN * model.hidden_size * model.total_layers
    live, prefetch = gathered_at_turn(
        model, knobs.stage3_max_reuse_distance, grad_checkpointing, prefetch, max_live=knobs.stage3_max_live_parameters
    )
    components = {
        "reduce_buckets": _reduce_buffer_bytes(reduce, 1, model, settings) if knobs.contiguous_gradients else 0,
    }
    if not gathers_alias_partitions(target, rung, settings):  # else they are the rank's own partitions
        gathered = {"persistent_params": persistent, "live_params": live, "prefetched_params": prefetch}
        components.update({name: count * element for name, count in gathered.items() if count > 0})
    if knobs.zero_init is False:
        components["unpartitioned_model_reserve"] = unpartitioned_model_bytes(model, settings)
    return components


def unpartitioned_model_bytes(model: ModelSummary, settings: EstimateSettings) -> int:
    """Stage 3 without zero.Init: the whole cast model reaches the GPU before it is partitioned (engine.py:2093)."""
    return model.total_params * _element_bytes(settings.precision)


# The whole model's freed blocks stay in PyTorch's cache (that is what the reserve counts), and the caching
# allocator serves later requests from cached blocks before it asks CUDA for more: a request over 1 MiB takes the
# smallest cached large-pool block that holds it and splits off the rest (c10/cuda/CUDACachingAllocator.cpp
# `get_free_block`, `should_split`; every cached block qualifies under the default max_split_size, SIZE_MAX unless
# PYTORCH_CUDA_ALLOC_CONF sets one: CUDAAllocatorConfig.cpp `parseArgs`). The blocks are
# the size of the model's parameters, so the tensors of training that are one parameter's size or smaller land in
# them and take no new memory: gathered parameters and their weight gradients (the same shapes), and activations
# and logits when one of their tensors fits in the largest parameter's block. The flat partitions and step buffers
# are larger than any parameter and need segments of their own.
PARAMETER_SIZED_COMPONENTS = ("persistent_params", "live_params", "prefetched_params", "weight_grad_transient")
ACTIVATION_SIZED_COMPONENTS = ("activations", "backward_window")


def reserve_left_after_reuse(
    reserve: int, components: dict[str, int], model: ModelSummary, micro_batch: int, settings: EstimateSettings
) -> int:
    """What of the cached whole-model reserve the backward moment does not reuse (its reserved memory is then the
    reserve or what reuses it, whichever is larger)."""
    largest_block = model.largest_layer_params  # elements of the largest parameter-owning module
    tokens = micro_batch * max(settings.seq_len, settings.decoder_seq_len or 0)
    reusing = [*PARAMETER_SIZED_COMPONENTS]
    if tokens * max(model.hidden_size, model.intermediate_size) <= largest_block:
        reusing += ACTIVATION_SIZED_COMPONENTS
    # the logits' widest copy is the loss's fp32 one: they reuse the blocks only when that fits
    if tokens * model.vocab_size * _element_bytes("fp32") <= largest_block * _element_bytes(settings.precision):
        reusing.append("logits")
    return max(0, reserve - sum(components.get(name, 0) for name in reusing))


def _largest_gradient(model: ModelSummary) -> int:
    """Elements of the largest weight gradient. A frozen base (LoRA) has none of its own: every gradient
    belongs to a trainable parameter, so none is larger than all of them together (measured with peft LoRA
    on gpt2, benchmarks/optimizer_lora_memory.py)."""
    return min(model.largest_layer_params, model.trainable_params)


# Stages 1-2 with an offloaded optimizer: at the accumulation boundary copy_grads_in_partition takes each
# gradient of the rank's partition, on the reduction stream, through three steps one after the other
# (deepspeed 0.14.0-0.19.8 runtime/zero/stage_1_and_2.py copy_grads_in_partition: set_norm_for_param_grad_in_gpu,
# update_offload_overflow_tracker_for_param_grad, async_inplace_copy_grad_to_fp32_buffer_from_gpu; 0.19.8:
# lines 2161-2171), each freeing its temporaries before the next:
# - the norm of the partition's slice in fp64: `.double().norm(2)` (0.17.5 line 1352), from 0.19.6
#   `.to(get_norm_dtype())`, fp64 wherever the accelerator has it (0.19.8 runtime/zero/utils.py:59-63): 8 B per element;
# - the overflow check of the whole gradient, `_has_inf_or_nan`: up to 0.19.5 `x.float()`, `isnan`, `isinf`, their
#   `logical_or` and its `.float()` are alive together (0.17.5 lines 2154-2159, same in 0.14.0 and 0.19.5):
#   4 + 1 + 1 + 1 + 4 = 11 B per element; from 0.19.6 an amax/amin of two scalars (0.19.8 runtime/utils.py:205-228);
# - the fp32 copy for the host partition (`src_tensor.float()`, 0.19.8 line 1899-1900): 4 B per element.
# Read in the sdists of 0.14.0, 0.16.0, 0.17.5, 0.18.0, 0.18.9, 0.19.0, 0.19.4, 0.19.5 and 0.19.6 (pip download).
OFFLOAD_NORM_BYTES_PER_ELEMENT = 8
OFFLOAD_ELEMENTWISE_CHECK_BYTES_PER_ELEMENT = 11
OFFLOAD_FP32_COPY_BYTES_PER_ELEMENT = 4
# The elementwise check replaced `float(x.float().sum())` (4 B per element) in 0.13.3 (0.13.2 has the sum, 0.3.13
# runtime/zero/stage2.py:1589 too) and gave way to the reduction in 0.19.6: [first version, first version without).
ELEMENTWISE_OVERFLOW_CHECK_VERSIONS = ((0, 13, 3), (0, 19, 6))


def offload_gradient_check_bytes(largest_gradient: int, stack: RuntimeStack) -> tuple[int, int]:
    """(central, uncertainty) bytes of the largest temporary the offload path makes of one gradient.

    The DeepSpeed version decides it: 11 B per element from 0.13.3 to 0.19.5, 8 B (the fp64 norm) before and
    after. An unknown version takes the 8 B and keeps the 3 B more as margin (an unknown stack widens the margin).
    """
    outside = largest_gradient * max(OFFLOAD_NORM_BYTES_PER_ELEMENT, OFFLOAD_FP32_COPY_BYTES_PER_ELEMENT)
    elementwise = largest_gradient * max(OFFLOAD_ELEMENTWISE_CHECK_BYTES_PER_ELEMENT, OFFLOAD_NORM_BYTES_PER_ELEMENT)
    version = version_tuple(stack.deepspeed_version)
    if version is None:
        return outside, elementwise - outside
    first, fixed = ELEMENTWISE_OVERFLOW_CHECK_VERSIONS
    return (elementwise if first <= version < fixed else outside), 0


def largest_gradient_made_last(model: ModelSummary) -> bool:
    """A trainable tied embedding is the largest weight and its gradient is complete only after the embedding's
    backward (autograd sums both uses before AccumulateGrad runs once): DeepSpeed takes it in the last bucket,
    reduced in the backward epilogue (independent_gradient_partition_epilogue), when the activations are gone."""
    return tied_gradient_bytes(model, EstimateSettings(seq_len=1)) > 0 and (
        model.largest_layer_params <= model.embedding_params
    )


@dataclass(frozen=True)
class WeightGradTransient:
    """The largest weight's gradient before DeepSpeed has taken it into its buffers (start of backward:
    `during_backward`), and with an offloaded optimizer at stages 1-2 the temporaries DeepSpeed then makes of it
    on its way to the host (`offload_check`, with `offload_check_uncertainty` for an unknown DeepSpeed version).
    The autograd gradient term also bounds the gradient whose arrival set a full bucket going
    (reduce_independent_p_g_buckets_and_remove_grads reduces the full bucket before taking it)."""

    during_backward: int
    offload_check: int = 0
    offload_check_uncertainty: int = 0


def _weight_grad_transient(model: ModelSummary, rung: Rung, settings: EstimateSettings) -> WeightGradTransient:
    largest = _largest_gradient(model)
    transient = largest * _element_bytes(settings.precision) if rung.stage < 3 else 0
    if rung.offload_optimizer and rung.stage < 3:
        check, uncertainty = offload_gradient_check_bytes(largest, settings.stack)
        return WeightGradTransient(transient, check, uncertainty)
    if rung.offload_optimizer:
        transient += largest * OFFLOAD_FP32_COPY_BYTES_PER_ELEMENT  # the fp32 copy on its way to the partition
    return WeightGradTransient(transient)


# Elements per chunk of the gradient-norm loop (`_constant_buffered_norm2(input, buffer_size=250000000)`): each chunk is
# converted to fp64 on the device, deepspeed 0.10.0 / 0.15.3 stage3.py `.double()`, 0.19.8 stage3.py:1960-1967
# `get_norm_dtype()` (fp64 wherever the accelerator has it, runtime/zero/utils.py:59-63).
NORM_CHUNK_ELEMENTS = 250_000_000
NORM_BYTES = 8


def stage3_offload_grad_transient(model: ModelSummary, target: Target, settings: EstimateSettings) -> int:
    """Stage 3 with an offloaded optimizer: what the largest gradient's partition costs on the GPU on its way out.

    Stage 3 reduce-scatters before it offloads, so only the rank's partition (largest / world) is converted,
    never the whole gradient (which DeepSpeed's stage-3 figure already holds as 2 of its 4 B x largest layer).
    `partition_grads` (deepspeed 0.15.3 stage3.py:1467-1503; 0.10.0 the same; 0.19.8 stage3.py:2019-2046 and
    1443-1456) copies the reduced partition into the pinned host buffer (`grad_partitions_flat_buffer` lives on
    the host with an offloaded optimizer, stage3.py:254 / 0.19.8:333) and then back to the device
    (`grad_buffer.to(grad_partition.device)`): one 16-bit partition. At the accumulation boundary the norm of that
    partition is taken chunk by chunk in fp64 (NORM_CHUNK_ELEMENTS), freed before 0.19.8's
    `grad_buffer.to(dtype=fp32)` (4 B per element, on the device); 0.15.3 and 0.10.0 copy the 16-bit partition into
    the fp32 host tensor with `copy_`, which converts on the CPU for a blocking device-to-host copy (PyTorch
    aten/src/ATen/native/cuda/Copy.cu, copy_kernel_cuda: "type conversions are performed on the CPU").
    """
    partition = -(-_largest_gradient(model) // max(1, target.world_size))
    staged = partition * _element_bytes(settings.precision)
    return staged + max(NORM_BYTES * min(partition, NORM_CHUNK_ELEMENTS), 4 * partition)


def tied_gradient_bytes(model: ModelSummary, settings: EstimateSettings) -> int:
    """End of backward, activations gone: a tied embedding's two gradients and their sum, beyond one copy.
    None when the embedding cannot be trainable (fewer trainable parameters than it has: a LoRA base)."""
    if not model.tied_embeddings or model.trainable_params < model.embedding_params:
        return 0
    return 2 * model.largest_layer_params * _element_bytes(settings.precision)


def lazy_gradient_bytes(model: ModelSummary, rung: Rung, settings: EstimateSettings) -> tuple[int, int]:
    """(gradient bytes that do not exist when backward starts, those of them made first), per rank.

    Plain fp32 without ZeRO: after each step the engine sets every `param.grad = None` (deepspeed 0.19.8
    runtime/engine.py:3495-3500 `zero_grad`, called at :3529-3530 when neither bf16, fp16 nor ZeRO is on), so
    gradients are made during backward while activations are freed: they do not all coexist. The output
    layer's gradient (the largest layer of a language model) is made first, with every activation still alive.
    Measured on gpt2 fp32 at stage 0, CPU backend: peak RSS 2826 MiB at micro-batch 4 x 128 tokens and 2829 MiB
    at 1 x 32 (benchmarks/results/estimate_accuracy_cpu_fp32.json, optimizer_lora_cpu_fp32.json): the
    activations did not add to the peak, which the sum of all components (+21%) said they would.
    Other precisions and stages keep gradient buffers across steps (BF16/FP16_Optimizer, ZeRO's partitions).
    """
    if rung.stage != 0 or settings.precision != "fp32":
        return 0, 0
    elements = _element_bytes(settings.precision)
    return model.trainable_params * elements, min(model.trainable_params, model.largest_layer_params) * elements


def _host_pinned(model: ModelSummary, target: Target, rung: Rung) -> dict[str, int]:
    pinned: dict[str, int] = {}
    if rung.offload_optimizer == "nvme":
        partition = model.trainable_params // target.world_size
        pinned["optimizer_swap_buffers"] = OPTIMIZER_SWAP_BUFFERS * min(SUB_GROUP_SIZE, partition) * 4
    if rung.offload_param == "nvme":
        pinned["param_swap_buffers"] = PARAM_SWAP_BUFFERS * PARAM_SWAP_BUFFER_ELEMENTS * 2
    return pinned


def _stage0(model: ModelSummary, target: Target, settings: EstimateSettings) -> dict[str, int]:
    """Without ZeRO the engine all-reduces gradients flattened in allreduce_bucket_size (5e8) chunks."""
    if target.world_size == 1:
        return {}
    return {
        "allreduce_flat_grads": min(ALLREDUCE_BUCKET_ELEMENTS, model.trainable_params)
        * _element_bytes(settings.precision)
    }


def zero_init_pinned_partitions(model: ModelSummary, target: Target, settings: EstimateSettings) -> int:
    """Host RAM per rank that zero.Init's per-parameter pinned partitions keep after the engine has started.

    With parameters offloaded to the CPU and pin_memory, zero.Init creates each parameter's partition on the host
    and pins it on its own (deepspeed 0.19.8 runtime/zero/partition_parameters.py:1836-1843). The ZeRO-3
    optimizer then copies every partition into one pinned flat buffer per group and points the parameter at it
    (stage3.py:856-886 `_move_to_flat_buffer`, `src.data = dest.data` at 883; the buffer pinned at 888-910, both
    called at 977-1003): the per-parameter tensors are freed.
    Freed pinned memory is not given back: torch's CachingHostAllocator puts the block on its free list, still
    page-locked (torch 2.13 ATen/core/CachingHostAllocator.h:734-749 `maybe_cache_block`; no size limit by
    default, c10/core/AllocatorConfig.h:363), until a host `empty_cache`, which DeepSpeed never calls (its
    `empty_cache` is the device's), and reuses a block only for a request of the same power-of-two size
    (allocate, 301-312, `get_free_block` 621-633), which DeepSpeed's later buffers (whole sub-groups, the
    gradient flat buffer) are not. So each partition's power-of-two block stays (estimate/pinned.py).
    Published host figures this accounts for (not fitted to): LLaMA-33B, 8 x A100-40GB, full offload, seq 2048 used
    "750-800G" of host RAM (deepspeedai/DeepSpeed#3448) and ran out of a 600G host; Qwen2.5-32B on one H100 with
    full offload ran out of a 744G host (hiyouga/LlamaFactory#6755): benchmarks/README.md, "Host RAM of ZeRO-3
    with parameter offload". Partitions are ceil(elements / world) of the model's dtype; norms and biases left out.
    """
    element = _element_bytes(settings.precision)
    return sum(pinned_bytes(-(-size // target.world_size) * element, True) for size in weight_matrices(model))


def deepspeed_buffers(
    model: ModelSummary, target: Target, rung: Rung, settings: EstimateSettings, grad_checkpointing: bool = False
) -> Buffers:
    if rung.stage == 0:
        components = _stage0(model, target, settings)
    elif rung.stage in (1, 2):
        components = _stage12(model, settings)
    else:
        components = _stage3(model, target, rung, settings, grad_checkpointing=grad_checkpointing)
    transient = _weight_grad_transient(model, rung, settings)
    uncertainty: dict[str, int] = {}
    end_of_backward = end_of_backward_uncertainty = 0
    if transient.offload_check and largest_gradient_made_last(model):
        components["weight_grad_transient"] = transient.during_backward
        end_of_backward, end_of_backward_uncertainty = transient.offload_check, transient.offload_check_uncertainty
    else:  # made while activations live (an untied output layer's gradient comes first): on top of them
        components["weight_grad_transient"] = transient.during_backward + transient.offload_check
        if transient.offload_check_uncertainty:
            uncertainty["offload_gradient_check_version"] = transient.offload_check_uncertainty
    if rung.stage == 3 and rung.offload_optimizer and settings.device != "cpu":
        # on the CPU backend the partition's copy "to the device" is the host buffer itself: unchanged there
        components["weight_grad_transient"] = stage3_offload_grad_transient(model, target, settings)
    host = _host_pinned(model, target, rung)
    if rung.offload_param == "cpu" and settings.knobs.zero_init is not False and pins_through_cuda(settings):
        host["zero_init_pinned_partitions"] = zero_init_pinned_partitions(model, target, settings)
    if rung.stage in (1, 2) and rung.offload_optimizer:
        # Stages 1-2 with optimizer offload allocate, at init and for the whole run, one 16-bit buffer of the
        # largest parameter's size on the device (temp_grad_buffer_for_gpu_offload) and one on the host, pinned
        # with pin_memory (temp_grad_buffer_for_cpu_offload): deepspeed 0.19.8 runtime/zero/stage_1_and_2.py:653-661.
        # Found by reading DeepSpeed's code around the held-out false fit (deepseek-math-7b, published set).
        staging = _largest_gradient(model) * _element_bytes(settings.precision)
        components["offload_grad_staging"] = staging
        host["offload_grad_staging"] = pinned_bytes(staging, pins_through_cuda(settings))
    return Buffers(
        device_components=components,
        host_components=host,
        device_uncertainty=uncertainty,
        end_of_backward_bytes=end_of_backward,
        end_of_backward_uncertainty=end_of_backward_uncertainty,
    )
