"""The tuning report as a typed value: `TuneReport`, written as autotune-report.json and stored in the results cache.

Every part with a fixed shape is a frozen dataclass here (the choice, each trial, each skipped rung, each mode,
the verdict, the host need, the batch, the training choices, the own command, the assumptions); genuinely free
parts stay JSON objects (the model and target summaries, the plan, the calibration, a LoRA record). `to_json`
gives the dict written to disk, key for key and in the order earlier versions wrote it; `from_json` reads one
back strictly: a missing or unknown key, or a value of the wrong type, raises `MalformedReportError`, so a stored
copy from another version is refused (the results cache then tunes again) instead of half-read.

A field marked `OMITTED_WHEN_NONE` is absent from the JSON when None (the parts only a finished tuning has:
batch, training, own_command; and the picture, which `write_report` adds), as earlier versions wrote it.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import Field, dataclass, field, fields, is_dataclass, replace
from enum import Enum
from functools import cache
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import TypeAdapter, ValidationError

from autotune.core.choices import Attention, Device, Kernels, Precision
from autotune.core.ladder import Candidate, Mode, parse_rung
from autotune.core.stop import StopReason
from autotune.dsconfig.launchers import LaunchCommands
from autotune.errors import MalformedReportError
from autotune.trial.trial_types import TrialResult

__all__ = [
    "Assumptions",
    "Batch",
    "Choice",
    "HostNeed",
    "MalformedReportError",
    "ModeEntry",
    "OwnCommand",
    "Picture",
    "Skipped",
    "SpeedEntry",
    "Training",
    "TrialEntry",
    "TuneReport",
    "VerdictEntry",
]

R = TypeVar("R", bound="JsonRecord")
OMITTED_WHEN_NONE = {"omitted_when_none": True}


def _omitted_when_none(item: Field[Any]) -> bool:
    return bool(item.metadata.get("omitted_when_none"))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fail(where: str, what: str) -> MalformedReportError:
    return MalformedReportError(f"report {where}: {what}")


def _to_json(value: Any) -> Any:
    """A field's value as JSON: records as objects, tuples as lists, enums by value, the others as they write
    themselves."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (Candidate, Mode, TrialResult, LaunchCommands)):  # their own JSON, read back by _parse
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def _parse_candidate(value: Any, where: str) -> Candidate:
    """A candidate exactly as `Candidate.to_dict` writes it: no key missing, none unknown, every type right."""
    if not isinstance(value, dict):
        raise _fail(where, f"expected a candidate object, got {type(value).__name__}")
    _check_keys(value, {"rung", "micro_batch", "grad_checkpointing"}, {"mode"}, where)
    micro_batch = _parse(value["micro_batch"], int, f"{where}.micro_batch")
    checkpointing = _parse(value["grad_checkpointing"], bool, f"{where}.grad_checkpointing")
    rung = _parse(value["rung"], str, f"{where}.rung")
    mode = _parse(value["mode"], Mode, f"{where}.mode") if "mode" in value else Mode()
    try:
        candidate = Candidate(parse_rung(rung), micro_batch, checkpointing, mode)
    except ValueError as error:  # an unknown rung
        raise _fail(where, str(error)) from None
    if candidate.to_dict() != value:
        raise _fail(where, "a classic mode written out, or a candidate that does not read back as written")
    return candidate


def _parse_mode(value: Any, where: str) -> Mode:
    if not isinstance(value, dict):
        raise _fail(where, f"expected a mode object, got {type(value).__name__}")
    names = {item.name for item in fields(Mode)}
    _check_keys(value, names, set(), where)
    hints = _hints(Mode)
    return Mode(**{name: _parse(value[name], hints[name], f"{where}.{name}") for name in names})


@cache
def _trial_result_schema() -> TypeAdapter[TrialResult]:
    """Built once, on the first report read back (building it costs a few milliseconds)."""
    return TypeAdapter(TrialResult)


