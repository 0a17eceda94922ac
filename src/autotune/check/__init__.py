"""`autotune check`: tell users what their DeepSpeed config really does, and optionally fix it.

DeepSpeed 0.19 accepts many configs that do not do what they say (unknown keys dropped, stage-3
settings ignored at stage 2, "auto" that only HF fills). Each check here names the key, says what
DeepSpeed really does with it, and proposes an edit; --fix applies the edits and re-validates.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.check.checked_against import CheckContext, resolve_context
from autotune.check.envvars import env_findings, parse_env_file
from autotune.check.findings import CheckReport, Edit, Finding, FitResult, Fix, FixResult, Severity, touches_training
from autotune.check.fix import apply_fixes
from autotune.check.initialize import (
    client_optimizer_findings,
    deepspeed_version,
    optimizer_findings,
    scheduler_findings,
)
from autotune.check.rules import (
    activation_checkpointing_findings,
    batch_findings,
    bucket_findings,
    precision_findings,
    stage_findings,
)
from autotune.check.unknown_keys import key_findings
from autotune.check.values import auto_findings, string_value_findings
from autotune.check.verdict import deepspeed_findings, deepspeed_rejection
from autotune.dsconfig.consumer import Consumer, FillOutcome, detect_consumer, fill_like_consumer, has_auto
from autotune.dsconfig.loading import LoadedConfig, load_config
from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_json
from autotune.infra.environment import parse_without_device
from autotune.models import ModelSummary

if TYPE_CHECKING:
    from autotune.check.fit import FitAssumptions

__all__ = [
    "CheckContext",
    "CheckReport",
    "Consumer",
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
    return [Finding(Severity.ERROR, key, message, "duplicate-key", fix=fix) for key in dict.fromkeys(duplicates)]


def _nonfinite_findings(nonfinite: list[tuple[str, str, str]]) -> list[Finding]:
    """NaN/Infinity values: Python's json reads them (so HF Trainer and accelerate hand DeepSpeed a float nan or
    inf), DeepSpeed's own reader of a path does something else (dsconfig/loading.py deepspeed_file_reading);
    either way no training setting is meant to be one, so it is an error the user resolves with a number."""

    def finding(path: str, literal: str, reading: str) -> Finding:
        message = f"{literal}: Python's json (HF Trainer, accelerate) reads it as float({literal!r}); {reading}."
        return Finding(Severity.ERROR, path, f"{message} Write a finite number.", "non-finite")

    return [finding(path, literal, reading) for path, literal, reading in nonfinite]


def consumer_of(config: dict[str, Any], context: CheckContext) -> Consumer:
    """The consumer the context names, else HF Trainer when the config has "auto" (see detect_consumer)."""
    if context.consumer and context.consumer != "auto":
        return Consumer(context.consumer)
    if context.for_hf_trainer or has_auto(config):
        return Consumer.HF_TRAINER
    return Consumer.DEEPSPEED


def _unfilled_auto(path: str, consumer: Consumer) -> Finding:
    keys = tuple(path.split("."))
    message = (
        f'"auto" here is filled by neither the HF Trainer nor accelerate (the installed versions fill a fixed set '
        f"of keys); accelerate's deepspeed_config_process raises ValueError at prepare(): \"`{path}` not found in "
        f'kwargs". Consumer: {consumer.label}.'
    )
    training = touches_training(keys)
    fix = Fix(
        "remove it, so DeepSpeed's default applies" + (" (a training value)" if training else ""),
        (Edit("remove", keys),),
        changes_training=training,
    )
    return Finding(Severity.ERROR, path, message, "auto", fix=fix)


def consumer_findings(outcome: FillOutcome, consumer: Consumer, strict_json_problem: str = "") -> list[Finding]:
    """What the consumer (HF Trainer, accelerate) refuses before DeepSpeed sees the config."""
    findings: list[Finding] = []
    if consumer.fills_auto and strict_json_problem:
        message = (
            f"{consumer.label} reads the file with json.load, which refuses it: {strict_json_problem} "
            "(DeepSpeed's own hjson reader would accept it)."
        )
        findings.append(Finding(Severity.ERROR, "", message, "strict-json", fix=Fix("write it as strict JSON")))
    if outcome.refusal:
        findings.append(
            Finding(Severity.ERROR, "", f"{consumer.label} refuses this config: {outcome.refusal}", "consumer")
        )
    findings += [_unfilled_auto(path, consumer) for path in outcome.unfilled]
    return findings


def _without(config: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    trimmed = copy.deepcopy(config)
    for path in paths:
        *parents, last = path.split(".")
        node: Any = trimmed
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return trimmed


def config_findings(
    config: dict[str, Any],
    context: CheckContext,
    strict_json_problem: str = "",
    mixed_precision: str | None = None,
) -> list[Finding]:
    """Every finding about the config itself, in an order whose fixes compose: keys, stage, values."""
    parse_without_device()  # checking needs no device; never touch CUDA
    consumer = consumer_of(config, context)
    version = deepspeed_version()
    outcome = fill_like_consumer(config, consumer, context.world_size, mixed_precision)
    findings = consumer_findings(outcome, consumer, strict_json_problem)
    leftover_auto = [] if consumer.fills_auto else auto_findings(config)
    crashing_auto = [f.path for f in leftover_auto if f.severity is Severity.ERROR]
    as_deepspeed_sees_it = _without(outcome.filled, crashing_auto)  # the "auto" findings explain those
    if not outcome.refusal:
        findings += deepspeed_findings(as_deepspeed_sees_it, context.world_size, version)
        findings += optimizer_findings(as_deepspeed_sees_it, version)
        findings += scheduler_findings(as_deepspeed_sees_it, version)
        findings += client_optimizer_findings(as_deepspeed_sees_it, consumer.label, consumer.fills_auto, version)
    findings += key_findings(config)
    findings += stage_findings(config)
    findings += activation_checkpointing_findings(config)
    findings += leftover_auto
    findings += string_value_findings(config)
    findings += batch_findings(config, context.world_size)
    findings += precision_findings(config, context.bf16_capable)
    findings += bucket_findings(config)
    return findings


def fix_config(
    config: dict[str, Any],
    context: CheckContext,
    output: str | Path,
    duplicate_keys: tuple[str, ...] = (),
    allow_training_changes: bool = False,
    strict_json_problem: str = "",
    mixed_precision: str | None = None,
) -> FixResult:
    """Apply the edits that keep training as written (all of them with allow_training_changes), re-check,
    and write the result only if DeepSpeed (and the consumer, for HF / accelerate) accepts it."""
    consumer = consumer_of(config, context)
    context = replace(context, consumer=consumer.value)  # a fix that removes the last "auto" keeps the consumer
    current = copy.deepcopy(config)
    changes = [
        f"{key}: duplicate key, kept the last value [DeepSpeed refuses duplicates]"
        for key in dict.fromkeys(duplicate_keys)
    ]
    if strict_json_problem and consumer.fills_auto:
        changes.append(f"(file): written as strict JSON [{consumer.label} reads it with json.load]")
    withheld: list[str] = []
    for _ in range(_FIX_ROUNDS):
        round_withheld: list[str] = []
        findings = config_findings(current, context, mixed_precision=mixed_precision)
        current, new_changes = apply_fixes(current, findings, allow_training_changes, round_withheld)
        withheld = round_withheld
        if not new_changes:
            break
        changes += new_changes
    remaining = tuple(
        f for f in config_findings(current, context, mixed_precision=mixed_precision) if f.severity is not Severity.INFO
    )
    outcome = fill_like_consumer(current, consumer, context.world_size, mixed_precision)
    rejection = outcome.refusal or deepspeed_rejection(outcome.filled, context.world_size)
    if outcome.unfilled and not rejection:
        rejection = f'{consumer.label} cannot fill "auto" at {", ".join(outcome.unfilled)}'
    if not rejection:
        try:
            atomic_write_json(output, current)
        except OSError as error:
            raise UserError(f"cannot write --fix output {output}: {error.strerror or error}") from None
    return FixResult(
        output_path=str(output),
        changes=tuple(changes),
        written=not rejection,
        rejected_by_deepspeed=rejection,
        remaining=remaining,
        withheld=tuple(dict.fromkeys(withheld)),
    )


def _init_check_finding(
    config: dict[str, Any], context: CheckContext, consumer: Consumer, precision: str | None
) -> Finding:
    """Build the engine as the consumer does (init_probe) and run a step on the CPU backend, with the config as
    DeepSpeed receives it."""
    from autotune.check.init_probe import run_init_check

    outcome = fill_like_consumer(config, consumer, context.world_size, precision)
    if outcome.refusal or outcome.unfilled:
        return Finding(Severity.INFO, "", f"--init-check not run: {consumer.label} refuses the config first.", "init")
    result = run_init_check(outcome.filled, context.world_size, consumer.value)
    where = f" at {result.stage}" if result.stage else ""
    severity = Severity.ERROR if result.status == "failed" else Severity.INFO
    message = f"--init-check ({result.status}{where}, tiny model, CPU backend, world size 1): {result.detail}"
    return Finding(severity, "", message, "init")


def check_config(
    config_path: str | Path,
    context: CheckContext,
    env_file: str | Path | None = None,
    model: ModelSummary | None = None,
    seq_len: int = 2048,
    grad_checkpointing: bool = False,
    fix_output: str | Path | None = None,
    allow_training_changes: bool = False,
    init_check: bool = False,
    assumed: FitAssumptions | None = None,
) -> CheckReport:
    """Check one config file; raise UserError (exit 2) when it or the env file cannot be read."""
    loaded: LoadedConfig = load_config(config_path)
    requested = context.consumer or ("hf-trainer" if context.for_hf_trainer else None)
    consumer, reason = detect_consumer(loaded, requested)
    context = replace(context, consumer=consumer.value)
    precision = loaded.accelerate.mixed_precision if loaded.accelerate else None
    if (
        loaded.accelerate is not None
        and loaded.accelerate.num_processes
        and context.world_size_source.startswith("1 GPU")
    ):
        processes = loaded.accelerate.num_processes
        context = replace(context, world_size=processes, world_size_source=f"num_processes {processes} in the YAML")
    assignments = parse_env_file(env_file) if env_file else []
    report = CheckReport(
        str(config_path),
        context.world_size,
        context.world_size_source,
        deepspeed_version=deepspeed_version(),
        consumer=consumer.value,
        consumer_reason=reason,
    )
    report.findings += _duplicate_findings(loaded.duplicate_keys)
    report.findings += _nonfinite_findings(loaded.nonfinite)
    report.findings += config_findings(loaded.config, context, loaded.strict_json_problem, precision)
    report.findings += env_findings(assignments)
    if init_check:
        report.findings.append(_init_check_finding(loaded.config, context, consumer, precision))
    if model is not None:
        from autotune.check.fit import fit_findings

        report.fit, fit_notes = fit_findings(
            loaded.config, context, model, seq_len, grad_checkpointing=grad_checkpointing, assumed=assumed
        )
        report.findings += fit_notes
    if fix_output is not None:
        report.fix = fix_config(
            loaded.config,
            context,
            fix_output,
            tuple(loaded.duplicate_keys),
            allow_training_changes=allow_training_changes,
            strict_json_problem=loaded.strict_json_problem,
            mixed_precision=precision,
        )
    return report
