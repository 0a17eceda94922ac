"""One rank's trial inside a worker process: build the model, wrap it with DeepSpeed, time optimizer steps.

Imports torch, DeepSpeed and transformers lazily: only worker processes ever load them.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.core.measurement import MIN_STEPS, enough_steps
from autotune.core.units import format_bytes
from autotune.infra.environment import select_accelerator
from autotune.trial.outcome import classify_exception
from autotune.trial.rank_report import RankReport
from autotune.trial.throughput import flops_per_token
from autotune.trial.trial_types import TrialSpec, rank_peak_bytes
from autotune.trial.worker.deepspeed_globals import release_engine_globals, release_zeropp_groups
from autotune.trial.worker.faults import maybe_inject_fault
from autotune.trial.worker.memory import MemoryTracker, empty_host_cache, release_host_memory


@dataclass(frozen=True)
class Placement:
    rank: int
    local_rank: int
    world_size: int


class PhaseClock:
    """Wall-clock seconds per phase, chained from the launcher's spawn time (so it spans processes)."""

    def __init__(self, started_at: float) -> None:
        self._last = started_at
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.phases[name] = round(now - self._last, 4)
        self._last = now


def import_runtime(device: str, architecture: str | None = None) -> None:
    """The imports that dominate a cold start, the model's own modeling module included.

    DeepSpeed picks its accelerator once, at import, from DS_ACCELERATOR.
    """
    select_accelerator(device)
    import deepspeed  # noqa: F401
    import torch  # noqa: F401
    import transformers

    if architecture:
        getattr(transformers, architecture, None)  # transformers imports modeling modules lazily


LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def init_distributed(device: str, local_rank: int) -> None:
    """DeepSpeed's init, with a trial whose master is this machine kept off the network.

    A trial that rendezvouses on loopback needs no other host, so nothing it opens should listen on
    other interfaces: gloo/NCCL bind the loopback interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, the
    variables both read), and a one-rank trial serves its TCPStore from a socket bound to 127.0.0.1
    (TCPStore binds every interface itself, torch 2.13; `master_listen_fd` hands it ours). Multi-rank
    trials started by torchrun use its agent's store, which still binds every interface.
    """
    import deepspeed
    import torch

    if device == "cuda":
        torch.cuda.set_device(local_rank)
    backend = "nccl" if device == "cuda" else "gloo"
    if os.environ.get("MASTER_ADDR") in LOOPBACK_ADDRESSES and _has_interface("lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME", "lo")
        store = _loopback_store(os.environ)
        if store is not None:
            torch.distributed.init_process_group(backend, store=store, rank=0, world_size=1)
    deepspeed.init_distributed(dist_backend=backend)


def _has_interface(name: str) -> bool:
    import socket

    return any(interface == name for _, interface in socket.if_nameindex())


def _loopback_store(env: Mapping[str, str]) -> Any | None:
    """A one-rank trial's TCPStore on 127.0.0.1:MASTER_PORT; None when torchrun's agent serves the store."""
    if env.get("WORLD_SIZE") != "1" or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or not env.get("MASTER_PORT"):
        return None
    import datetime
    import socket

    import torch.distributed as dist

    listener = socket.create_server(("127.0.0.1", int(env["MASTER_PORT"])))
    # detach: the store owns the descriptor for the life of the process (closing it under the store aborts)
    fd = listener.detach()
    return dist.TCPStore(
        "127.0.0.1", int(env["MASTER_PORT"]), 1, True, timeout=datetime.timedelta(minutes=5),
        master_listen_fd=fd, use_libuv=False,  # the libuv backend takes no listening descriptor
    )  # fmt: skip


def zero_stage(ds_config: dict) -> int:
    return int(ds_config.get("zero_optimization", {}).get("stage", 0))


