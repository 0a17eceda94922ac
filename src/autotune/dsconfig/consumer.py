"""Who reads the config, and what it looks like once HF Trainer or accelerate has filled its "auto".

HF Trainer and accelerate do not fill "auto" everywhere: each fills a fixed set of keys, and
accelerate's `deepspeed_config_process` raises ValueError for any other "auto" when the model is
prepared. Rather than copying those lists (they change between versions), the fill is run with the
installed libraries' own code, in the order a training run calls it:

1. transformers `HfTrainerDeepSpeedConfig.trainer_config_process(args)` (TrainingArguments.__post_init__);
2. accelerate `DeepSpeedPlugin(hf_ds_config=...)` and `set_mixed_precision` (accelerate/utils/dataclasses.py);
3. transformers `trainer_config_finalize(args, model, steps)` (deepspeed_init, at train());
4. accelerate `deepspeed_config_process(must_match=False, **kwargs)` with the kwargs that
   `Accelerator._prepare_deepspeed` builds (accelerate/accelerator.py), repeated here because they
   are built inline there.

Steps 1 and 3 run only for the HF Trainer. The TrainingArguments stand-in takes every value the
config states (a run whose arguments contradict its config fails in HF's own check, which is the
user's launch script, not the config) and TrainingArguments' own defaults for the rest.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

from autotune.dsconfig.loading import LoadedConfig
from autotune.errors import UserError

PLACEHOLDER_HIDDEN_SIZE = 1024  # stands in for model.config.hidden_size; only sizes buckets HF fills
PLACEHOLDER_TRAINING_STEPS = 1000  # stands in for num_training_steps; only fills scheduler step counts
PLACEHOLDER_DATALOADER_BATCH = 8  # accelerate without Trainer: the DataLoader's batch size (its own default)
_NOT_FOUND_IN_KWARGS = re.compile(r"`([^`]+)` not found in kwargs")


class Consumer(str, Enum):
    DEEPSPEED = "deepspeed"  # deepspeed.initialize(config=...) or the deepspeed launcher
    HF_TRAINER = "hf-trainer"  # transformers Trainer with TrainingArguments(deepspeed=...)
    ACCELERATE = "accelerate"  # accelerate launch / Accelerator with a DeepSpeedPlugin, no Trainer

    @property
    def label(self) -> str:
        return {"deepspeed": "DeepSpeed directly", "hf-trainer": "HF Trainer", "accelerate": "accelerate"}[self.value]

    @property
    def fills_auto(self) -> bool:
        return self is not Consumer.DEEPSPEED


def has_auto(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_auto(item) for item in value.values())
    if isinstance(value, list):
        return any(has_auto(item) for item in value)
    return value == "auto"


def detect_consumer(loaded: LoadedConfig, requested: str | None) -> tuple[Consumer, str]:
    """The consumer, and one line saying why it was chosen."""
    if requested and requested != "auto":
        return Consumer(requested), f"consumer: {Consumer(requested).label} (--consumer {requested})"
    if loaded.accelerate is not None:
        return Consumer.ACCELERATE, f"consumer: accelerate (an accelerate config: {loaded.accelerate.path})"
    if has_auto(loaded.config):
        return (
            Consumer.HF_TRAINER,
            'consumer: HF Trainer, assumed because the config has "auto" values '
            "(--consumer deepspeed|accelerate to say otherwise)",
        )
    return Consumer.DEEPSPEED, 'consumer: DeepSpeed directly (no "auto" values; --consumer hf-trainer to say otherwise)'


@dataclass
class FillOutcome:
    filled: dict[str, Any]  # the config as DeepSpeed receives it
    unfilled: list[str] = field(default_factory=list)  # "auto" paths the consumer refuses to fill
    refusal: str = ""  # the consumer's own error (HF's mismatch check, accelerate's plugin checks)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _get(config: dict[str, Any], dotted_path: str) -> Any:
    node: Any = config
    for key in dotted_path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _remove(config: dict[str, Any], dotted_path: str) -> None:
    *parents, last = dotted_path.split(".")
    node: Any = config
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def _training_arguments(config: dict[str, Any], world_size: int) -> SimpleNamespace:
    """A TrainingArguments stand-in: the config's stated values, the installed TrainingArguments' defaults
    otherwise (its own dataclass fields, so a field an older or newer transformers reads is there)."""
    from transformers import TrainingArguments

    defaults = {
        f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.default is not dataclasses.MISSING
    }
    micro, steps, total = (
        config.get(k) for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
    )
    steps = steps if isinstance(steps, int) and not isinstance(steps, bool) else defaults["gradient_accumulation_steps"]
    if not (isinstance(micro, int) and not isinstance(micro, bool)):
        per_step = world_size * steps
        micro = total // per_step if isinstance(total, int) and per_step and total % per_step == 0 and total else None
        micro = micro or defaults["per_device_train_batch_size"]
    lr = _get(config, "optimizer.params.lr")
    lr = lr if _number(lr) else _get(config, "scheduler.params.warmup_max_lr")
    betas = _get(config, "optimizer.params.betas")
    betas = betas if isinstance(betas, list) and len(betas) == 2 else [defaults["adam_beta1"], defaults["adam_beta2"]]
    warmup = _get(config, "scheduler.params.warmup_num_steps")
    clipping, eps, decay = (
        config.get("gradient_clipping"),
        _get(config, "optimizer.params.eps"),
        _get(config, "optimizer.params.weight_decay"),
    )
    # Every TrainingArguments default first: the transformers release installed may read a field this module
    # does not set (4.x reads fp16_backend; integrations/deepspeed.py's trainer_config_process).
    stated = dict(
        world_size=world_size,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=steps,
        max_grad_norm=clipping if _number(clipping) else defaults["max_grad_norm"],
        learning_rate=lr if _number(lr) else defaults["learning_rate"],
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_epsilon=eps if _number(eps) else defaults["adam_epsilon"],
        weight_decay=decay if _number(decay) else defaults["weight_decay"],
        save_on_each_node=False,
        fp16=_get(config, "fp16.enabled") is True,
        bf16=_get(config, "bf16.enabled") is True,
        fp16_full_eval=False,
        bf16_full_eval=False,
        get_warmup_steps=lambda _steps: warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else 0,
    )
    return SimpleNamespace(**{**defaults, **stated})


def _prepare_kwargs(config: dict[str, Any], micro: Any, processes: int) -> dict[str, Any]:
    """The kwargs Accelerator._prepare_deepspeed passes to deepspeed_config_process (accelerate 1.x)."""
    kwargs: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    steps = config.get("gradient_accumulation_steps")
    if _number(micro) and _number(steps):
        kwargs["train_micro_batch_size_per_gpu"] = micro
        kwargs["train_batch_size"] = micro * steps * processes
    hidden = PLACEHOLDER_HIDDEN_SIZE
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        if _get(config, f"zero_optimization.{key}") == "auto":
            kwargs.update(
                {
                    "zero_optimization.reduce_bucket_size": hidden * hidden,
                    "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                    "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
                }
            )
    if "optimizer" in config:  # DummyOptim(params, lr=0.001, weight_decay=0) unless the code passes values
        lr = _get(config, "optimizer.params.lr")
        decay = _get(config, "optimizer.params.weight_decay")
        kwargs["optimizer.params.lr"] = lr if _number(lr) else 0.001
        kwargs["optimizer.params.weight_decay"] = decay if _number(decay) else 0
    if "scheduler" in config:  # DummyScheduler, assumed given total_num_steps by the training code
        kwargs.update(
            {
                "scheduler.params.warmup_min_lr": 0,
                "scheduler.params.warmup_max_lr": kwargs.get("optimizer.params.lr", 0.001),
                "scheduler.params.warmup_num_steps": 1,
                "scheduler.params.total_num_steps": PLACEHOLDER_TRAINING_STEPS,
            }
        )
    return kwargs


def accelerate_mixed_precision(config: dict[str, Any], loaded_precision: str | None = None) -> str:
    """accelerate's mixed_precision for `config`: the YAML's when it names one, else what the config enables."""
    if loaded_precision and loaded_precision != "no":
        return loaded_precision
    if _get(config, "bf16.enabled") is True:
        return "bf16"
    if _get(config, "fp16.enabled") is True:
        return "fp16"
    return "no"


def _without_accelerate_env() -> dict[str, str]:
    """The environment minus ACCELERATE_*: the check must not depend on the shell it runs in."""
    return {key: value for key, value in os.environ.items() if not key.startswith("ACCELERATE_")}


def fill_like_consumer(
    config: dict[str, Any], consumer: Consumer, world_size: int, mixed_precision: str | None = None
) -> FillOutcome:
    """Run the consumer's own "auto" filling on a copy of `config` (see the module docstring)."""
    if not consumer.fills_auto:
        return FillOutcome(filled=copy.deepcopy(config))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from accelerate.utils import DeepSpeedPlugin
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError as error:  # accelerate is a dependency; an install without it cannot fill "auto"
        raise UserError(
            f'checking a config as {consumer.label} reads it runs its "auto" filling, which needs '
            f"{error.name or 'accelerate'} ({error}): pip install 'accelerate>=1.6.0', "
            "or --consumer deepspeed for a config DeepSpeed reads directly"
        ) from None

    saved_reference = hf_deepspeed._hf_deepspeed_config_weak_ref  # HfDeepSpeedConfig sets a module global
    outcome = FillOutcome(filled=copy.deepcopy(config))
    try:
        with mock.patch.dict(os.environ, _without_accelerate_env(), clear=True):
            outcome = _fill(
                copy.deepcopy(config),
                consumer,
                world_size,
                mixed_precision,
                hf_deepspeed=hf_deepspeed,
                plugin_class=DeepSpeedPlugin,
            )
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved_reference
    return outcome


