"""The one tuning request every entry point builds (`tune`, `plan`, `hook`, the Python API), and its rules.

Defaults live here and nowhere else: the CLI reads them from `TuneRequest` (see cli/options.py), so
`--headroom` means the same in every command, and maps options to a request in one place (cli/request.py).
`validate()` checks everything that can be checked without the model or the hardware, so bad input is one line
and exit 2 before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autotune.core.choices import (
    KERNELS,
    TRIAL_WORKERS,
    Attention,
    Device,
    Kernels,
    Precision,
    TrialWorkers,
    is_one_of,
)
from autotune.core.ladder import Rung
from autotune.core.units import parse_bytes
from autotune.errors import UserError
from autotune.trial.launch.chooser import confirms_fresh, uses_warm

MAX_MICRO_BATCH_LIMIT = 1 << 16  # a bound on the grid the search walks; far above any real per-GPU micro-batch
# Relative-position models (T5) have no position table; their pre-training length is the default.
RELATIVE_POSITION_DEFAULT_SEQ_LEN = 512  # T5 paper, section 3.1.2: "sequence length of 512"
# `autotune tune`'s default --time-budget: a first tune without options must end in a sensible time (issue 45: the
# whole default ladder on tiny-gpt2 was on course for ~25 minutes of trials on a 2-core machine). It counts from the
# first op load (a fresh machine's op builds are said apart, tuner.py); the search launches no trial after it and
# stops one still running at it (tuning/trials.py), then writes the best verified config and what it did not try.
# The API (`TuneRequest`) and the hook keep no budget unless given one: a cluster job's own time limit is the hook's,
# and a budget-cut hook tuning is a fallback `--strict` refuses.
TUNE_TIME_BUDGET_S = 600.0
DEFAULT_SEQ_LEN_CAP = 2048  # a model's context is used up to this; longer contexts are a choice, not a default


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """What the user asked for, with the defaults every command shares. The choices' Literal types
    (autotune.core.choices) hold once `validate` has accepted the request."""

    model: str
    gpus: int | None = None
    nodes: int = 1
    gpu_type: str | None = None
    gpu_memory: str | None = None  # "80GiB"; a bare number is GiB (said on stderr by the CLI)
    device: Device = "cuda"  # "cpu": real trials on the CPU backend
    memory_budget: str | None = None  # per-rank cap for --device cpu, e.g. "2GiB"; a bare number is GiB
    seq_len: int | None = None
    global_batch: int | None = None
    precision: Precision | None = None
    attention: Attention = "sdpa"
    headroom: float = 0.9
    max_trials: int = 12
    time_budget_s: float | None = None
    max_micro_batch: int = 256
    micro_batches: tuple[int, ...] | None = None  # explicit grid; default powers of two
    rungs: tuple[Rung, ...] | None = None  # restrict the ladder
    nvme_path: str | None = None
    gpu_memory_fraction: float | None = None
    trial_timeout_s: float = 900.0
    out: str = "ds_config.json"
    report_dir: str | None = None  # default: the config's directory
    hf: bool = False
    use_cache: bool = True
    cache_dir: str | None = None  # a directory; the results cache is results.sqlite inside it
    script: str | None = None  # the user's training script: must exist when given; "train.py" in commands otherwise
    trust_remote_code: bool = False
    tokens_per_step: int | None = None  # a global batch in tokens (autotune.core.batch); exclusive with global_batch
    optimizer: str = "adamw"  # an autotune.training.optimizers name; trials run it and the config names it
    lora_rank: int | None = None  # LoRA adapters of this rank through peft on a frozen base
    lora_targets: tuple[str, ...] | None = None  # default: peft's target modules for the model type
    micro_batch: int | None = None  # fixed micro-batch per GPU: the grid is [micro_batch], nothing searched
    host_memory: str | None = None  # host RAM per node when planning for another machine, e.g. "64GiB"; bare = GiB
    decoder_seq_len: int | None = None  # encoder-decoder models: the decoder's length (default: seq_len)
    config: str | None = None  # a user's ds_config (JSON/hjson) whose fit `plan` answers (autotune.config_question)
    # tune/hook: the user's ds_config the tuned one is built on; every key outside the tuned set is kept
    # (autotune.dsconfig.base_config), and its global batch, precision and optimizer are the job's
    base_config: str | None = None
    kernels: Kernels = "stock"  # fused training kernels the user's training runs (Liger, flash-attn's): activations
    # Own-command mode (`autotune ... -- <command>`): every trial runs this launch command with the candidate
    # substituted in (trial/script_mode.py); None: our synthetic worker.
    command: tuple[str, ...] | None = None
    # What the own command runs: "hf" (an HF Trainer script: it gets the .hf.json) or "deepspeed" (a plain script: the
    # plain ds_config.json); None: told from the command (trial/own_command/script_command.py,
    # CommandTemplate.consumer).
    consumer: str | None = None
    # Modes that change the update rule or the numerics (ZenFlow, ZeRO++ quantization, partial offload ratio;
    # modes.applies.approximation) join the search only when the user opts in: by default the tuned config trains
    # the same model the same way (same optimizer math, global batch and precision).
    allow_approximate: bool = False
    # How trials are run: "warm" workers serve trial after trial (start-up paid once, a new process after a failure or
    # when memory an earlier trial left grows past the pool's limit, trial/launch/warm.py); "fresh" starts a process per
    # trial, as the user's job is. "auto": warm workers, and on GPUs the pick confirmed in a fresh process before it
    # is recommended (Search.confirm_fresh): on the CPU backend warm and fresh peaks were measured equal
    # (benchmarks/README.md, "Warm workers and DeepSpeed's leftovers"); on GPUs nobody has compared them yet (the GPU
    # kit's warm stage does), so the one figure the user relies on, the pick's peak, is a fresh process's.
    trial_workers: TrialWorkers = "auto"


def default_of(name: str) -> Any:
    """The default of one TuneRequest field, for the CLI's option declarations."""
    for item in fields(TuneRequest):
        if item.name == name:
            return item.default
    raise KeyError(name)


