"""The simulated benchmarks' result files (search_quality.py, search_defaults.py, multinode_budget.py): one header
(what ran, when, under which Python and libraries, how long it took) and one writer, so every file says it alike."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from autotune.core.versions import library_versions
from autotune.infra.atomic import atomic_write_text


def write_result(path: Path, benchmark: str, started: float, figures: dict) -> dict:
    """Write `figures` under the header to `path` (atomically, as JSON); `started`: time.monotonic() at the start.
    Returns what was written."""
    data = {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "versions": library_versions(),
        "elapsed_s": round(time.monotonic() - started, 2),
        **figures,
    }
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return data
