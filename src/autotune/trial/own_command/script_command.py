"""The user's launch command as a template: what each trial substitutes into it, and how.

Two forms, so an existing setup moves over unchanged: our `{name}` placeholders (`PLACEHOLDERS`), or DeepSpeed
Autotuning's convention (deepspeed 0.19.8 autotuning/scheduler.py), where `--deepspeed <file>` names the user's
config, which is also every trial's base config, and its `autotuning.arg_mappings` names the flags to set.

Reasoning, the placeholder table and sources: trial/README.md#script_command
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import UserError

PLACEHOLDERS: dict[str, str] = {
    "ds_config": "path of the trial's DeepSpeed config file",
    "micro_batch": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
    "train_batch": "train_batch_size",
    "zero_stage": "ZeRO stage (0-3)",
    "grad_checkpointing": "true/false: activation checkpointing",
    "precision": "bf16, fp16 or fp32",
    "bf16": "true/false",
    "fp16": "true/false",
    "seq_len": "sequence length the memory model assumes",
    "gpus": "ranks per node",
    "nodes": "nodes",
    "world_size": "all ranks",
    "master_port": "a free port for this trial",
    "trial_dir": "a fresh scratch directory for this trial",
}
CONFIG_FLAGS = ("--deepspeed", "--deepspeed_config")  # the flags DeepSpeed's autotuner rewrites
# Keys the tuner decides; the rest of a user's base config is kept (README.md#script_command).
TUNED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "zero_optimization", "bf16", "fp16", "aio")  # fmt: skip
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*)\}")
# Commands that start ranks themselves; anything else is one process, i.e. world size 1.
_LAUNCHER_PROGRAMS = ("deepspeed", "torchrun", "accelerate", "srun", "mpirun", "mpiexec")
# TrainingArguments flags: a command giving one of them runs an HF Trainer script (transformers/training_args.py)
_HF_FLAGS = ("--per_device_train_batch_size", "--gradient_accumulation_steps", "--learning_rate", "--output_dir")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.runner",
                     "accelerate.commands.launch")  # fmt: skip


@dataclass(frozen=True)
class CommandTemplate:
    """A validated launch command; `render` gives one trial's argv."""

    argv: tuple[str, ...]
    config_flag_index: int | None  # the argument after which the user's config path sits (convention form)
    base_config: dict[str, Any] | None  # the user's own config file, convention form only
    arg_mappings: dict[str, str]  # ds key -> flag
    forced_consumer: str | None = None  # --consumer: "hf" or "deepspeed", over what the command shows

    @property
    def uses_placeholders(self) -> bool:
        return self.config_flag_index is None

    def placeholders(self) -> set[str]:
        names: set[str] = set()
        for argument in self.argv:
            names.update(m.group(1) for m in _PLACEHOLDER.finditer(argument) if m.group(1))
        return names

    def accepts_grad_checkpointing(self) -> bool:
        """Whether a candidate's checkpointing reaches the script; without it, such trials would lie."""
        return "grad_checkpointing" in self.placeholders() or any(
            flag.strip() in ("--gradient_checkpointing", "--gradient-checkpointing")
            for flag in self.arg_mappings.values()
        )

    def consumer(self) -> str:
        """ "hf" when the command runs an HF Trainer script, else "deepspeed" (a script that hands the file to
        deepspeed.initialize itself). An HF Trainer script takes the config as `--deepspeed FILE`
        (TrainingArguments.deepspeed) and gives TrainingArguments flags; a plain script built with
        `deepspeed.add_config_arguments` takes `--deepspeed` as a flag and the file as `--deepspeed_config FILE`
        (deepspeed/__init__.py). The HF one must get the .hf.json, whose "auto" values take its own
        --learning_rate, betas, eps, weight decay and --max_grad_norm (dsconfig.build.hf_variant); given the plain
        file, DeepSpeed would train at its own defaults (lr 1e-3) whatever the command says."""
        if self.forced_consumer is not None:
            return self.forced_consumer
        names = [argument.split("=", 1)[0] for argument in self.argv]
        if "--deepspeed_config" in names:
            return "deepspeed"
        for index, argument in enumerate(self.argv):
            if argument.startswith("--deepspeed="):
                return "hf"
            following = self.argv[index + 1] if index + 1 < len(self.argv) else ""
            if argument == "--deepspeed" and following and not following.startswith("-"):
                return "hf"
        return "hf" if any(name in _HF_FLAGS for name in names) else "deepspeed"

    def config_for_consumer(self, config: dict[str, Any]) -> dict[str, Any]:
        """The file the command reads: for an HF Trainer command the HF variant of `config` (the user's own keys,
        from the file the command names, kept as written), else `config` itself."""
        if self.consumer() != "hf":
            return config
        from autotune.dsconfig.build_config import hf_variant

        return hf_variant(config, self.base_config)

    def starts_ranks(self) -> bool:
        """True when the command is a launcher (torchrun, deepspeed, ...) that starts the ranks itself."""
        if not self.argv:
            return False
        if Path(self.argv[0]).name in _LAUNCHER_PROGRAMS:
            return True
        return any(a == "-m" and b in _LAUNCHER_MODULES for a, b in zip(self.argv, self.argv[1:], strict=False))

    def render(self, values: Mapping[str, str], config_path: Path, ds_config: Mapping[str, Any]) -> list[str]:
        argv = [_substitute(argument, {**values, "ds_config": str(config_path)}) for argument in self.argv]
        if self.config_flag_index is not None:
            _set_flag_value(argv, self.config_flag_index, str(config_path))
            for ds_key, flag in self.arg_mappings.items():
                value = find_value(ds_config, ds_key)
                if value is not None and str(value) != "auto":
                    _set_or_append(argv, flag, _format(value))
        return argv

    def trial_config(self, candidate_config: Mapping[str, Any]) -> dict[str, Any]:
        """The config a trial (and the final answer) uses: the candidate's, on top of the user's base."""
        if self.base_config is None:
            return dict(candidate_config)
        merged = {k: v for k, v in self.base_config.items() if k not in ("autotuning", *TUNED_KEYS)}
        for key, value in candidate_config.items():
            if key in TUNED_KEYS or key not in merged:
                merged[key] = value
        return merged