def memory_size(text: str, what: str) -> int:
    """Bytes from '80GiB', '24GB' or a bare number, which is GiB: nobody means 80 bytes of GPU memory."""
    stripped = str(text).strip()
    try:
        number = float(stripped)
    except ValueError:
        return _finite_bytes(stripped, what)
    if not math.isfinite(number) or number <= 0:
        raise UserError(f"invalid {what} {text!r}: must be a positive, finite size, e.g. 80GiB")
    return _finite_bytes(f"{stripped}GiB", what)


def _finite_bytes(text: str, what: str) -> int:
    try:
        value = parse_bytes(text, what=what)
    except OverflowError:
        raise UserError(f"invalid {what} {text!r}: too large") from None
    if value >= 1 << 60:
        raise UserError(f"invalid {what} {text!r}: too large")
    return value


def output_path(out: str) -> Path:
    """Where the config is written: through a symlink to its target, so a symlinked --out stays a symlink."""
    path = Path(out)
    return path.resolve() if path.is_symlink() else path


def check_kernels(kernels: str, device: str = "cuda") -> Kernels:
    """--kernels names a kernel set the memory model knows (returned as one); Liger and flash-attn kernels are
    Triton/CUDA only."""
    if not is_one_of(kernels, KERNELS):
        raise UserError(f"--kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels != "stock" and device == "cpu":
        raise UserError(f"--kernels {kernels} needs CUDA GPUs (Triton kernels); --device cpu runs stock modules")
    return kernels


def check_trial_workers(request: TuneRequest) -> None:
    """--trial-workers names a choice; warm workers run our own trial worker, on one node or across nodes (where
    they can start is the launcher chooser's: trial/launch/chooser.py)."""
    if request.trial_workers not in TRIAL_WORKERS:
        raise UserError(f"--trial-workers must be one of {', '.join(TRIAL_WORKERS)}, got {request.trial_workers!r}")
    if request.trial_workers != "warm":
        return
    if request.command is not None:
        raise UserError("--trial-workers warm runs autotune's own trial worker; an own command starts fresh each trial")


def uses_warm_workers(request: TuneRequest) -> bool:
    """Warm workers unless asked for fresh processes (see TuneRequest.trial_workers); the rule is the launcher
    chooser's (trial/launch/chooser.py)."""
    return uses_warm(nodes=request.nodes, own_command=request.command is not None, trial_workers=request.trial_workers)


def confirms_pick_in_fresh_process(request: TuneRequest) -> bool:
    """By default on GPUs, where warm workers run the trials: the pick once more in a process of its own."""
    own, workers = request.command is not None, request.trial_workers
    return confirms_fresh(nodes=request.nodes, own_command=own, trial_workers=workers, device=request.device)


def default_seq_len(max_positions: int | None) -> int:
    """The model's context, capped at 2048; relative-position models (T5) default to their pre-training 512."""
    if max_positions:
        return min(DEFAULT_SEQ_LEN_CAP, int(max_positions))
    return RELATIVE_POSITION_DEFAULT_SEQ_LEN


def micro_batch_grid(request: TuneRequest, world_size: int) -> list[int]:
    """The micro-batches the search may try, ascending; with --global-batch only whole accumulations.

    By default every integer up to --max-micro-batch: the largest micro-batch that fits is rarely a power of two,
    and the next power of two not fitting is often the only reason checkpointing looked needed. The search
    bisects this grid by the memory model and measured peaks, so its size costs predictions, not trials.
    --micro-batches pins a grid (e.g. powers of two)."""
    fixed = (request.micro_batch,) if request.micro_batch is not None else None
    grid = list(fixed or request.micro_batches or range(1, request.max_micro_batch + 1))
    if request.global_batch is None:
        return sorted(set(grid))
    per_rank, remainder = divmod(request.global_batch, world_size)
    if remainder or per_rank == 0:
        raise UserError(f"--global-batch {request.global_batch} is not a multiple of the world size {world_size}")
    if fixed is None and request.micro_batches is None:
        grid = [d for d in range(1, min(per_rank, request.max_micro_batch) + 1) if per_rank % d == 0]
    eligible = sorted({m for m in grid if per_rank % m == 0})
    if not eligible:
        raise UserError(
            f"no micro-batch in {grid} gives a whole gradient accumulation for global batch"
            f" {request.global_batch} at world size {world_size}"
        )
    return eligible


def chosen_rungs(request: TuneRequest) -> tuple[list[Rung], list[tuple[Rung, str]]]:
    """The rungs to search, and those left out with the reason (NVMe rungs need --nvme-path)."""
    chosen = list(request.rungs or Rung)
    unavailable = [(r, "no --nvme-path given") for r in chosen if r.needs_nvme] if not request.nvme_path else []
    return [r for r in chosen if not any(r is u for u, _ in unavailable)], unavailable
