"""The user's own ds_config as the base of the tuned one (`tune --config base.json`, `hook --config`).

autotune decides memory and parallelism only: the batch split (micro-batch x accumulation, the global batch kept
where the base fixes it) and the ZeRO section (stage, offload, buckets, the modes of modes.applies). Every other
key of the base (optimizer, scheduler, clipping, precision, "auto" values, anything unknown to autotune) is carried
through unchanged and in its order. What the base fixes about the training (its global batch, precision and
optimizer) becomes part of the request, so the search tunes that job and no other.

The file is read by `check`'s reader (autotune.dsconfig.loading.load_config: hjson as DeepSpeed reads it, hostile
input refused with one line).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.core.choices import Precision
from autotune.dsconfig.loading import section_of
from autotune.errors import UserError

# The keys autotune writes over the base's; the rest of the base is the user's training and is kept.
TUNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization")


def on_base(tuned: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """The base with its tuned keys replaced in place; keys only `tuned` has follow (a base's own value wins)."""
    if base is None:
        return dict(tuned)
    merged = {key: tuned[key] if key in TUNED_KEYS else copy.deepcopy(value) for key, value in base.items()}
    for key, value in tuned.items():
        merged.setdefault(key, value)
    return merged


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _enabled(base: Mapping[str, Any], section: str) -> Any:
    value = base.get(section)
    return value.get("enabled") if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class BaseFacts:
    """What a base config fixes about the training; None where it leaves the choice open."""

    global_batch: int | None = None
    precision: Precision | None = None
    optimizer: str | None = None  # an autotune.training.optimizers name, from the base's optimizer section
    notes: list[str] = field(default_factory=list)


def base_facts(base: Mapping[str, Any], world_size: int) -> BaseFacts:
    """The global batch, precision and optimizer the base trains with (DeepSpeed's reading of them)."""
    notes = []
    train_batch = _whole(base.get("train_batch_size"))
    micro, steps = _whole(base.get("train_micro_batch_size_per_gpu")), _whole(base.get("gradient_accumulation_steps"))
    global_batch = train_batch or (micro * steps * world_size if micro and steps else None)
    bf16, fp16 = _enabled(base, "bf16"), _enabled(base, "fp16")
    if bf16 is True and fp16 is True:
        raise UserError("the base config enables both bf16 and fp16; DeepSpeed refuses that")
    precision: Precision | None = "bf16" if bf16 is True else "fp16" if fp16 is True else None
    if precision is None and "auto" not in (bf16, fp16):
        precision = "fp32"
        notes.append(
            "the base config enables neither bf16 nor fp16: tuned for fp32, as DeepSpeed runs it (a launcher that"
            " sets the precision itself: give --precision)"
        )
    optimizer = None
    if isinstance(base.get("optimizer"), Mapping):
        optimizer, note = config_optimizer(dict(base), "adamw")
        notes += [note] if note else []
    return BaseFacts(global_batch, precision, optimizer, notes)


def agreed(name: str, requested: Any, from_base: Any) -> Any:
    """The base's value, unless the command line asks for a different one: then one line, exit 2."""
    if requested is not None and from_base is not None and requested != from_base:
        raise UserError(f"{name} {requested} differs from the base config's {from_base}; give one of them")
    return from_base if from_base is not None else requested


def runnable(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The config as its consumer runs it: "auto" values filled the way HF Trainer fills them
    (check.consumer.fill_like_consumer runs transformers' and accelerate's own code), for the trials and for
    DeepSpeed's parser; a config without "auto" as it is."""
    from autotune.dsconfig.consumer import Consumer, fill_like_consumer, has_auto

    if not has_auto(config):
        return config

    filled = fill_like_consumer(config, Consumer.HF_TRAINER, world_size)
    if filled.refusal:
        raise UserError(f'HF Trainer would refuse the base config\'s "auto" values: {filled.refusal}')
    return filled.filled


def placeholder_notes(config: Mapping[str, Any], base: Mapping[str, Any] | None, measured: bool = True) -> list[str]:
    """The training settings the emitted config leaves to the libraries' defaults because nobody chose them, each
    with its value read from the installed release (autotune.training.job_defaults).
    `measured`: trials ran (else a plan-only answer, which measured nothing)."""
    from autotune.training.job_defaults import job_defaults

    defaults = job_defaults()
    notes = []
    section = config.get("optimizer")
    if isinstance(section, Mapping) and (base is None or "optimizer" not in base):
        given = section_of(dict(section), "params")
        unset = [key for key in ("lr", "betas", "eps", "weight_decay") if key not in given]
        if unset:
            notes.append(
                f"placeholder: optimizer {section.get('type')} is named so DeepSpeed builds the optimizer"
                f" {'the tuning measured' if measured else 'the plan assumed'} (DeepSpeedCPUAdam when offloaded);"
                f" it sets no {', '.join(unset)}, so ds_config.json trains"
                f" with DeepSpeed's defaults {defaults.adam_text()} ({_sources(defaults.fused_adam)}); put yours under"
                " optimizer.params, or tune with --config your_ds_config.json. The .hf.json takes them from"
                f" TrainingArguments: {defaults.trainer_text()}"
            )
    if "gradient_clipping" not in config and defaults.clipping is not None:
        hf = defaults.trainer.get("max_grad_norm")
        notes.append(
            f"no gradient_clipping written: DeepSpeed clips the gradient norm at its default"
            f" {defaults.clipping.value} ({defaults.clipping.source}) unless your config sets it"
            + (f'; the .hf.json\'s "auto" takes --max_grad_norm (default {hf.value})' if hf and base is None else "")
        )
    if "scheduler" not in config:
        schedule = defaults.trainer.get("lr_scheduler_type")
        notes.append(
            "no scheduler written: under ds_config.json the lr stays constant unless your script passes a scheduler"
            " (DeepSpeed builds none without a scheduler section: runtime/engine.py _configure_lr_scheduler)"
            + (
                f"; under HF Trainer the .hf.json follows --lr_scheduler_type (default {schedule.value})"
                if schedule
                else ""
            )
        )
    return notes


def _sources(values: Mapping[str, Any]) -> str:
    files = sorted({value.source.rsplit(":", 1)[0] for value in values.values()})
    return ", ".join(files)


def load_base(path: str) -> dict[str, Any]:
    """The base config as DeepSpeed reads it, through `check`'s reader; a file DeepSpeed would refuse is refused."""
    from autotune.dsconfig.loading import load_config

    loaded = load_config(path)
    if loaded.accelerate is not None:
        raise UserError(f"--config {path} is an accelerate YAML; give the DeepSpeed config file it names")
    if loaded.duplicate_keys:
        raise UserError(f"--config {path} repeats key(s) {', '.join(loaded.duplicate_keys)}; DeepSpeed refuses it")
    return loaded.config


def config_optimizer(config: dict[str, Any], fallback: str) -> tuple[str, str]:
    """(autotune.training.optimizers name, note) for the config's optimizer section. DeepSpeed builds Adam/AdamW itself,
    as torch.optim.AdamW with "torch_adam" (runtime/engine.py `_configure_basic_optimizer`); without a section
    the script's own optimizer runs (HF Trainer: its --optim), which the caller's `fallback` names."""
    section = config.get("optimizer")
    if not isinstance(section, dict):
        return fallback, f"no optimizer section: the script's optimizer runs; sized as {fallback}"
    kind = str(section.get("type", "")).lower()
    params = section_of(section, "params")
    if kind in ("adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam"):
        return ("torch-adamw" if params.get("torch_adam") is True else "adamw"), ""
    return "adamw", f"optimizer {section.get('type')!r} is sized as AdamW (8 bytes of states per parameter)"
