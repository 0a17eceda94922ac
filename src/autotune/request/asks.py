"""The sections of a tuning request: what each field is about decides its section.

| section             | fields, by the flat names `TuneRequest.of` and the CLI mapping take                       |
|---------------------|-------------------------------------------------------------------------------------------|
| `model`: ModelAsk   | model (`.name`), seq_len, decoder_seq_len, attention, trust_remote_code, lora_rank,        |
|                     | lora_targets, kernels                                                                     |
| `hardware`: HardwareAsk | gpus, nodes, gpu_type, gpu_memory, device, memory_budget, host_memory, nvme_path,     |
|                     | gpu_memory_fraction                                                                       |
| `training`: TrainingAsk | global_batch, tokens_per_step, precision, optimizer, base_config, config, command,    |
|                     | consumer, script                                                                          |
| `search`: SearchAsk | headroom, max_trials, time_budget_s, max_micro_batch, micro_batches, micro_batch, rungs,  |
|                     | trial_timeout_s, trial_workers, allow_approximate                                         |
| `output`: OutputAsk | out, report_dir, hf, use_cache, cache_dir                                                 |

Why there: the model section is what is trained (its lengths, attention, adapters and kernels change the model's
memory); the hardware section is where it runs (including the offload targets, host RAM and NVMe); the training
section is how the user trains it, which the tuned config must keep (batch, precision, optimizer, the user's own
config and command); the search section is how autotune looks (its limits, grid, ladder, trial processes and the
approximate-modes opt-in); the output section is where results go and come from: the config, the reports and the
results cache (`use_cache` beside `cache_dir`), none of which changes an answer, so the hook's job key leaves the
whole section out (hook/run.py).

Every field keeps its flat name (one name per field across all sections, checked when `flat_fields` builds the
table) except `ModelAsk.name`, whose flat name `model` is declared in its metadata (`FLAT_NAME`): a flat name is
derived from the section dataclasses' fields, never from a second hand-written table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.core.choices import Attention, Device, Kernels, Precision, TrialWorkers
from autotune.core.ladder import Rung

FLAT_NAME = "flat_name"  # a section field's metadata key: its flat name, where it is not the field's own name


@dataclass(frozen=True, kw_only=True)
class ModelAsk:
    """What is trained: the model and what changes its memory per token."""

    name: str = field(metadata={FLAT_NAME: "model"})  # profile, HF dir / config.json, or cached hub id
    seq_len: int | None = None
    decoder_seq_len: int | None = None  # encoder-decoder models: the decoder's length (default: seq_len)
    attention: Attention = "sdpa"
    trust_remote_code: bool = False
    lora_rank: int | None = None  # LoRA adapters of this rank through peft on a frozen base
    lora_targets: tuple[str, ...] | None = None  # default: peft's target modules for the model type
    kernels: Kernels = "stock"  # fused training kernels the user's training runs (Liger, flash-attn's): activations


@dataclass(frozen=True, kw_only=True)
class HardwareAsk:
    """Where the training runs: the accelerators, their memory, and the host's memory and disk it offloads to."""

    gpus: int | None = None
    nodes: int = 1
    gpu_type: str | None = None
    gpu_memory: str | None = None  # "80GiB"; a bare number is GiB (said on stderr by the CLI)
    device: Device = "cuda"  # "cpu": real trials on the CPU backend
    memory_budget: str | None = None  # per-rank cap for --device cpu, e.g. "2GiB"; a bare number is GiB
    host_memory: str | None = None  # host RAM per node when planning for another machine, e.g. "64GiB"; bare = GiB
    nvme_path: str | None = None
    gpu_memory_fraction: float | None = None


@dataclass(frozen=True, kw_only=True)
class TrainingAsk:
    """How the user trains: what the tuned config must keep (same optimizer math, global batch and precision)."""

    global_batch: int | None = None
    tokens_per_step: int | None = None  # a global batch in tokens (autotune.core.batch); exclusive with global_batch
    precision: Precision | None = None
    optimizer: str = "adamw"  # an autotune.training.optimizers name; trials run it and the config names it
    # tune/hook: the user's ds_config the tuned one is built on; every key outside the tuned set is kept
    # (autotune.dsconfig.base_config), and its global batch, precision and optimizer are the job's
    base_config: str | None = None
    config: str | None = None  # a user's ds_config (JSON/hjson) whose fit `plan` answers (autotune.config_question)
    # Own-command mode (`autotune ... -- <command>`): every trial runs this launch command with the candidate
    # substituted in (trial/own_command/); None: our synthetic worker.
    command: tuple[str, ...] | None = None
    # What the own command runs: "hf" (an HF Trainer script: it gets the .hf.json) or "deepspeed" (a plain script: the
    # plain ds_config.json); None: told from the command (trial/own_command/script_command.py,
    # CommandTemplate.consumer).
    consumer: str | None = None
    script: str | None = None  # the user's training script: must exist when given; "train.py" in commands otherwise


@dataclass(frozen=True, kw_only=True)
class SearchAsk:
    """How autotune looks: its limits, the grid and ladder it walks, and how it runs trials."""

    headroom: float = 0.9
    max_trials: int | None = None  # None: derived from the rungs and modes (search/trial_budget.py)
    time_budget_s: float | None = None
    max_micro_batch: int = 256
    micro_batches: tuple[int, ...] | None = None  # explicit grid; default every integer up to max_micro_batch
    micro_batch: int | None = None  # fixed micro-batch per GPU: the grid is [micro_batch], nothing searched
    rungs: tuple[Rung, ...] | None = None  # restrict the ladder
    trial_timeout_s: float = 900.0
    # How trials are run: "warm" workers serve trial after trial (start-up paid once, a new process after a failure or
    # when memory an earlier trial left grows past the pool's limit, trial/launch/warm.py); "fresh" starts a process per
    # trial, as the user's job is. "auto": warm workers, and on GPUs the pick confirmed in a fresh process before it
    # is recommended, or by its own trial where that was the first of a launch (Search.confirm_fresh): on the CPU
    # backend warm and fresh peaks were measured equal (benchmarks/README.md, "Warm workers and DeepSpeed's
    # leftovers"); on GPUs nobody has compared them yet (the GPU kit's warm stage does), so the one figure the user
    # relies on, the pick's peak, is a fresh process's.
    trial_workers: TrialWorkers = "auto"
    # Modes that change the update rule or the numerics (ZenFlow, ZeRO++ quantization, partial offload ratio;
    # modes.applies.approximation) join the search only when the user opts in: by default the tuned config trains
    # the same model the same way (same optimizer math, global batch and precision).
    allow_approximate: bool = False


@dataclass(frozen=True, kw_only=True)
class OutputAsk:
    """Where results go and come from: none of these changes the answer."""

    out: str = "ds_config.json"
    report_dir: str | None = None  # default: the config's directory
    hf: bool = False  # no effect: the .hf.json variant is always written (tune keeps --hf)
    use_cache: bool = True
    cache_dir: str | None = None  # a directory; the results cache is results.sqlite inside it
