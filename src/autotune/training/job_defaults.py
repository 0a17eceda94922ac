"""What the user's job gets for a key its config leaves out: one source that tune, plan, hook and check share.

A config autotune writes without the user's base names the optimizer ("AdamW", no params), writes no
gradient_clipping and no scheduler; the `.hf.json` beside it leaves those to TrainingArguments ("auto"). What
then trains is decided by the installed libraries' defaults, so they are read from the installed source files, not
remembered: DeepSpeed's GRADIENT_CLIPPING_DEFAULT (runtime/constants.py), the keyword defaults of the Adam
DeepSpeed builds for "AdamW" (FusedAdam, or DeepSpeedCPUAdam under optimizer offload: runtime/engine.py
`get_optimizer_configuration`) and TrainingArguments' field defaults (transformers/training_args.py), which HF's
`trainer_config_process` copies into every "auto" (transformers/integrations/deepspeed.py: max_grad_norm ->
gradient_clipping, learning_rate -> optimizer.params.lr, adam_beta1/2 -> betas, adam_epsilon -> eps,
weight_decay -> weight_decay).

The files are parsed with `ast`, never imported: the planning path does not import torch (README.md of src).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
_TRAINER_KEYS = ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm",
                 "lr_scheduler_type", "warmup_steps")  # fmt: skip


@dataclass(frozen=True)
class SourcedValue:
    """A default and where it is written: `package/relative/file.py:line` of the installed release."""

    value: Any
    source: str


@dataclass(frozen=True)
class JobDefaults:
    """The defaults that apply because a config omits a key; None where the library is not installed."""

    clipping: SourcedValue | None  # DeepSpeed's gradient_clipping when the key is absent
    fused_adam: dict[str, SourcedValue]  # DeepSpeed's "AdamW" without params: lr, betas, eps, weight_decay
    cpu_adam: dict[str, SourcedValue]  # the same under optimizer offload (DeepSpeedCPUAdam)
    trainer: dict[str, SourcedValue]  # TrainingArguments' defaults that fill the .hf.json's "auto"

    def adam_text(self) -> str:
        """`lr 0.001, betas (0.9, 0.999), eps 1e-08, weight_decay 0.0`, FusedAdam's (DeepSpeedCPUAdam's when
        they differ, said separately)."""
        text = _adam_values(self.fused_adam)
        same = {k: v.value for k, v in self.cpu_adam.items()} == {k: v.value for k, v in self.fused_adam.items()}
        if self.cpu_adam and not same:
            text += f" (offloaded, DeepSpeedCPUAdam: {_adam_values(self.cpu_adam)})"
        return text

    def trainer_text(self) -> str:
        """The TrainingArguments flags and defaults that fill the .hf.json's optimizer "auto" values."""
        names = ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay")
        return ", ".join(f"--{name} (default {self.trainer[name].value})" for name in names if name in self.trainer)


def _adam_values(values: dict[str, SourcedValue]) -> str:
    return ", ".join(f"{key} {values[key].value}" for key in _ADAM_KEYS if key in values)


def job_defaults() -> JobDefaults:
    """Read the installed DeepSpeed's and transformers' defaults (a few small files parsed; no import)."""
    return JobDefaults(
        clipping=_module_constant("deepspeed", "runtime/constants.py", "GRADIENT_CLIPPING_DEFAULT"),
        fused_adam=_init_defaults("deepspeed", "ops/adam/fused_adam.py", "FusedAdam", _ADAM_KEYS),
        cpu_adam=_init_defaults("deepspeed", "ops/adam/cpu_adam.py", "DeepSpeedCPUAdam", _ADAM_KEYS),
        trainer=_field_defaults(
            "transformers",
            "training_args.py",
            "TrainingArguments",
            _TRAINER_KEYS,
        ),
    )


def _package_file(package: str, relative: str) -> Path | None:
    """The installed package's file, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _parsed(package: str, relative: str) -> ast.Module | None:
    path = _package_file(package, relative)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _literal(node: ast.AST | None) -> Any:
    """The node's value when it is a literal; an attribute such as SchedulerType.LINEAR reads as `linear`."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        if isinstance(node, ast.Attribute):
            return node.attr.lower()
        return None


def _module_constant(package: str, relative: str, name: str) -> SourcedValue | None:
    tree = _parsed(package, relative)
    for node in tree.body if tree else []:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return SourcedValue(_literal(node.value), f"{package}/{relative}:{node.lineno}")
    return None


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    for node in tree.body if tree else []:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _init_defaults(package: str, relative: str, cls: str, keys: tuple[str, ...]) -> dict[str, SourcedValue]:
    """Keyword defaults of `cls.__init__` for `keys`."""
    found = _class(_parsed(package, relative), cls)
    body = found.body if found else []
    init = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return {}
    arguments = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    return {
        argument.arg: SourcedValue(_literal(default), f"{package}/{relative}:{default.lineno}")
        for argument, default in zip(arguments, init.args.defaults, strict=True)
        if argument.arg in keys
    }


def _field_defaults(package: str, relative: str, cls: str, keys: tuple[str, ...]) -> dict[str, SourcedValue]:
    """`name: T = field(default=...)` (or `= value`) of a dataclass, for `keys`."""
    found = _class(_parsed(package, relative), cls)
    values: dict[str, SourcedValue] = {}
    for node in found.body if found else []:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in keys):
            continue
        value = node.value
        if isinstance(value, ast.Call):
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        if value is not None:
            values[node.target.id] = SourcedValue(_literal(value), f"{package}/{relative}:{node.lineno}")
    return values
