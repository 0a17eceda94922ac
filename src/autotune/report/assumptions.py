"""What a tuning assumed, written beside the config it emitted (`ds_config.autotune.json`).

A DeepSpeed config does not say the model, the sequence length, or whether gradient checkpointing is on,
yet whether it fits depends on all three. `autotune check` reads this record, so checking the tuner's own
output asks the same question the tuner answered; a later `plan` can be given the same values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.infra.atomic import atomic_write_json

if TYPE_CHECKING:
    from autotune.report.data import TuneReport

SUFFIX = ".autotune.json"
SCHEMA = 1


def assumptions_path(config_path: str | Path) -> Path:
    path = Path(config_path)
    return path.with_name(path.stem + SUFFIX)


def assumptions_record(report: TuneReport) -> dict[str, Any]:
    """The record written beside the config: the report's assumptions, whether trials verified the pick, its
    measured peak and the limit it was held to."""
    return {
        "schema": SCHEMA,
        "written_by": "autotune",
        **report.assumptions.to_json(),
        "verified": report.verified,
        "measured_peak_bytes": report.measured_peak_bytes,
        "limit_bytes": report.limit_bytes,
    }


def write_assumptions(config_path: Path, report: TuneReport) -> Path:
    return atomic_write_json(assumptions_path(config_path), assumptions_record(report))


def read_assumptions(config_path: str | Path) -> dict[str, Any] | None:
    """The record beside `config_path`, or None when absent or unreadable (then nothing is assumed)."""
    path = assumptions_path(config_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None
