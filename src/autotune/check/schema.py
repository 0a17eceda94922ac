"""Which config keys the installed DeepSpeed knows, taken from DeepSpeed itself so it never drifts.

Two sources, because DeepSpeed reads its config in two ways:
- Sections parsed by pydantic models (zero_optimization, fp16, ...): the model's `model_fields`, with
  aliases (`stage3_*` are aliases). DeepSpeed rejects unknown keys there.
- The top level and the sections read as plain dicts (optimizer, activation_checkpointing, aio, ...):
  the keys `DeepSpeedConfig` looks up while parsing, recorded by handing it a dict that notes every
  lookup. DeepSpeed ignores every other key there, silently. The constants modules cannot answer this:
  they mix top-level keys with nested ones and with values ("mean", "nccl"), and miss sections
  parsed by models (zero_optimization, tensorboard, compile).
"""

from __future__ import annotations

import copy
import importlib
import io
import logging
import types
from collections.abc import Iterator, KeysView
from contextlib import contextmanager, redirect_stdout
from functools import cache
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin
from unittest import mock

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from autotune.infra.environment import parse_without_device

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_values  # what dict.items() and dict.values() return

# Read by deepspeed.initialize() (deepspeed/__init__.py, mesh set-up) rather than by DeepSpeedConfig.
_READ_BY_INITIALIZE = ("data_parallel_size", "sequence_parallel_size")

Path = tuple[str, ...]


class _LookupView(KeysView[str]):
    """`key in d.keys()` is a lookup; iterating the keys means the whole dict is consumed."""

    def __init__(self, recording: _RecordingDict) -> None:
        super().__init__(recording)
        self._recording = recording

    def __contains__(self, key: object) -> bool:
        return key in self._recording

    def __iter__(self) -> Iterator[str]:
        self._recording.consumed_whole = True
        return super().__iter__()


class _RecordingDict(dict[str, Any]):
    """A dict that notes which keys are looked up, and whether someone took all of them.

    It holds a deep copy: DeepSpeed's parser writes into nested sections (0.17.6 runtime/config.py:999 sets
    optimizer.params.max_grad_norm to 0.0 in FP32 mode), which must not reach the user's config or --fix output.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(copy.deepcopy(data))
        self.looked_up: set[str] = set()
        self.consumed_whole = False

    def get(self, key: str, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):  # a config's keys are strings: another type is never one of them
            self.looked_up.add(key)
        return super().__contains__(key)

    # dict_keys cannot be subclassed or built: a view that records lookups is a KeysView, which typeshed's
    # dict.keys() (-> dict_keys) does not accept as an override.
    def keys(self) -> _LookupView:  # type: ignore[override]
        return _LookupView(self)

    def __iter__(self) -> Iterator[str]:
        self.consumed_whole = True
        return super().__iter__()

    def items(self) -> dict_items[str, Any]:
        self.consumed_whole = True
        return super().items()

    def values(self) -> dict_values[str, Any]:
        self.consumed_whole = True
        return super().values()


class _RecordsHandler(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(level=logging.WARNING)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def deepspeed_log_captured() -> Iterator[list[logging.LogRecord]]:
    """Collect DeepSpeed's warnings instead of printing them.

    DeepSpeed's logger writes to the stdout it saw at import, past redirect_stdout, which would
    break --json output; its warnings are worth reporting as findings anyway.
    """
    parse_without_device()
    from deepspeed.utils import logger

    records: list[logging.LogRecord] = []
    saved = logger.handlers[:]
    logger.handlers = [_RecordsHandler(records)]
    try:
        yield records
    finally:
        logger.handlers = saved


def _parse_quietly(config: dict[str, Any]) -> bool:
    """Run DeepSpeedConfig on `config` at world size 1; True when it parsed."""
    parse_without_device()  # parsing needs no device; never touch CUDA here
    from deepspeed.runtime import config as ds_config_module

    try:
        with (
            deepspeed_log_captured(),
            mock.patch.object(ds_config_module.dist, "get_world_size", return_value=1),
            mock.patch.object(ds_config_module.dist, "get_rank", return_value=0),
            redirect_stdout(io.StringIO()),
        ):
            ds_config_module.DeepSpeedConfig(config)
    except Exception:  # any refusal: the caller only wants the lookups made so far
        return False
    return True


@cache
def top_level_keys() -> frozenset[str]:
    """Every top-level key DeepSpeed reads, minus the removed ones it refuses."""
    recorder = _RecordingDict({"train_batch_size": 1})
    _parse_quietly(recorder)
    known = recorder.looked_up | set(_READ_BY_INITIALIZE)
    return frozenset(known - set(removed_top_level_keys()))


def removed_top_level_keys() -> dict[str, str]:
    """Keys DeepSpeed now refuses, with its own explanation."""
    from deepspeed.runtime import config as ds_config_module

    return dict(getattr(ds_config_module, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))


def removed_zero_keys() -> dict[str, str]:
    from deepspeed.runtime import config as ds_config_module

    return dict(getattr(ds_config_module, "_REMOVED_ZERO_CONFIG_KEYS", {}))


def plain_section_keys(section: str, value: dict[str, Any]) -> frozenset[str] | None:
    """Keys DeepSpeedConfig looks up in a plain-dict section, given the user's own section.

    None when that cannot be told: the parse failed part-way, nothing was looked up, or DeepSpeed
    took the whole dict (iterated or copied it), so every key may be used.
    """
    recorder = _RecordingDict(value)
    parsed = _parse_quietly({"train_batch_size": 1, section: recorder})
    if not parsed or recorder.consumed_whole or not recorder.looked_up:
        return None
    return frozenset(recorder.looked_up)


# Top-level sections DeepSpeed parses with a pydantic model: (section key, module, model). A release that lacks the
# module or the model (deepspeed.compile and runtime/tensor_parallel/config.py are newer than 0.15) parses that
# section some other way or not at all, so it is left out there.
_SECTION_MODELS = (
    ("zero_optimization", "deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    ("fp16", "deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    ("bf16", "deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    ("bfloat16", "deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),  # BFLOAT16_OLD
    ("comms_logger", "deepspeed.comm.config", "CommsLoggerConfig"),
    ("compile", "deepspeed.compile.config", "CompileConfig"),  # runtime/config.py: CompileConfig(**...)
    ("hybrid_engine", "deepspeed.runtime.config", "HybridEngineConfig"),  # get_hybrid_engine_config
    ("tensor_parallel", "deepspeed.runtime.tensor_parallel.config", "TPTrainingConfig"),  # get_tensor_parallel_config
    ("weight_quantization", "deepspeed.inference.config", "WeightQuantConfig"),
)


def _installed_model(module: str, name: str) -> type[BaseModel] | None:
    """The installed DeepSpeed's model `module.name`, None when this release has no such module or model."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