def build_trial_model(spec: TrialSpec, device: Any) -> Any:
    """A randomly initialised model: built on meta, then materialised once on the device.

    Building on meta skips torch's default init, and HF's init_weights then writes every tensor once
    (to_empty leaves garbage, and tied weights must be re-tied). ZeRO-3 without zero.Init takes this path too:
    the whole model reaches the device and the engine partitions it (what the memory model's
    unpartitioned_model_reserve is about).
    """
    from autotune.models.architecture import build_model

    if zero_stage(spec.ds_config) == 3 and spec.zero_init:
        return _build_partitioned(spec, device)
    model, _ = build_model(
        spec.model_config, spec.architecture, device="meta", trust_remote_code=spec.trust_remote_code
    )
    cast_parameters(model, training_dtype(spec.ds_config))
    model.to_empty(device=device)
    model.init_weights()
    return model


def training_dtype(ds_config: dict) -> Any:
    """The dtype DeepSpeed trains the module's parameters in: bf16 or fp16 when enabled, else fp32."""
    import torch

    if ds_config.get("bf16", {}).get("enabled") is True:
        return torch.bfloat16
    if ds_config.get("fp16", {}).get("enabled") is True:
        return torch.float16
    return torch.float32


def cast_parameters(model: Any, dtype: Any) -> None:
    """Cast floating parameters (not buffers) to the training dtype while the model is still on meta.

    DeepSpeed casts the user's module to the training dtype before it moves it to the device
    (deepspeed 0.19.8 runtime/engine.py:2080-2094, `_cast_module_mixed_precision` at :1851, which
    casts parameters only and keeps fp32 buffers such as rotary inv_freq). A real run therefore
    never holds fp32 weights on the GPU at stages 0-2; materialising them in fp32 here would measure
    twice the weight memory and report false OOMs.
    """
    for parameter in model.parameters():
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)


def _build_partitioned(spec: TrialSpec, device: Any) -> Any:
    """ZeRO-3: each rank only ever holds its shard, so a model larger than one GPU can be built.

    The same contexts transformers' from_config enters under ZeRO-3 (without needing its global
    HfDeepSpeedConfig): weight init is suppressed while partitioning, then done gathered, module by module.
    """
    import deepspeed

    from autotune.models.architecture import build_model

    try:  # transformers 5: suppress init while partitioning, then initialise gathered, module by module
        from transformers.initialization import no_init_weights
        from transformers.integrations.deepspeed import initialize_weights_zero3, prevent_arange_dtype_change
    except ImportError:  # transformers 4.x's from_config: the model is built (and initialised) inside zero.Init
        with deepspeed.zero.Init(config_dict_or_path=copy.deepcopy(spec.ds_config)):
            model, _ = build_model(
                spec.model_config, spec.architecture, device=str(device), trust_remote_code=spec.trust_remote_code
            )
        return model
    with (
        no_init_weights(),
        prevent_arange_dtype_change(),
        deepspeed.zero.Init(config_dict_or_path=copy.deepcopy(spec.ds_config)),
    ):
        model, _ = build_model(
            spec.model_config, spec.architecture, device=str(device), trust_remote_code=spec.trust_remote_code
        )
    initialize_weights_zero3(model)
    model.tie_weights()
    return model


def add_lora_adapters(model: Any, lora: dict) -> Any:
    """Freeze the base and add peft LoRA adapters, as the user's peft script does (autotune.training.lora)."""
    from autotune.training.lora import LoraSettings, apply_lora

    targets = tuple(lora.get("target_modules") or ()) or None
    settings = LoraSettings(rank=int(lora["rank"]), target_modules=targets, alpha=lora.get("alpha"))
    return apply_lora(model, settings, lora["model_type"])


def enable_grad_checkpointing(model: Any) -> None:
    if getattr(model.config, "use_cache", None) is not None:
        model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def check_precision_supported(ds_config: dict) -> None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if ds_config.get("fp16", {}).get("enabled") is True and not accelerator.is_fp16_supported():
        raise ValueError(f"fp16 is not supported by DeepSpeed's {accelerator.device_name()} accelerator here")
    if ds_config.get("bf16", {}).get("enabled") is True and not accelerator.is_bf16_supported():
        raise ValueError(f"bf16 is not supported by DeepSpeed's {accelerator.device_name()} accelerator here")