def _parse_trial_result(value: Any, where: str) -> TrialResult:
    """A trial's result through its pydantic schema (strict, as the results cache reads it), then compared with
    what it writes back, so an unknown, missing or coerced value is refused rather than dropped or changed."""
    try:
        result = _trial_result_schema().validate_json(json.dumps(value), strict=True)
    except (ValidationError, TypeError, ValueError) as error:
        raise _fail(where, f"not a trial result ({str(error).splitlines()[0]})") from None
    if result.to_dict() != value:
        raise _fail(where, "a trial result with keys or values it would not write back")
    return result


_LEAVES = {Candidate: _parse_candidate, Mode: _parse_mode, TrialResult: _parse_trial_result}


def _parse(value: Any, hint: Any, where: str) -> Any:
    """`value` read as `hint`, strictly: JSON numbers are not bools, ints are not strings; a float field takes an
    int as written (so writing it back gives the same JSON)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        others = [arg for arg in args if arg is not type(None)]
        if len(others) != 1:
            raise TypeError(f"report field type {hint} is not `X | None`")  # a programming error, not bad data
        return _parse(value, others[0], where)
    if hint in _LEAVES:
        return _LEAVES[hint](value, where)
    if isinstance(hint, type) and issubclass(hint, JsonRecord):
        return hint.from_json(value, where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            raise _fail(where, f"{value!r} is not a {hint.__name__}") from None
    if isinstance(hint, type) and is_dataclass(hint):
        return _parse_dataclass(hint, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise _fail(where, f"expected a list, got {type(value).__name__}")
        return tuple(_parse(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _fail(where, f"expected an object, got {type(value).__name__}")
        return {k: _parse(v, args[1], f"{where}.{k}") for k, v in value.items()}
    return _parse_scalar(value, hint, where)


def _parse_scalar(value: Any, hint: Any, where: str) -> Any:
    if get_origin(hint) is Literal:  # one of the string choices (autotune.core.choices)
        if type(value) is not str or value not in get_args(hint):
            raise _fail(where, f"expected one of {', '.join(get_args(hint))}, got {value!r}")
        return value
    if hint is float:
        ok = type(value) in (int, float)
    elif hint in (int, bool, str):
        ok = type(value) is hint
    else:
        raise TypeError(f"report field type {hint!r} has no reader")  # a programming error, not bad data
    if not ok:
        raise _fail(where, f"expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def _check_keys(value: dict, required: set[str], optional: set[str], where: str) -> None:
    if missing := required - set(value):
        raise _fail(where, f"missing {', '.join(sorted(missing))}")
    if unknown := set(value) - required - optional:
        raise _fail(where, f"unknown {', '.join(sorted(unknown))}")


def _parse_dataclass(cls: type, value: Any, where: str) -> Any:
    """Any dataclass whose JSON is its fields by name (a record, or one like LaunchCommands)."""
    if not isinstance(value, dict):
        raise _fail(where, f"expected an object, got {type(value).__name__}")
    every = fields(cls)
    optional = {item.name for item in every if _omitted_when_none(item)}
    _check_keys(value, {item.name for item in every} - optional, optional, where)
    if nulls := sorted(name for name in optional if name in value and value[name] is None):
        raise _fail(where, f"{', '.join(nulls)} written as null: such a part is absent when there is none")
    hints = _hints(cls)
    return cls(**{item.name: _parse(value[item.name], hints[item.name], f"{where}.{item.name}")
                  for item in every if item.name in value})  # fmt: skip


class JsonRecord:
    """A frozen, keyword-only dataclass (built once, field by field by name) written as a JSON object of its
    fields in their order, and read back strictly."""

    def to_json(self) -> dict[str, Any]:
        out = {}
        for item in fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if value is None and _omitted_when_none(item):
                continue
            out[item.name] = _to_json(value)
        return out

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        """Raises MalformedReportError on a missing or unknown key or a value of the wrong type."""
        return _parse_dataclass(cls, data, where or cls.__name__)


@dataclass(frozen=True, kw_only=True)
class Assumptions(JsonRecord):
    """What the tuning assumed (context.TuneContext.assumptions): `autotune check` and a later `plan` ask the same."""

    model: str
    model_fingerprint: str
    seq_len: int
    precision: Precision
    attention: Attention
    grad_checkpointing: bool | None
    gpus_per_node: int
    nodes: int
    gpu_type: str | None
    gpu_memory: str | None
    memory_bytes_per_rank: int
    device: Device
    headroom: float
    trust_remote_code: bool
    optimizer: str
    lora_rank: int | None
    lora_targets: tuple[str, ...] | None
    decoder_seq_len: int | None
    kernels: Kernels


@dataclass(frozen=True, kw_only=True)
class Choice(JsonRecord):
    """The pick: its candidate's fields at the top (as `Candidate.to_dict` writes them), then what it measured."""

    candidate: Candidate
    description: str
    samples_per_s: float | None
    tokens_per_s: float | None
    peak_bytes: int | None
    predicted_peak_bytes: int
    # True: peak_bytes is the pick's trial in a fresh process (its confirmation, or its own trial where that was the
    # first its processes ran), the other trials having run in warm workers (search.walk.Search.confirm_fresh);
    # None: the pick's peak was measured the way every trial was
    peak_in_fresh_process: bool | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    # The pick's fastest single trial, where it differs from samples_per_s (the speed its verdict was decided on,
    # tuning/tuning_report.py pick_speed): kept under its own name, never quoted as the pick's speed
    fastest_trial_samples_per_s: float | None = field(default=None, metadata=OMITTED_WHEN_NONE)

    def to_json(self) -> dict[str, Any]:
        return {**self.candidate.to_dict(), **{k: v for k, v in super().to_json().items() if k != "candidate"}}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Choice:
        where = where or "Choice"
        if not isinstance(data, dict):
            raise _fail(where, f"expected an object, got {type(data).__name__}")
        keys = ("rung", "micro_batch", "grad_checkpointing", "mode")
        candidate = _parse_candidate({k: v for k, v in data.items() if k in keys}, where)
        rest = {k: v for k, v in data.items() if k not in keys}
        return _parse_dataclass(cls, {"candidate": candidate.to_dict(), **rest}, where)