def parse_command(argv: Sequence[str], read_config: bool = True, consumer: str | None = None) -> CommandTemplate:
    """Validate a launch command; UserError (one line) on anything a trial could not run. `consumer`: --consumer."""
    argv = tuple(argv)
    if not argv:
        raise UserError("the command after `--` is empty")
    unknown = sorted({m.group(1) for a in argv for m in _PLACEHOLDER.finditer(a) if m.group(1)} - set(PLACEHOLDERS))
    if unknown:
        raise UserError(
            f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)} in the command;"
            f" known: {', '.join('{' + k + '}' for k in PLACEHOLDERS)} ({{{{ and }}}} for literal braces)"
        )
    if any("{ds_config}" in a for a in argv):
        return CommandTemplate(argv, None, None, {}, forced_consumer=consumer)
    index = _config_flag_index(argv)
    if index is None:
        raise UserError(
            "the command must take the trial's DeepSpeed config: put {ds_config} where the config path goes,"
            " or keep `--deepspeed <file>` / `--deepspeed_config <file>` (DeepSpeed Autotuning's convention)"
        )
    base = _read_user_config(_flag_value(argv, index)) if read_config else None
    mappings = _arg_mappings(base or {})
    return CommandTemplate(argv, index, base, mappings, forced_consumer=consumer)


def find_value(config: Mapping[str, Any], key: str) -> Any:
    """DeepSpeed's get_val_by_key: the key at top level, else the first match in nested dicts."""
    if key in config:
        return config[key]
    for value in config.values():
        if isinstance(value, Mapping):
            found = find_value(value, key)
            if found is not None:
                return found
    return None


def _substitute(argument: str, values: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "{{":
            return "{"
        if match.group(0) == "}}":
            return "}"
        return values[match.group(1)]

    return _PLACEHOLDER.sub(replace, argument)


def _format(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _config_flag_index(argv: tuple[str, ...]) -> int | None:
    for index, argument in enumerate(argv):
        name = argument.split("=", 1)[0]
        if name in CONFIG_FLAGS and ("=" in argument or index + 1 < len(argv)):
            return index
    return None


def _flag_value(argv: Sequence[str], index: int) -> str:
    argument = argv[index]
    return argument.split("=", 1)[1] if "=" in argument else argv[index + 1]


def _set_flag_value(argv: list[str], index: int, value: str) -> None:
    if "=" in argv[index]:
        argv[index] = f"{argv[index].split('=', 1)[0]}={value}"
    else:
        argv[index + 1] = value


def _set_or_append(argv: list[str], flag: str, value: str) -> None:
    for index, argument in enumerate(argv):
        if argument == flag and index + 1 < len(argv):
            argv[index + 1] = value
            return
        if argument.startswith(flag + "="):
            argv[index] = f"{flag}={value}"
            return
    argv.extend([flag, value])


def _read_user_config(path_text: str) -> dict[str, Any]:
    import hjson  # DeepSpeed reads config files with hjson (runtime/config.py); so do we

    path = Path(path_text)
    try:
        data = hjson.loads(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read the DeepSpeed config named in the command ({path}): {error.strerror}") from None
    except hjson.HjsonDecodeError as error:
        raise UserError(f"the DeepSpeed config named in the command ({path}) is not JSON/hjson: {error}") from None
    if not isinstance(data, Mapping):
        raise UserError(f"the DeepSpeed config named in the command ({path}) is not a JSON object")
    return _plain(data)


def _plain(value: Any) -> Any:
    """hjson's OrderedDicts as plain dicts, so the config serialises and compares like any other."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _arg_mappings(config: Mapping[str, Any]) -> dict[str, str]:
    section = config.get("autotuning") or {}
    raw = section.get("arg_mappings") if isinstance(section, Mapping) else None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise UserError('autotuning.arg_mappings must map DeepSpeed keys to flags, e.g. {"gradient_accumulation_steps":'
                        ' "--gradient_accumulation_steps"}')  # fmt: skip
    return {str(k).strip(): v.strip() for k, v in raw.items()}