def initialize_engine(model: Any, ds_config: dict, optimizer_name: str = "adamw") -> Any:
    """DeepSpeed builds the optimizer the config names; otherwise the trial builds the one the user's
    script will pass (autotune.training.optimizers.build_client_optimizer: AdamW as HF Trainer does, or Adafactor)."""
    import deepspeed

    from autotune.training.optimizers import build_client_optimizer

    config = copy.deepcopy(ds_config)  # DeepSpeed edits the dict it is given
    check_precision_supported(config)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = None if "optimizer" in config else build_client_optimizer(optimizer_name, parameters, lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=parameters, config=config)
    return engine


def count_parameters(model: Any) -> int:
    """Full count even when ZeRO-3 has already partitioned the parameters (ds_numel)."""
    return sum(getattr(p, "ds_numel", None) or p.numel() for p in model.parameters())


def layers_and_width(config: Any) -> tuple[int, int]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", 0) or 0
    if getattr(text, "is_encoder_decoder", False):
        layers += getattr(text, "num_decoder_layers", None) or getattr(text, "decoder_layers", None) or layers
    return layers, getattr(text, "hidden_size", 0) or 0


def synthetic_batch(
    model: Any,
    family: str,
    micro_batch: int,
    seq_len: int,
    device: Any,
    seed: int,
    decoder_seq_len: int | None = None,
) -> dict[str, Any]:
    """Random tokens as input and labels: causal LMs shift them, MLM heads score them.

    Encoder-decoders get their decoder inputs explicitly, as a seq2seq collator would, so a config
    without decoder_start_token_id still trains; their labels (and so the decoder, its cross-attention scores
    and the logits) are `decoder_seq_len` long, the job's target length, which the memory model prices
    separately from the encoder's (estimate/activations.py `_encoder_decoder_breakdown`).
    """
    import torch

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len), generator=generator)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if family == "encoder-decoder":
        target_len = decoder_seq_len or seq_len
        labels = torch.randint(0, config.vocab_size, (micro_batch, target_len), generator=generator)
        batch["labels"] = labels
        batch["decoder_input_ids"] = torch.roll(labels, shifts=1, dims=1)
    return {name: tensor.to(device) for name, tensor in batch.items()}


def _micro_step(engine: Any, batch: dict[str, Any], boundary: bool, measure: Any = None) -> None:
    """One forward/backward; with `boundary` the optimizer steps after it, whatever the accumulation
    (DeepSpeed's documented manual override, engine.set_gradient_accumulation_boundary). `measure` (a
    MemoryTracker.phase) takes the forward/backward's own peak, the optimizer step's left out: the part that grows
    with the micro-batch."""
    engine.set_gradient_accumulation_boundary(boundary)
    with measure if measure is not None else contextlib.nullcontext():
        loss = engine(**batch).loss
        engine.backward(loss)
    engine.step()


def _slowest_rank(seconds: float, world_size: int, device: Any) -> float:
    """Every rank must see the same times, or they would disagree on when to stop and deadlock."""
    if world_size == 1:
        return seconds
    import deepspeed.comm as dist
    import torch

    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


@dataclass(frozen=True)
class StepTimes:
    """What one launch measured: whole optimizer steps, and the parts they are made of.

    A measured step is a whole accumulation cycle, timed as one: `accumulation` micro-steps, the optimizer step
    on the last, and for offload the host work, so the figure is what the user's job pays per optimizer step.
    The second point of the search's step-time line (autotune.search.speed, A3) is timed after it: where the job
    runs one micro-step per optimizer step at both micro-batches, as whole steps at the smaller one
    (`smaller_step_s`), the point as that job would run it; otherwise from its parts, a plain micro-step at each
    micro-batch and what an optimizer step adds (the search shares it out over the smaller one's accumulation).
    """

    step_times_s: list[float]  # per measured optimizer step, warm-up excluded
    micro_step_s: float | None = None  # forward + backward at the trial's micro-batch (median)
    optimizer_step_s: float | None = None  # what a step adds to its micro-steps: reduction, optimizer, offload
    accumulation: int = 1
    smaller_micro_batch: int | None = None  # the second point of this launch
    smaller_micro_step_s: float | None = None
    smaller_step_s: float | None = None  # a whole optimizer step at the smaller micro-batch (median)