@dataclass(frozen=True, kw_only=True)
class HostNeed(JsonRecord):
    """What the pick needs from each node's host: RAM (measured on GPU trials, else predicted), pinned, NVMe."""

    ram_bytes: int
    measured: bool
    pinned_bytes: int
    nvme_bytes: int


@dataclass(frozen=True, kw_only=True)
class TrialEntry(JsonRecord):
    """One trial as the report states it (search.TrialRecord.to_dict)."""

    candidate: Candidate
    result: TrialResult
    predicted_peak_bytes: int
    limit_bytes: int
    within_headroom: bool
    host_peak_bytes: int | None
    host_limit_bytes: int | None
    from_cache: bool
    purpose: str


@dataclass(frozen=True, kw_only=True)
class Skipped(JsonRecord):
    """A rung (or a mode on it) the search did not try, and why (search.SkipRecord.to_dict)."""

    rung: str
    grad_checkpointing: bool
    reason: str
    mode: Mode | None = field(default=None, metadata=OMITTED_WHEN_NONE)  # only a modern mode is written


@dataclass(frozen=True, kw_only=True)
class ModeEntry(JsonRecord):
    """One modern memory mode considered on one rung, and what the search did with it (search_modes.ModeRecord)."""

    rung: str
    mode: Mode
    label: str
    applies: bool
    reason: str
    trial_verifiable: bool
    status: str
    detail: str
    predicted_peak_bytes: int | None
    micro_batch: int | None
    grad_checkpointing: bool | None
    samples_per_s: float | None
    trials: int


