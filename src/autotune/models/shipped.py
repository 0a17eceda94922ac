"""Summaries of the built-in profiles, generated once, so `plan` on a built-in model never imports torch.

The counts are derived by a meta-device build, not measured; tests/test_models.py rebuilds every
profile and checks its shipped summary is identical. After editing a profile, regenerate with
`python -m autotune.models.shipped`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import metadata
from pathlib import Path

from autotune.atomic import atomic_write_json
from autotune.models.profiles import model_profiles
from autotune.models.resolve import ModelSource, resolve_model
from autotune.models.summary import ModelSummary, fingerprint, summarize
from autotune.paths import profiles_dir


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


def write_shipped() -> Path:
    summaries = {}
    for profile in sorted(model_profiles().values(), key=lambda p: p.name):
        summary = summarize(resolve_model(profile.name), use_cache=False)
        summaries[summary.fingerprint] = summary.to_dict()
    data = {
        "transformers": metadata.version("transformers"),
        "generated_by": "python -m autotune.models.shipped",
        "summaries": summaries,
    }
    return atomic_write_json(shipped_path(), data)


if __name__ == "__main__":
    print(write_shipped())