@cache
def section_models() -> dict[str, type[BaseModel]]:
    """Top-level sections that the installed DeepSpeed parses with a pydantic model (extra keys are refused)."""
    parse_without_device()
    from deepspeed.monitor.config import DeepSpeedMonitorConfig

    models: dict[str, type[BaseModel]] = {}
    for key, module, name in _SECTION_MODELS:
        model = _installed_model(module, name)
        if model is not None:
            models[key] = model
    # tensorboard, wandb, csv_monitor, comet: each top-level key is a field of the monitor model.
    for name in DeepSpeedMonitorConfig.model_fields:
        nested = model_of(DeepSpeedMonitorConfig.model_fields[name])
        if nested is not None:
            models[name] = nested
    return {key: model for key, model in models.items() if key in top_level_keys()}


def model_of(field: FieldInfo) -> type[BaseModel] | None:
    """The pydantic model a field holds (unwrapping Optional), or None for scalars and lists."""
    annotation = field.annotation
    candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def model_keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """Accepted spellings of each field: its name and its alias (DeepSpeed populates by either)."""
    keys: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        keys[name] = field
        if field.alias:
            keys[field.alias] = field
    return keys


def field_at(path: Path) -> FieldInfo | None:
    """The pydantic field a config path lands on, e.g. zero_optimization.offload_param.max_in_cpu."""
    if not path or path[0] not in section_models():
        return None
    model: type[BaseModel] | None = section_models()[path[0]]
    field: FieldInfo | None = None
    for key in path[1:]:
        if model is None:
            return None
        field = model_keys(model).get(key)
        if field is None:
            return None
        model = model_of(field)
    return field


def model_at(path: Path) -> type[BaseModel] | None:
    """The pydantic model that validates the dict at `path` (a section or a nested section)."""
    if not path or path[0] not in section_models():
        return None
    model: type[BaseModel] | None = section_models()[path[0]]
    for key in path[1:]:
        field = model_keys(model).get(key) if model is not None else None
        if field is None:
            return None
        model = model_of(field)
    return model


def deprecated_replacement(field: FieldInfo) -> str | None:
    """For a deprecated field, the field that replaces it (DeepSpeed's own metadata)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if not extra.get("deprecated"):
        return None
    return str(extra.get("new_param") or "")


def field_default(field: FieldInfo) -> Any:
    """The default DeepSpeed uses when a field is absent (or dropped because it was "auto")."""
    if field.is_required():
        return None
    return field.get_default(call_default_factory=True)


@cache
def _plain_sections() -> dict[str, frozenset[str]]:
    """Plain-dict sections and the keys DeepSpeed looks up in them when they are empty."""
    sections: dict[str, frozenset[str]] = {}
    for section in sorted(top_level_keys() - set(section_models())):
        keys = plain_section_keys(section, {})
        if keys:
            sections[section] = keys
    return sections


def owning_sections(key: str) -> list[str]:
    """Top-level sections that accept `key`: where a misplaced top-level key belongs.

    Legacy spellings of a section (bfloat16 for bf16) share a model and count once.
    """
    owners: list[str] = []
    seen_models: set[type[BaseModel]] = set()
    for section, model in section_models().items():
        if key in model_keys(model) and model not in seen_models:
            owners.append(section)
        seen_models.add(model)
    owners += [section for section, keys in _plain_sections().items() if key in keys]
    return owners
