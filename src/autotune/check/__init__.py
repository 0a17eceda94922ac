"""`autotune check`: tell users what their DeepSpeed config really does, and optionally fix it.

DeepSpeed 0.19 accepts many configs that do not do what they say (unknown keys dropped, stage-3
settings ignored at stage 2, "auto" that only HF fills). Each check here names the key, says what
DeepSpeed really does with it, and proposes an edit; --fix applies the edits and re-validates.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.atomic import atomic_write_json
from autotune.check.context import CheckContext, resolve_context
from autotune.check.envvars import env_findings, parse_env_file
from autotune.check.findings import CheckReport, Edit, Finding, FitResult, Fix, FixResult, Severity
from autotune.check.fix import apply_fixes
from autotune.check.keys import key_findings
from autotune.check.loading import LoadedConfig, load_config
from autotune.check.rules import (
    activation_checkpointing_findings,
    batch_findings,
    bucket_findings,
    precision_findings,
    stage_findings,
)
from autotune.check.values import auto_findings, string_value_findings
from autotune.check.verdict import deepspeed_findings, deepspeed_rejection
from autotune.environment import parse_without_device
from autotune.models import ModelSummary

if TYPE_CHECKING:
    from autotune.check.fit import FitAssumptions

__all__ = [
    "CheckContext",
    "CheckReport",
    "Edit",
    "Finding",
    "FitResult",
    "Fix",
    "FixResult",
    "Severity",
    "check_config",
    "config_findings",
    "fix_config",
    "load_config",
    "resolve_context",
]

_FIX_ROUNDS = 3  # a fix can expose another (a string batch size, once a number, may not add up)


def _duplicate_findings(duplicates: list[str]) -> list[Finding]:
    message = "Duplicate key: DeepSpeed refuses to load the file; the last value is the one checked."
    fix = Fix("keep the last value")
    return [Finding(Severity.ERROR, key, message, "duplicate-key", fix) for key in dict.fromkeys(duplicates)]


def _hf_filled(config: dict[str, Any]) -> dict[str, Any]:
    """The config as DeepSpeed sees it after the HF Trainer has replaced every "auto"."""
    filled, _ = apply_fixes(config, auto_findings(config))
    return filled


def config_findings(config: dict[str, Any], context: CheckContext) -> list[Finding]:
    """Every finding about the config itself, in an order whose fixes compose: keys, stage, values."""
    parse_without_device()  # checking needs no device; never touch CUDA
    as_deepspeed_sees_it = _hf_filled(config) if context.for_hf_trainer else config
    findings = deepspeed_findings(as_deepspeed_sees_it, context.world_size)
    findings += key_findings(config)
    findings += stage_findings(config)
    findings += activation_checkpointing_findings(config)
    if not context.for_hf_trainer:
        findings += auto_findings(config)
    findings += string_value_findings(config)
    findings += batch_findings(config, context.world_size)
    findings += precision_findings(config, context.bf16_capable)
    findings += bucket_findings(config)
    return findings


def fix_config(
    config: dict[str, Any], context: CheckContext, output: str | Path, duplicate_keys: tuple[str, ...] = ()
) -> FixResult:
    """Apply every proposed edit, re-check, and write the result only if DeepSpeed accepts it."""
    current = copy.deepcopy(config)
    changes = [f"{key}: duplicate key, kept the last value" for key in dict.fromkeys(duplicate_keys)]
    for _ in range(_FIX_ROUNDS):
        current, new_changes = apply_fixes(current, config_findings(current, context))
        if not new_changes:
            break
        changes += new_changes
    remaining = tuple(f for f in config_findings(current, context) if f.severity is not Severity.INFO)
    checked = _hf_filled(current) if context.for_hf_trainer else current
    rejection = deepspeed_rejection(checked, context.world_size)
    if not rejection:
        atomic_write_json(output, current)
    return FixResult(
        output_path=str(output),
        changes=tuple(changes),
        written=not rejection,
        rejected_by_deepspeed=rejection,
        remaining=remaining,
    )


def check_config(
    config_path: str | Path,
    context: CheckContext,
    env_file: str | Path | None = None,
    model: ModelSummary | None = None,
    seq_len: int = 2048,
    grad_checkpointing: bool = False,
    fix_output: str | Path | None = None,
    assumed: FitAssumptions | None = None,
) -> CheckReport:
    """Check one config file; raise UserError (exit 2) when it or the env file cannot be read."""
    loaded: LoadedConfig = load_config(config_path)
    assignments = parse_env_file(env_file) if env_file else []
    report = CheckReport(str(config_path), context.world_size, context.world_size_source)
    report.findings += _duplicate_findings(loaded.duplicate_keys)
    report.findings += config_findings(loaded.config, context)
    report.findings += env_findings(assignments)
    if model is not None:
        from autotune.check.fit import fit_findings

        report.fit, fit_notes = fit_findings(loaded.config, context, model, seq_len, grad_checkpointing, assumed)
        report.findings += fit_notes
    if fix_output is not None:
        report.fix = fix_config(loaded.config, context, fix_output, tuple(loaded.duplicate_keys))
    return report
