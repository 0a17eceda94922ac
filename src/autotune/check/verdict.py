"""DeepSpeed's own verdict on the config, at the stated world size, and the warnings it prints."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from autotune.check.findings import Finding, Severity
from autotune.check.schema import deepspeed_log_captured
from autotune.dsconfig.build_config import ConfigRejected, validate_with_deepspeed

# Deprecated fields are reported by the key checks, with their path; DeepSpeed's own line adds nothing.
_ALREADY_REPORTED = ("_process_deprecated_field",)


def _explain(error: ConfigRejected) -> str:
    """One line; pydantic errors spelled out field by field instead of "1 validation error for ..."."""
    cause = error.__cause__
    if isinstance(cause, ValidationError):
        details = "; ".join(f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in cause.errors())
        return f"{cause.title}: {details}"
    return str(error)


def _run_parser(config: dict[str, Any], world_size: int) -> tuple[str, list[logging.LogRecord]]:
    with deepspeed_log_captured() as records:
        try:
            validate_with_deepspeed(config, world_size)
        except ConfigRejected as error:
            return _explain(error), records
    return "", records


def deepspeed_rejection(config: dict[str, Any], world_size: int) -> str:
    """DeepSpeed's reason for refusing `config` at `world_size`; "" when it accepts it."""
    return _run_parser(config, world_size)[0]


def deepspeed_findings(config: dict[str, Any], world_size: int, version: str = "") -> list[Finding]:
    rejection, records = _run_parser(config, world_size)
    findings: list[Finding] = []
    if rejection:
        who = f"DeepSpeed {version}" if version else "DeepSpeed"
        message = f"{who} rejects this config at world size {world_size}: {rejection}"
        findings.append(Finding(Severity.ERROR, "", message, "deepspeed"))
    for record in records:
        if record.funcName in _ALREADY_REPORTED:
            continue
        findings.append(Finding(Severity.WARNING, "", f"DeepSpeed warns: {record.getMessage()}", "deepspeed"))
    return findings
