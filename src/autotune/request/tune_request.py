"""The one tuning request every entry point builds (`tune`, `plan`, `hook`, the Python API), and its rules.

Defaults live here and nowhere else: the CLI reads them from `TuneRequest` (see cli/options.py), so
`--headroom` means the same in every command, and maps options to a request in one place (cli/request.py).
`validate()` checks everything that can be checked without the model or the hardware, so bad input is one line
and exit 2 before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from autotune.core.choices import KERNELS, TRIAL_WORKERS, Kernels, is_one_of
from autotune.core.ladder import Rung
from autotune.core.units import parse_bytes
from autotune.errors import UserError
from autotune.request.asks import FLAT_NAME, HardwareAsk, ModelAsk, OutputAsk, SearchAsk, TrainingAsk
from autotune.trial.launch.chooser import confirms_fresh, uses_warm

MAX_MICRO_BATCH_LIMIT = 1 << 16  # a bound on the grid the search walks; far above any real per-GPU micro-batch
# Relative-position models (T5) have no position table; their pre-training length is the default.
RELATIVE_POSITION_DEFAULT_SEQ_LEN = 512  # T5 paper, section 3.1.2: "sequence length of 512"
# `autotune tune --device cpu`'s default --time-budget: a first tune without options must end in a sensible time
# (issue 45: the whole default ladder on tiny-gpt2 was on course for ~25 minutes of trials on a 2-core machine). It
# counts from the first op load (a fresh machine's op builds are said apart, tuner.py); the search launches no trial
# after it and stops one still running at it (tuning/trials.py), then writes the best verified config and what it did
# not try. GPU tunes have none by default: a budget in seconds stops the search where its trials get long (offload at
# large micro-batches, large models across nodes), and those are often the trials that decide; on the simulated GPU
# cluster 600 s left 4 of 15 scenarios under 0.99 of the best pick, the derived trial budget alone none
# (benchmarks/records/search-defaults_sim_2026-11-29.md). The API (`TuneRequest`) and the hook keep no budget unless
# given one: a cluster job's own time limit is the hook's, and a budget-cut hook tuning is a fallback `--strict`
# refuses.
CPU_TUNE_TIME_BUDGET_S = 600.0
DEFAULT_SEQ_LEN_CAP = 2048  # a model's context is used up to this; longer contexts are a choice, not a default
# A TuneRequest field's metadata key: the section dataclass it holds (`flat_fields` reads it there, so a request type a
# test widens is read the same way).
SECTION = "section"


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """What the user asked for, in sections (request/asks.py has the table), with the defaults every command shares.
    The choices' Literal types (autotune.core.choices) hold once `validate` has accepted the request.

    Built from flat names with `TuneRequest.of(model="gpt2", gpus=8)` and changed with `request.updated(gpus=4)`;
    read by section: `request.hardware.gpus`. The dataclass constructor itself takes the sections."""

    model: ModelAsk = field(metadata={SECTION: ModelAsk})  # no default: a request names its model
    hardware: HardwareAsk = field(default_factory=HardwareAsk, metadata={SECTION: HardwareAsk})
    training: TrainingAsk = field(default_factory=TrainingAsk, metadata={SECTION: TrainingAsk})
    search: SearchAsk = field(default_factory=SearchAsk, metadata={SECTION: SearchAsk})
    output: OutputAsk = field(default_factory=OutputAsk, metadata={SECTION: OutputAsk})

    def __post_init__(self) -> None:
        """`TuneRequest(model="gpt2")`, the flat call of before the sections, fails here, not at a later read."""
        for item in fields(self):
            if not isinstance(getattr(self, item.name), item.metadata[SECTION]):
                raise TypeError(
                    f"TuneRequest({item.name}=...) takes a {item.metadata[SECTION].__name__}; build a request from flat"
                    " names with TuneRequest.of(model=..., gpus=...)"
                )

    @classmethod
    def of(cls: type[R], **flat: Any) -> R:
        """The request these flat names ask for (request/asks.py: every field's flat name), the rest at defaults;
        an unknown name is a TypeError, as for any dataclass."""
        table = flat_fields(cls)
        grouped = _grouped(flat, table)
        if missing := [item.name for item in fields(cls) if item.name not in grouped and _required(item)]:
            raise TypeError(
                f"TuneRequest.of() needs {', '.join(f for name in missing for f in _flat_names(table, name))}"
            )
        return cls(**{name: _section_type(cls, name)(**values) for name, values in grouped.items()})

    def updated(self: R, **flat: Any) -> R:
        """This request with the fields these flat names give changed (dataclasses.replace, by flat name)."""
        grouped = _grouped(flat, flat_fields(type(self)))
        return replace(self, **{name: replace(getattr(self, name), **values) for name, values in grouped.items()})

    def flat_values(self) -> dict[str, Any]:
        """Every field by its flat name, in the sections' order: the flat view a results-cache key is made of."""
        table = flat_fields(type(self))
        return {flat: getattr(getattr(self, where.section), where.name) for flat, where in table.items()}


R = TypeVar("R", bound=TuneRequest)


@dataclass(frozen=True)
class FlatField:
    """Where one flat name lives: the TuneRequest field holding its section, and the field within the section."""

    section: str
    name: str
    default: Any


def flat_fields(request_type: type[TuneRequest] = TuneRequest) -> dict[str, FlatField]:
    """Flat name -> where it lives, derived from the section dataclasses' fields (a field's own name, or the one its
    metadata declares); a flat name two sections share is a TypeError."""
    table: dict[str, FlatField] = {}
    for holder in fields(request_type):
        for item in fields(_section_type(request_type, holder.name)):
            flat = item.metadata.get(FLAT_NAME, item.name)
            if flat in table:
                raise TypeError(f"flat name {flat!r} is in both {table[flat].section} and {holder.name}")
            table[flat] = FlatField(holder.name, item.name, item.default)
    return table


def section_flat_names(section_name: str, request_type: type[TuneRequest] = TuneRequest) -> tuple[str, ...]:
    """The flat names of one section's fields, e.g. the output fields the hook's job key leaves out."""
    return _flat_names(flat_fields(request_type), section_name)


def default_of(name: str) -> Any:
    """The default of one field by its flat name (`dataclasses.MISSING` for the model), for declarations that share
    the request's defaults (check/fit.py)."""
    return flat_fields()[name].default


def _section_type(request_type: type[TuneRequest], name: str) -> type:
    return next(item.metadata[SECTION] for item in fields(request_type) if item.name == name)


def _required(item: Field) -> bool:
    return item.default is MISSING and item.default_factory is MISSING


def _flat_names(table: dict[str, FlatField], section_name: str) -> tuple[str, ...]:
    return tuple(flat for flat, where in table.items() if where.section == section_name)


def _grouped(flat: dict[str, Any], table: dict[str, FlatField]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        if name not in table:
            raise TypeError(f"TuneRequest has no field {name!r}")
        grouped.setdefault(table[name].section, {})[table[name].name] = value
    return grouped


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
    if request.search.trial_workers not in TRIAL_WORKERS:
        raise UserError(
            f"--trial-workers must be one of {', '.join(TRIAL_WORKERS)}, got {request.search.trial_workers!r}"
        )
    if request.search.trial_workers != "warm":
        return
    if request.training.command is not None:
        raise UserError("--trial-workers warm runs autotune's own trial worker; an own command starts fresh each trial")


def uses_warm_workers(request: TuneRequest) -> bool:
    """Warm workers unless asked for fresh processes (see SearchAsk.trial_workers); the rule is the launcher
    chooser's (trial/launch/chooser.py)."""
    return uses_warm(
        nodes=request.hardware.nodes,
        own_command=request.training.command is not None,
        trial_workers=request.search.trial_workers,
    )


def confirms_pick_in_fresh_process(request: TuneRequest) -> bool:
    """By default on GPUs, where warm workers run the trials: the pick once more in a process of its own."""
    own, workers = request.training.command is not None, request.search.trial_workers
    return confirms_fresh(
        nodes=request.hardware.nodes, own_command=own, trial_workers=workers, device=request.hardware.device
    )


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
    fixed = (request.search.micro_batch,) if request.search.micro_batch is not None else None
    grid = list(fixed or request.search.micro_batches or range(1, request.search.max_micro_batch + 1))
    if request.training.global_batch is None:
        return sorted(set(grid))
    per_rank, remainder = divmod(request.training.global_batch, world_size)
    if remainder or per_rank == 0:
        raise UserError(
            f"--global-batch {request.training.global_batch} is not a multiple of the world size {world_size}"
        )
    if fixed is None and request.search.micro_batches is None:
        grid = [d for d in range(1, min(per_rank, request.search.max_micro_batch) + 1) if per_rank % d == 0]
    eligible = sorted({m for m in grid if per_rank % m == 0})
    if not eligible:
        raise UserError(
            f"no micro-batch in {grid} gives a whole gradient accumulation for global batch"
            f" {request.training.global_batch} at world size {world_size}"
        )
    return eligible


def chosen_rungs(request: TuneRequest) -> tuple[list[Rung], list[tuple[Rung, str]]]:
    """The rungs to search, and those left out with the reason (NVMe rungs need --nvme-path)."""
    chosen = list(request.search.rungs or Rung)
    unavailable = (
        [(r, "no --nvme-path given") for r in chosen if r.needs_nvme] if not request.hardware.nvme_path else []
    )
    return [r for r in chosen if not any(r is u for u, _ in unavailable)], unavailable


def with_tune_time_budget(request: TuneRequest) -> TuneRequest:
    """`autotune tune`'s request with its default time budget: CPU_TUNE_TIME_BUDGET_S on the CPU backend when none was
    given, none on GPUs (see CPU_TUNE_TIME_BUDGET_S)."""
    if request.search.time_budget_s is not None or request.hardware.device != "cpu":
        return request
    return request.updated(time_budget_s=CPU_TUNE_TIME_BUDGET_S)
