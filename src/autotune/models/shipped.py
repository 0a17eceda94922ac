"""Summaries of the built-in profiles, generated once, so `plan` on a built-in model never imports torch.

The counts are derived by a meta-device build, not measured; tests/test_models.py rebuilds every
profile and checks its shipped summary is identical. After editing a profile, regenerate with
`python -m autotune.models.regenerate`.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from autotune.infra.paths import profiles_dir
from autotune.models.model_types import ModelSummary, fingerprint
from autotune.models.resolve import ModelSource


def shipped_path() -> Path:
    return profiles_dir() / "summaries.json"


@cache
def _load(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())["summaries"]
    except (OSError, ValueError, KeyError):
        return {}


def shipped_summary(source: ModelSource) -> ModelSummary | None:
    """The generated summary of a built-in profile whose config is unchanged since generation."""
    if source.origin != "profile":
        return None
    entry = _load(shipped_path()).get(fingerprint(source.config, source.architecture))
    if entry is None:
        return None
    return ModelSummary.from_dict({**entry, "name": source.name, "origin": source.origin})
