"""The golden reports (tests/data/report/*.autotune-report.json, real reports of real tunings) as typed values: the
base tests change one part of with dataclasses.replace, so a report test needs no tuning."""

from __future__ import annotations

import json
from pathlib import Path

from autotune.report.data import TuneReport

DATA = Path(__file__).resolve().parent.parent / "data" / "report"


def golden_text(name: str) -> tuple[str, dict]:
    """A golden report's bytes and its JSON."""
    text = (DATA / f"{name}.autotune-report.json").read_text()
    return text, json.loads(text)


def golden_report(name: str = "demo") -> TuneReport:
    """A real report, typed: the base other tests change one part of with dataclasses.replace."""
    return TuneReport.from_json(golden_text(name)[1])