# The second point (plain micro-steps, or whole steps at the smaller micro-batch) is timed for a fixed few steps: it
# feeds the search's bounds, not the figure it decides on. Their median is what is used.
PART_STEPS = 3


class StoppedOverLimit(Exception):
    """The trial's peak after its warm-up is over the search's limit on some rank (TrialSpec.stop_over_bytes)."""

    def __init__(self, peak_bytes: int, limit_bytes: int, warmup_steps: int) -> None:
        super().__init__(
            f"peak {format_bytes(peak_bytes)} after {warmup_steps} warm-up steps, over the search's limit of"
            f" {format_bytes(limit_bytes)}: stopped before timing (a speed over the headroom is never used)"
        )


def _stop_if_over_limit(spec: TrialSpec, placement: Placement, memory: MemoryTracker, device: Any) -> None:
    """After the warm-up, whose boundary steps reach a real step's peak: every rank takes the worst rank's peak (the
    search judges the worst, TrialResult.peak_memory_bytes), so all stop together or none does."""
    if spec.stop_over_bytes is None:
        return
    own = rank_peak_bytes(memory.so_far(placement.rank), spec.predicted_outside_allocator_bytes)
    worst = int(_slowest_rank(float(own or 0), placement.world_size, device))
    if worst > spec.stop_over_bytes:
        raise StoppedOverLimit(worst, spec.stop_over_bytes, spec.warmup_steps)


def _timed(run: Any, placement: Placement, device: Any, memory: MemoryTracker, steps: int) -> list[float]:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    times: list[float] = []
    while len(times) < steps:
        started = time.perf_counter()
        run()
        accelerator.synchronize()
        times.append(_slowest_rank(time.perf_counter() - started, placement.world_size, device))
        memory.sample()
    return times


def _timed_until_enough(
    run: Any, spec: TrialSpec, placement: Placement, device: Any, memory: MemoryTracker
) -> list[float]:
    """Whole steps until their median is known well enough (autotune.core.measurement.enough_steps); every rank
    sees the same all-reduced times, so all stop at the same step."""
    times: list[float] = []
    while not enough_steps(times, spec.max_steps, spec.max_measure_s, min(MIN_STEPS, spec.max_steps)):
        times += _timed(run, placement, device, memory, steps=1)
    return times


