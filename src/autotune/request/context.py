"""`TuneContext`: one validated request turned into everything the steps share.

`plan`, `tune`, `hook`, `check`'s fit rule and the benchmarks all build this one value, so they answer
about the same job: the same model summary, target, precision, sequence length, micro-batch grid,
rungs and run key.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass, field, replace

from autotune.core.batch import requested_global_batch
from autotune.core.choices import Precision
from autotune.core.ladder import Candidate, Rung
from autotune.core.versions import deepspeed_note, library_versions
from autotune.dsconfig.base_config import load_base, on_base, runnable
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.errors import UserError
from autotune.estimate.estimate_types import EstimateSettings
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.pinned import native_pinning
from autotune.estimate.runtime import RuntimeStack, local_stack
from autotune.hardware.specs import GpuSpec, Target
from autotune.infra.allocator_env import allocator_settings
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.report.data import Assumptions
from autotune.request.base_say import request_on_base
from autotune.request.cache_keys import run_key
from autotune.request.tune_request import (
    TuneRequest,
    chosen_rungs,
    default_seq_len,
    memory_size,
    micro_batch_grid,
)
from autotune.request.validation import validate
from autotune.training.lora import LoraSettings, lora_summary
from autotune.trial.trial_types import TrialSpec

# Trial results depend on the memory limit (a CPU trial over its budget is stopped), so the trials' key holds
# the limit in buckets 5% wide on a log scale: a few percent of jitter in free memory keeps the key. The final
# answer is keyed without the limit and re-checked against the limit now (tuner.cached_answer).
LIMIT_BUCKET_RATIO = 1.05


def limit_bucket(limit_bytes: int) -> int:
    return round(math.log(max(limit_bytes, 1)) / math.log(LIMIT_BUCKET_RATIO))


def uses_relative_positions(model: ModelSummary) -> bool:
    """T5-style relative attention has no position table: any length runs (the config's n_positions is a
    leftover of the pre-training length; transformers' T5Attention buckets distances instead)."""
    return "relative_attention_num_buckets" in model.config


def cpu_target(request: TuneRequest) -> Target:
    """The CPU backend: each rank is a process; its memory budget plays the role of GPU free memory."""
    from autotune.hardware.machine_probe import cpu_has_native_bf16, probe

    host = probe(request.hardware.nvme_path).host
    ranks = request.hardware.gpus or 1
    budget = (
        memory_size(request.hardware.memory_budget, "--memory-budget")
        if request.hardware.memory_budget
        else (host.usable_ram_bytes // ranks)
    )
    cpu = GpuSpec(
        key="cpu",
        name=f"CPU rank ({platform.processor() or platform.machine()})",
        memory_bytes=budget,
        bf16=cpu_has_native_bf16(),
        source="CPU backend (DS_ACCELERATOR=cpu, gloo)",
    )
    return Target(
        cpu,
        ranks,
        request.hardware.nodes,
        budget,
        host_ram_bytes=host.usable_ram_bytes,
        nvme_free_bytes=host.nvme_free_bytes,
        measured=True,
        memlock_bytes=host.locked.binding_bytes,
    )


def gpu_target(request: TuneRequest) -> Target:
    from autotune.hardware.machine_probe import probe
    from autotune.hardware.target import resolve_target

    planned = bool(request.hardware.gpu_type or request.hardware.gpu_memory)
    probed = probe(request.hardware.nvme_path) if not planned or request.hardware.nvme_path else None
    memory = f"{memory_size(request.hardware.gpu_memory, '--gpu-memory')}B" if request.hardware.gpu_memory else None
    target = resolve_target(
        probed, request.hardware.gpus, request.hardware.nodes, request.hardware.gpu_type, gpu_memory=memory
    )
    if planned or request.hardware.host_memory:
        # another machine: this one's RAM says nothing of its host; --host-memory does, else unknown. Here: the
        # user's figure replaces the probe's (psutil `available` at probe time, which a machine whose RAM grows
        # with use understates), and the report says so (host_memory_note)
        host = memory_size(request.hardware.host_memory, "--host-memory") if request.hardware.host_memory else None
        target = replace(target, host_ram_bytes=host)
    if request.hardware.gpu_memory_fraction and target.measured:
        emulated = int(request.hardware.gpu_memory_fraction * target.gpu.memory_bytes)
        target = replace(target, free_memory_bytes=min(target.free_memory_bytes, emulated))
    return target


def host_memory_note(request: TuneRequest, target: Target) -> list[str]:
    """On a probed machine, --host-memory overrides the probe: said, since every offload candidate is held to it."""
    if (
        not request.hardware.host_memory
        or request.hardware.gpu_type
        or request.hardware.gpu_memory
        or target.host_ram_bytes is None
    ):
        return []
    from autotune.core.units import format_bytes

    return [
        f"host RAM per node {format_bytes(target.host_ram_bytes)} as --host-memory states it, not this machine's"
        " probe (the RAM available when it ran); offload candidates are held to it"
    ]


def default_precision(target: Target) -> Precision:
    """bf16 where the device computes it natively; else fp16 on GPUs (pre-Ampere) and fp32 on CPUs (no fp16 there)."""
    if target.gpu.bf16:
        return "bf16"
    return "fp32" if target.gpu.key == "cpu" else "fp16"


def check_host_capacity(request: TuneRequest, target: Target) -> None:
    """Before CPU trials: the ranks' budgets must fit in this machine's RAM, and each rank needs a core."""
    if request.hardware.device != "cpu":
        return
    from autotune.core.units import format_bytes

    ranks = target.world_size
    total = ranks * target.free_memory_bytes
    if target.host_ram_bytes is not None and total > target.host_ram_bytes:
        raise UserError(
            f"{ranks} CPU rank(s) x {format_bytes(target.free_memory_bytes)} = {format_bytes(total)} is more than"
            f" the {format_bytes(target.host_ram_bytes)} of RAM available here; lower --memory-budget or --gpus"
        )
    cores = os.cpu_count() or 1
    if ranks > cores:
        raise UserError(f"--gpus {ranks}: more CPU ranks than this machine's {cores} core(s)")


def resolve_request_target(request: TuneRequest) -> Target:
    return cpu_target(request) if request.hardware.device == "cpu" else gpu_target(request)


def runtime_stack(target: Target, device: str) -> RuntimeStack:
    """The torch/CUDA/NCCL stack the job runs with: this machine's when the GPUs are probed here, else unknown
    (an unknown stack widens the margin: estimate/runtime.py)."""
    if device == "cuda" and target.measured:
        return local_stack(target.gpu.compute_capability)
    return RuntimeStack()


def known_accumulation(global_batch: int | None, micro_batch: int | None, world_size: int) -> int | None:
    """Gradient accumulation where the request fixes it: 1 when autotune chooses the batch (dsconfig emits
    accumulation 1 then), global / (micro x world) for a fixed micro-batch; None while the search varies it."""
    if global_batch is None:
        return 1
    if micro_batch is None:
        return None
    return global_batch // (micro_batch * world_size)


@dataclass(frozen=True)
class TuneContext:
    """Everything derived from a request that plan, tune, hook, check and the benchmarks share."""

    request: TuneRequest
    model: ModelSummary
    target: Target
    precision: Precision
    seq_len: int
    grid: list[int]
    rungs: list[Rung]
    unavailable: list[tuple[Rung, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # assumptions worth telling the user
    lora: LoraSettings | None = None  # peft LoRA on a frozen base; the summary then counts trainable params
    batch_chosen_by: str | None = None  # "user", "tokens_per_step", or None: autotune chose the global batch
    versions: dict[str, str] = field(default_factory=library_versions)  # read once: metadata lookups are slow
    stack: RuntimeStack = field(default_factory=RuntimeStack)  # runtime_stack(): read once, at build
    decoder_seq_len: int | None = None  # encoder-decoder models: the decoder's length (seq_len is the encoder's)
    user_config: dict | None = None  # request.training.config as read (check/loading.py, the reader `check` uses)
    base: dict | None = None  # request.training.base_config as read: the user's config the tuned one is built on
    # the CUDA allocator's settings the trials inherit (infra/allocator_env.py), read once, at build: in the cache key
    allocator: dict[str, str] = field(default_factory=allocator_settings)

    @classmethod
    def build(
        cls, request: TuneRequest, model: ModelSummary | None = None, target: Target | None = None, outputs: bool = True
    ) -> TuneContext:
        """Validate `request` and resolve it; `model` and `target` may be given to skip resolving them.

        `outputs=False`: the caller writes nothing, so --out and the other output paths are not checked."""
        validate(request, outputs=outputs)
        user_config = None
        if request.training.config is not None:  # read before any probing: an unreadable file is one line, exit 2
            from autotune.dsconfig.loading import load_config

            if request.search.rungs or request.search.micro_batches:
                raise UserError("--config fixes the stage and offload: --rungs and --micro-batches do not apply")
            user_config = load_config(request.training.config).config
        base = load_base(request.training.base_config) if request.training.base_config is not None else None
        target = target or resolve_request_target(request)  # before the summary: fail fast without a GPU
        notes = []
        if base is not None:  # what the base fixes about the training becomes the request's
            request, base_notes = request_on_base(request, base, target.world_size)
            notes += base_notes
        model = model or summarize(resolve_model(request.model.name, request.model.trust_remote_code))
        lora = LoraSettings(request.model.lora_rank, request.model.lora_targets) if request.model.lora_rank else None
        if lora:
            model = lora_summary(model, lora)
        relative = uses_relative_positions(model)
        seq_len = request.model.seq_len or default_seq_len(None if relative else model.max_positions)
        if not relative and model.max_positions and seq_len > model.max_positions:
            raise UserError(f"--seq-len {seq_len} exceeds the model's {model.max_positions} positions")
        decoder_seq_len = None
        if model.family == "encoder-decoder":
            decoder_seq_len = request.model.decoder_seq_len or seq_len
            if request.model.decoder_seq_len is None:
                notes.append(f"encoder and decoder sequence length both {seq_len} (--decoder-seq-len sets the decoder)")
        elif request.model.decoder_seq_len is not None:
            raise UserError(f"--decoder-seq-len applies to encoder-decoder models; {model.name} is {model.family}")
        precision = request.training.precision or default_precision(target)
        if not request.training.precision and target.gpu.key == "cpu" and precision == "fp32":
            notes.append(
                "precision fp32: this CPU has no native bf16 (no avx512_bf16/amx_bf16 flag), so bf16 is emulated"
                " (a measured step: 18 s in bf16, 1.3 s in fp32; docs/quick-start.md);"
                " --precision bf16 tunes bf16 anyway"
            )
        notes += kernel_notes(request, target.measured)
        notes += host_memory_note(request, target)
        notes += [note] if (note := deepspeed_note()) else []  # the one place tune and hook say it (core/versions.py)
        chosen_by = (
            "tokens_per_step" if request.training.tokens_per_step else "user" if request.training.global_batch else None
        )
        global_batch = requested_global_batch(
            request.training.global_batch, request.training.tokens_per_step, seq_len, target.world_size
        )
        request = request.updated(global_batch=global_batch)
        rungs, unavailable = chosen_rungs(request)
        grid = micro_batch_grid(request, target.world_size)
        if global_batch is not None and request.search.micro_batch is None and request.search.micro_batches is None:
            notes.append(
                f"global batch {global_batch} is fixed: the micro-batches tried are the divisors of its per-rank share"
                f" {global_batch // target.world_size} ({', '.join(map(str, grid))}), so the accumulation is whole"
            )
        stack = runtime_stack(target, request.hardware.device)
        return cls(request, model, target, precision, seq_len, grid, rungs, unavailable, notes, lora=lora,
                   batch_chosen_by=chosen_by, stack=stack, decoder_seq_len=decoder_seq_len,
                   user_config=user_config, base=base)  # fmt: skip

    @property
    def verified(self) -> bool:
        """Trials can run: the target is this machine's hardware, not a profile."""
        return self.target.measured

    @property
    def settings(self) -> EstimateSettings:
        """What the memory model needs: the stack as probed and the gradient accumulation where the request fixes
        it (ZeRO-1's full-gradient rule depends on it). The optimizer's states and step temporaries come from
        `optimizer` (training.optimizers.optimizer_memory); the knobs' step kind stays "fused" (no temporaries),
        so they are not counted twice."""
        request = self.request
        knobs = ZeroKnobs(
            gradient_accumulation_steps=known_accumulation(
                request.training.global_batch, request.search.micro_batch, self.target.world_size
            ),
        )
        return EstimateSettings(
            seq_len=self.seq_len,
            precision=self.precision,
            attention=request.model.attention,
            device=request.hardware.device,
            optimizer=request.training.optimizer,
            knobs=knobs,
            stack=self.stack,
            decoder_seq_len=self.decoder_seq_len,
            kernels=request.model.kernels,
            native_pinning=native_pinning(),  # DeepSpeed reads DS_PIN_MEMORY_BACKEND from the job's environment
        )

    @property
    def train(self) -> TrainSettings:
        return TrainSettings(
            world_size=self.target.world_size,
            precision=self.precision,
            global_batch=self.request.training.global_batch,
            hidden_size=self.model.hidden_size,
            nvme_path=self.request.hardware.nvme_path,
            optimizer=self.request.training.optimizer,
            trainable_params=self.model.trainable_params,
        )

    @property
    def limit_bytes(self) -> int:
        """The per-rank memory a config must stay under: headroom x free."""
        return int(self.request.search.headroom * self.target.free_memory_bytes)

    def question(self) -> dict:
        """Everything that decides the answer except the memory limit."""
        request = self.request
        return {
            "model": self.model.fingerprint,
            # the CPU "GPU" memory is the budget itself, which the limit covers
            "gpu": [self.target.gpu.name, None if self.target.gpu.key == "cpu" else self.target.gpu.memory_bytes],
            "gpus": self.target.gpus_per_node,
            "nodes": self.target.nodes,
            "device": request.hardware.device,
            "verified": self.verified,
            "versions": self.versions,
            "seq_len": self.seq_len,
            "global_batch": request.training.global_batch,
            "precision": self.precision,
            "attention": request.model.attention,
            "grid": self.grid,
            "rungs": [r.value for r in self.rungs],
            "fraction": request.hardware.gpu_memory_fraction,
            "optimizer": request.training.optimizer,
            "lora": self.lora.to_dict() if self.lora else None,
            **({"decoder_seq_len": self.decoder_seq_len} if self.decoder_seq_len not in (None, self.seq_len) else {}),
            # own-command trials measure the user's job, not our worker: never the same answer
            **({"command": list(request.training.command)} if request.training.command else {}),
            # the kernels change the predictions the search and plan-only answers use; stock keeps the old keys
            **({"kernels": request.model.kernels} if request.model.kernels != "stock" else {}),
            # the opt-in widens the search: never the same answer as a same-training tuning
            **({"allow_approximate": True} if request.search.allow_approximate else {}),
            # a base config's kept keys (optimizer, clipping, ...) run in every trial
            **({"base": self.base} if self.base is not None else {}),
            # what may be mlocked decides which offload configs can run (estimate/pinned.py); else the old keys
            **({"mlock": [self.target.memlock_bytes, native_pinning()]} if self._mlock_matters else {}),
            # the CUDA allocator's settings change the peaks a trial measures (infra/allocator_env.py)
            **({"allocator": self.allocator} if request.hardware.device != "cpu" and self.allocator else {}),
        }

    @property
    def _mlock_matters(self) -> bool:
        return native_pinning() or any(rung.needs_nvme for rung in self.rungs)

    def trial_question(self) -> dict:
        """What decides one trial's result: the question less what only chooses which candidates to try (the
        micro-batch grid, the rung list), so a re-run with a narrower `--rungs` or `--micro-batches` reuses the
        trials already measured. A trial's own candidate is in its row; its config is built from the candidate and
        the rest of the question (`tuned_config`), which stays. What may be mlocked decides whether pinned NVMe
        offload runs: it stays whenever an NVMe rung could run here (an NVMe path given), not only when the
        chosen rungs hold one, so that narrowing the rungs does not change the key."""
        question = {k: v for k, v in self.question().items() if k not in ("grid", "rungs", "mlock")}
        if native_pinning() or self.request.hardware.nvme_path is not None:
            question["mlock"] = [self.target.memlock_bytes, native_pinning()]
        return question

    @property
    def key(self) -> str:
        """The trials' key: the trial question and the memory limit, bucketed (see LIMIT_BUCKET_RATIO). The
        answer's key (`answer_key`) keeps the grid and the rungs: the best of a narrower search is another answer."""
        return run_key({**self.trial_question(), "limit_bucket": limit_bucket(self.limit_bytes)})

    @property
    def answer_key(self) -> str:
        """The final answer's key: the question alone; a stored answer records the limit it was found under."""
        return run_key({**self.question(), "answer": 1})

    def ds_config(self, candidate: Candidate) -> dict:
        """The candidate's config as a trial gets it (own-command trials merge it into the user's file): on the
        user's base config when one is given, its "auto" values filled as HF Trainer fills them."""
        return runnable(self.tuned_config(candidate), self.target.world_size)

    def tuned_config(self, candidate: Candidate) -> dict:
        """The candidate's keys on the user's base config (autotune.dsconfig.base_config), "auto" values as written."""
        return on_base(build_ds_config(candidate, self.train), self.base)

    def emitted_config(self, candidate: Candidate) -> dict:
        """The config written for the user: the trial's, and in own-command mode the user's base config with the
        candidate's keys, without the autotuning hooks the trials ran with (trial/script_mode.py)."""
        config = self.tuned_config(candidate)
        if self.request.training.command is None:
            return config
        from autotune.request.own_command_mode import emitted_config

        return emitted_config(self.request, config)

    def hf_base(self) -> dict | None:
        """The user's config the .hf.json keeps as written: --config's, or in own-command mode the file the command
        names (DeepSpeed Autotuning's convention), whose clipping and optimizer values are the user's."""
        if self.request.training.command is None or self.base is not None:
            return self.base
        from autotune.request.own_command_mode import command_base

        return command_base(self.request)

    def spec(self, candidate: Candidate) -> TrialSpec:
        """The trial `tune()` runs for `candidate`; the benchmarks measure with exactly this."""
        request = self.request
        return TrialSpec(
            model_config=self.model.config,
            architecture=self.model.architecture,
            family=self.model.family,
            ds_config=self.ds_config(candidate),
            seq_len=self.seq_len,
            grad_checkpointing=candidate.grad_checkpointing,
            device="cpu" if request.hardware.device == "cpu" else "cuda",
            nprocs_per_node=self.target.gpus_per_node,
            nodes=self.target.nodes,
            timeout_s=request.search.trial_timeout_s,
            gpu_memory_fraction=request.hardware.gpu_memory_fraction,
            host_memory_budget_bytes=self.limit_bytes if request.hardware.device == "cpu" else None,
            peak_tflops=self.target.gpu.peak_tflops(self.precision),
            trust_remote_code=self.model.trust_remote_code,
            smaller_micro_batch=candidate.micro_batch // 2 or None,  # second point of the step-time line
            fixed_global_batch=request.training.global_batch is not None,
            optimizer=request.training.optimizer,
            lora={**self.lora.to_dict(), "model_type": self.model.model_type} if self.lora else None,
            decoder_seq_len=self.decoder_seq_len,
            predicted_outside_allocator_bytes=self._outside_allocator_bytes(),
            # GPU trials stop once over the limit after warm-up; the CPU backend's budget watch does it as it passes
            stop_over_bytes=self.limit_bytes if request.hardware.device != "cpu" else None,
        )

    def confirmation_spec(self, candidate: Candidate) -> TrialSpec:
        """The pick's fresh-process confirmation (search/pick_decision.py confirm_fresh): the trial `spec` gives,
        without the second point of the step-time line. The confirmation is of the pick's memory and speed as the
        job starts; the half micro-batch's plain steps feed the walk's lines (speed and memory), and the walk is
        over. With gradient accumulation the plain micro-steps at the pick's own micro-batch still run (the worker
        needs them for the optimizer's share: trial/worker/train_steps.py timed_steps)."""
        return replace(self.spec(candidate), smaller_micro_batch=None)

    def _outside_allocator_bytes(self) -> int | None:
        """The CUDA context and NCCL buffers per GPU rank as the memory model predicts them: a trial without an
        NVML figure adds them to its max reserved (trial/trial_types.py TrialResult.peak_memory_bytes)."""
        if self.request.hardware.device == "cpu":
            return None
        from autotune.estimate.peak import runtime_overheads

        return sum(overhead.central for overhead in runtime_overheads(self.target, self.settings).values())

    def assumptions(self, candidate: Candidate | None) -> Assumptions:
        """What the tuning assumed, written beside the config so `check` and a later `plan` ask the same question."""
        return Assumptions(
            model=self.request.model.name,
            model_fingerprint=self.model.fingerprint,
            seq_len=self.seq_len,
            precision=self.precision,
            attention=self.request.model.attention,
            grad_checkpointing=candidate.grad_checkpointing if candidate else None,
            gpus_per_node=self.target.gpus_per_node,
            nodes=self.target.nodes,
            gpu_type=self.request.hardware.gpu_type,
            gpu_memory=self.request.hardware.gpu_memory,
            memory_bytes_per_rank=self.target.free_memory_bytes,  # the CPU budget, or a planned GPU's memory
            device=self.request.hardware.device,
            headroom=self.request.search.headroom,
            trust_remote_code=self.request.model.trust_remote_code,
            optimizer=self.request.training.optimizer,
            lora_rank=self.request.model.lora_rank,
            lora_targets=tuple(self.request.model.lora_targets) if self.request.model.lora_targets else None,
            decoder_seq_len=self.decoder_seq_len,
            kernels=self.request.model.kernels,
        )


def kernel_notes(request: TuneRequest, trials_run: bool) -> list[str]:
    """What --kernels changes: the prediction counts the fused kernels; our synthetic trial cannot run them."""
    from autotune.estimate.kernels import kernels_note

    note = kernels_note(request.model.kernels)
    if note is None:
        return []
    notes = [note]
    if trials_run and request.training.command is None:
        notes.append(
            "the trials run autotune's synthetic worker with transformers' stock modules, not the"
            f" {request.model.kernels}"
            " kernels (Triton/CUDA kernels your own training turns on): their measured peaks are stock ones and the"
            " prediction for your training differs from them; give your own launch command (`autotune ... --"
            " <command>`) for trials that run your kernels"
        )
    return notes