def _fill(
    config: dict[str, Any],
    consumer: Consumer,
    world_size: int,
    mixed_precision: str | None,
    hf_deepspeed: ModuleType,
    plugin_class: type,
) -> FillOutcome:
    args = _training_arguments(config, world_size)
    outcome = FillOutcome(filled=config)
    try:
        if consumer is Consumer.HF_TRAINER:
            holder = hf_deepspeed.HfTrainerDeepSpeedConfig(config)
            holder.trainer_config_process(args)
            precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "no"
        else:
            from accelerate.utils.deepspeed import HfDeepSpeedConfig

            holder = HfDeepSpeedConfig(config)
            precision = accelerate_mixed_precision(config, mixed_precision)
        outcome.filled = holder.config
        plugin = plugin_class(hf_ds_config=holder)
        plugin.set_mixed_precision(precision)
        if consumer is Consumer.HF_TRAINER:
            model = SimpleNamespace(config=SimpleNamespace(hidden_size=PLACEHOLDER_HIDDEN_SIZE))
            steps = _get(config, "scheduler.params.total_num_steps")
            holder.trainer_config_finalize(args, model, steps if _number(steps) else PLACEHOLDER_TRAINING_STEPS)
        micro = holder.config.get("train_micro_batch_size_per_gpu")
        if consumer is Consumer.ACCELERATE and micro == "auto":
            micro = PLACEHOLDER_DATALOADER_BATCH
        plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=1)
        kwargs = _prepare_kwargs(holder.config, micro, world_size)
        _process_all(plugin, holder.config, kwargs, outcome)
    except ValueError as error:
        outcome.refusal = " ".join(str(error).split())
    return outcome


def _process_all(plugin: Any, config: dict[str, Any], kwargs: dict[str, Any], outcome: FillOutcome) -> None:
    """accelerate stops at the first "auto" it cannot fill; note it, drop it, and go on to find all."""
    for _ in range(256):
        try:
            plugin.deepspeed_config_process(must_match=False, **kwargs)
            return
        except ValueError as error:
            match = _NOT_FOUND_IN_KWARGS.search(str(error))
            if match is None:
                raise
            outcome.unfilled.append(match.group(1))
            _remove(config, match.group(1))