def job_accumulation(engine: Any, world_size: int) -> int:
    """Micro-steps per optimizer step in the user's job, from DeepSpeed's batch arithmetic
    (train_batch_size = micro-batch x accumulation x world size).

    Not `engine.gradient_accumulation_steps()`: ZenFlow with `update_interval: "auto"` rewrites that to 0 and
    decides its update boundaries itself (deepspeed 0.19.8 runtime/zenflow/engine.py:47-49, 69), which made a
    ZenFlow trial's step time `boundary - micro-step`, negative (seen in the README demo: -20 samples/s)."""
    micro_batch = engine.train_micro_batch_size_per_gpu()
    return max(1, engine.train_batch_size() // max(1, micro_batch * world_size))


def _optimizer_step(engine: Any, batch: dict[str, Any], accumulation: int) -> None:
    """One whole optimizer step: accumulation - 1 plain micro-steps, then the boundary one."""
    for index in range(accumulation):
        _micro_step(engine, batch, boundary=index == accumulation - 1)


def timed_steps(
    engine: Any,
    batch: dict[str, Any],
    spec: TrialSpec,
    placement: Placement,
    memory: MemoryTracker,
    clock: PhaseClock,
    smaller_batch: dict[str, Any] | None = None,
) -> StepTimes:
    """Warm-up, then whole optimizer steps until their median is known well enough, then the second point of the
    step-time line at a smaller micro-batch, in the same process: one launch gives two points. Every warm-up step is
    a boundary, so the optimizer's state and the peak memory of a real step are reached before anything is timed; a
    trial already over the search's limit there stops (TrialSpec.stop_over_bytes: StoppedOverLimit, reported as
    over_budget with its peak)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    accumulation = job_accumulation(engine, placement.world_size)
    # One micro-step per optimizer step at both micro-batches (no fixed global batch to accumulate towards): the
    # smaller one is timed as the job would run it, whole steps, and the plain micro-steps here are not needed. Its
    # memory point needs a warm-up step after the first: Adam's state is created by the first optimizer step
    # (deepspeed 0.19.8 runtime/zero/stage_1_and_2.py:944-945, initialize_optimizer_states: "lazy initialization of the
    # state at the first call to step"), so only a later forward/backward stands on a real step's memory.
    whole_smaller = (
        accumulation == 1 and smaller_batch is not None and not spec.fixed_global_batch and spec.warmup_steps >= 2
    )
    for step in range(spec.warmup_steps):
        # the forward/backward's peak at this micro-batch, beside the smaller one's (TrialResult.smaller_peak_point)
        measure = memory.phase("micro") if whole_smaller and step > 0 else None
        _micro_step(engine, batch, boundary=True, measure=measure)
        memory.sample()
        if step == 0:
            maybe_inject_fault("step", placement.rank)
    accelerator.synchronize()
    clock.mark("warmup")
    _stop_if_over_limit(spec, placement, memory, engine.device)
    steps = _timed_until_enough(
        lambda: _optimizer_step(engine, batch, accumulation), spec, placement, engine.device, memory=memory
    )
    if spec.warmup_steps == 0:
        maybe_inject_fault("step", placement.rank)
    if accumulation == 1 and smaller_batch is None:
        clock.mark("measured")
        return StepTimes(step_times_s=steps)
    if smaller_batch is not None and whole_smaller:
        smaller_s = _whole_smaller_steps(engine, smaller_batch, spec=spec, placement=placement, memory=memory)
        times = StepTimes(
            step_times_s=steps, smaller_micro_batch=_micro_batch_of(smaller_batch), smaller_step_s=smaller_s
        )
    else:
        times = _plain_parts(
            engine,
            batch,
            smaller_batch,
            steps=steps,
            accumulation=accumulation,
            spec=spec,
            placement=placement,
            memory=memory,
        )
    engine.set_gradient_accumulation_boundary(None)  # back to DeepSpeed's own counting
    clock.mark("measured")
    return times


def _micro_batch_of(batch: dict[str, Any]) -> int:
    return int(next(iter(batch.values())).shape[0])


def _whole_smaller_steps(
    engine: Any, smaller_batch: dict[str, Any], *, spec: TrialSpec, placement: Placement, memory: MemoryTracker
) -> float:
    """PART_STEPS whole steps at the smaller micro-batch (median seconds), each one's forward/backward peak taken in
    the phase the memory line reads beside the warm-up's at the trial's own micro-batch."""
    steps = min(PART_STEPS, spec.max_steps)
    times = _timed(
        lambda: _micro_step(engine, smaller_batch, True, measure=memory.phase("smaller_micro")),
        placement,
        engine.device,
        memory,
        steps=steps,
    )
    return statistics.median(times)


def _plain_parts(
    engine: Any,
    batch: dict[str, Any],
    smaller_batch: dict[str, Any] | None,
    *,
    steps: list[float],
    accumulation: int,
    spec: TrialSpec,
    placement: Placement,
    memory: MemoryTracker,
) -> StepTimes:
    """The parts of a step where the job accumulates (or the smaller micro-batch would): plain micro-steps at this
    micro-batch, so what an optimizer step adds is known, and at the smaller one."""
    parts = min(PART_STEPS, spec.max_steps)
    # Each set of plain micro-steps also measures its own peak: two micro-batches' peaks from one launch
    # (TrialResult.smaller_peak_point), so a group's memory line is known after its first trial.
    with memory.phase("micro"):
        plain = _timed(lambda: _micro_step(engine, batch, False), placement, engine.device, memory, steps=parts)
    micro = statistics.median(plain)
    optimizer = max(0.0, statistics.median(steps) - accumulation * micro)
    smaller_mb = smaller_s = None
    if smaller_batch is not None:
        with memory.phase("smaller_micro"):
            smaller = _timed(
                lambda: _micro_step(engine, smaller_batch, False), placement, engine.device, memory, steps=parts
            )
        smaller_mb = _micro_batch_of(smaller_batch)
        smaller_s = statistics.median(smaller)
    return StepTimes(
        step_times_s=steps,
        micro_step_s=micro,
        optimizer_step_s=optimizer,
        accumulation=accumulation,
        smaller_micro_batch=smaller_mb,
        smaller_micro_step_s=smaller_s,
    )


def engine_mode_facts(engine: Any) -> dict:
    """What the engine runs for the modern memory modes, read from its parsed config and its optimizer.

    For a partial optimizer offload the device-side share is read, not recomputed: DeepSpeed steps the sub-groups
    it keeps on the accelerator with its backup torch AdamW (runtime/zero/stage3.py:1249-1258), so the fp32
    partitions that optimizer holds state for are the ones that stayed.
    """
    zero = engine._config.zero_config
    facts: dict = {
        "zero_stage": int(zero.stage),
        "sub_group_size": int(zero.sub_group_size),
        "zenflow": getattr(zero, "zenflow", None) is not None,  # no such field in DeepSpeed 0.15.4
        "hpz_partition_size": int(zero.zero_hpz_partition_size),
        "quantized_weights": bool(zero.zero_quantized_weights),
        "quantized_gradients": bool(zero.zero_quantized_gradients),
        "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
    }
    offload = zero.offload_optimizer
    if offload is not None:
        super_offload = bool(getattr(offload, "super_offload", False))  # the field is new in DeepSpeed 0.18.0
        facts.update(offload_ratio=float(offload.ratio), super_offload=super_offload)
    groups = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    if groups:
        backup = getattr(engine.optimizer, "backup_optimizer", None)
        stepped_on_device = backup.state if backup is not None else {}
        placement = getattr(engine.optimizer, "subgroup_to_device", None) or {}
        facts["sub_groups"] = len(groups)
        facts["sub_group_elements"] = [int(group.numel()) for group in groups]
        facts["elements"] = sum(facts["sub_group_elements"])
        # stage3.py:1099-1108 places sub-groups on get_accelerator()._name or 'cpu'; on the CPU backend both are
        # 'cpu', so there every sub-group is stepped by DeepSpeedCPUAdam whatever the ratio
        facts["sub_groups_on_accelerator"] = sum(1 for device in placement.values() if device != "cpu")
        facts["device_stepped_elements"] = sum(int(group.numel()) for group in groups if group in stepped_on_device)
    return facts


def run_rank(spec: TrialSpec, placement: Placement, clock: PhaseClock, memory: MemoryTracker) -> RankReport:
    """The trial on this rank, in an already initialised process group; failures become the report."""
    import torch

    engine = model = None
    try:
        memory.limit_device(spec.gpu_memory_fraction)  # the whole process inside the emulated card
        device = torch.device("cuda", placement.local_rank) if spec.device == "cuda" else torch.device("cpu")
        model = build_trial_model(spec, device)
        parameters = count_parameters(model)
        layers, width = layers_and_width(model.config)
        if spec.lora:
            model = add_lora_adapters(model, spec.lora)
        if spec.grad_checkpointing:
            enable_grad_checkpointing(model)
        clock.mark("model_build")
        engine = initialize_engine(model, spec.ds_config, spec.optimizer)
        engine.train()
        clock.mark("engine_init")
        micro_batch = engine.train_micro_batch_size_per_gpu()
        batch = synthetic_batch(
            model,
            spec.family,
            micro_batch,
            spec.seq_len,
            device=device,
            seed=placement.rank,
            decoder_seq_len=spec.decoder_seq_len,
        )
        smaller = None
        if spec.smaller_micro_batch and spec.smaller_micro_batch < micro_batch:
            smaller = synthetic_batch(
                model,
                spec.family,
                spec.smaller_micro_batch,
                spec.seq_len,
                device=device,
                seed=placement.rank,
                decoder_seq_len=spec.decoder_seq_len,
            )
        times = timed_steps(engine, batch, spec, placement, memory=memory, clock=clock, smaller_batch=smaller)
        flops = flops_per_token(parameters, layers, width, spec.seq_len, grad_checkpointing=spec.grad_checkpointing)
        return RankReport(
            rank=placement.rank,
            status="ok",
            memory=memory.metrics(placement.rank),
            step_times_s=times.step_times_s,
            micro_step_s=times.micro_step_s,
            optimizer_step_s=times.optimizer_step_s,
            accumulation=times.accumulation,
            smaller_micro_batch=times.smaller_micro_batch,
            smaller_micro_step_s=times.smaller_micro_step_s,
            smaller_step_s=times.smaller_step_s,
            phases=dict(clock.phases),
            train_batch_size=engine.train_batch_size(),
            hardware_flops_per_token=flops.hardware,
            model_flops_per_token=flops.model,
            engine_facts=engine_mode_facts(engine),
        )
    except StoppedOverLimit as over:
        return RankReport(
            rank=placement.rank,
            status="over_budget",
            error=str(over),
            memory=memory.metrics(placement.rank),
            phases=dict(clock.phases),
        )
    except Exception as error:
        status, line = classify_exception(error)
        return RankReport(
            rank=placement.rank,
            status=status,
            error=line,
            memory=memory.metrics(placement.rank),
            phases=dict(clock.phases),
        )
    finally:
        if engine is not None:
            # Removes ZeRO's hooks, which would keep the model alive. A cleanup failure (say, after a CUDA
            # error) must not replace the trial's own outcome; a warm worker restarts after failures anyway.
            with contextlib.suppress(Exception):
                engine.destroy()
        if model is not None:  # what destroy() leaves: DeepSpeed's module-level references (deepspeed_globals.py)
            with contextlib.suppress(Exception):
                release_engine_globals(model)
        # ZeRO++'s hpZ/qgZ groups outlive the engine (deepspeed_globals.py): a warm worker's next hpZ trial would
        # fail DeepSpeed's assertion. What cannot be released is counted by the warm worker, which is then replaced.
        with contextlib.suppress(Exception):
            release_zeropp_groups()
        engine = model = None
        free_memory(spec.device)


def free_memory(device: str) -> None:
    """Return what the last trial held, so a warm worker's next trial starts from the same memory: the device
    cache, and on GPUs the pinned host blocks torch keeps page-locked after they are freed (an offload trial's
    would otherwise sit in the next trial's host peak: estimate/buffers.py), then the heap's free pages."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        empty_host_cache()
    release_host_memory()


def settle(device: str, local_rank: int) -> None:
    """What every trial's first step pays before its own memory: one matmul (cuBLAS's handle and workspace) and
    one collective (the communicator's buffers), then the caches emptied. A warm worker takes its floors after it
    (worker.py): before its first trial, so that trial's leftovers can count as growth (warm.py _WATCHED says which
    figures are judged from there), yet past the costs every process pays at its first step."""
    import torch

    where = torch.device("cuda", local_rank) if device == "cuda" else torch.device("cpu")
    square = torch.ones(64, 64, device=where)
    total = (square @ square).sum().reshape(1)
    torch.distributed.all_reduce(total)
    del square, total
    free_memory(device)