@dataclass(frozen=True, kw_only=True)
class SpeedEntry(JsonRecord):
    """A measured speed with its spread (measurement.Speed.to_dict)."""

    samples_per_s: float
    interval: tuple[float, ...]
    steps: int
    median_s: float
    interval_s: tuple[float, ...]
    confidence: float
    iqr_s: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class VerdictEntry(JsonRecord):
    """The pick against its runner-up: margin, spread, tie or not (search.records.Verdict.to_dict)."""

    pick: Candidate
    speed: SpeedEntry
    runner_up: Candidate | None
    runner_up_speed: SpeedEntry | None
    margin: float | None
    spread: float
    tie: bool
    remeasured: bool


@dataclass(frozen=True, kw_only=True)
class Batch(JsonRecord):
    """The global batch per optimizer step and how it was decided (batch.GlobalBatch.to_dict)."""

    global_batch: int
    micro_batch: int
    accumulation: int
    world_size: int
    seq_len: int
    chosen_by: str
    how: str
    tokens_per_step: int
    pin: str


@dataclass(frozen=True, kw_only=True)
class Training(JsonRecord):
    """The optimizer and LoRA the trials trained with (training_choices.training_choices_report)."""

    optimizer: str
    lora: dict[str, Any] | None
    summary: str


@dataclass(frozen=True, kw_only=True)
class OwnCommand(JsonRecord):
    """Own-command mode: the user's command template and the command to train with (trial/script_mode.py)."""

    template: tuple[str, ...]
    form: str
    placeholders: tuple[str, ...]
    arg_mappings: dict[str, str]
    metric: str
    train_command: str


@dataclass(frozen=True, kw_only=True)
class Picture(JsonRecord):
    """autotune-report.png and the markdown line that shows it (or says why there is none)."""

    path: str | None
    markdown: str


@dataclass(frozen=True, kw_only=True)
class TuneReport(JsonRecord):
    """Everything one tuning found and decided; autotune-report.json is `to_json()` of it."""

    model: dict[str, Any]  # models.ModelSummary.to_dict without its config
    target: dict[str, Any]  # hardware.Target.to_dict
    target_description: str
    device: Device
    verified: bool
    seq_len: int
    precision: Precision
    world_size: int
    global_batch: int | None
    headroom: float
    limit_bytes: int
    assumptions: Assumptions
    notes: tuple[str, ...]
    micro_batch_grid: tuple[int, ...]
    choice: Choice | None
    config_path: str | None
    base_config: str | None  # the user's config the tuned one was built on (autotune.dsconfig.base_config)
    hf_config_path: str | None
    launch: LaunchCommands | None
    trials: tuple[TrialEntry, ...]
    skipped: tuple[Skipped, ...]
    trials_launched: int
    process_starts: int | None  # None: one process per trial
    launches_by_purpose: dict[str, int]
    stop_reason: StopReason
    stop_message: str
    margin: float | None  # best vs runner-up after re-measuring close calls
    noise: float | None
    verdict: VerdictEntry | None
    host_need: HostNeed | None
    calibration: dict[str, Any] | None  # estimate.types.Calibration, as written
    modes: tuple[ModeEntry, ...]  # the modern memory modes considered per rung
    plan: dict[str, Any] | None  # plan-only: estimate.Plan.to_dict
    elapsed_s: float
    versions: dict[str, str]
    from_cache: bool
    nothing_fits_reason: str | None
    batch: Batch | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    training: Training | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    own_command: OwnCommand | None = field(default=None, metadata=OMITTED_WHEN_NONE)
    picture: Picture | None = field(default=None, metadata=OMITTED_WHEN_NONE)  # added by report.write_report

    def with_notes(self, *notes: str) -> TuneReport:
        return replace(self, notes=(*self.notes, *notes))

    @property
    def model_name(self) -> str:
        return str(self.model.get("name", "model"))

    @property
    def measured_peak_bytes(self) -> int | None:
        return self.choice.peak_bytes if self.choice else None
