"""Regenerate profiles/summaries.json from the built-in profiles: `python -m autotune.models.regenerate`.

Builds every profile on the meta device (imports torch and transformers); tests/test_models.py checks the
shipped file still equals a fresh build.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from autotune.infra.atomic import atomic_write_json
from autotune.models.model_summary import summarize
from autotune.models.profiles import model_profiles
from autotune.models.resolve import resolve_model
from autotune.models.shipped import shipped_path


def write_shipped() -> Path:
    summaries = {}
    for profile in sorted(model_profiles().values(), key=lambda p: p.name):
        summary = summarize(resolve_model(profile.name), use_cache=False)
        summaries[summary.fingerprint] = summary.to_dict()
    data = {
        "transformers": metadata.version("transformers"),
        "generated_by": "python -m autotune.models.regenerate",
        "summaries": summaries,
    }
    return atomic_write_json(shipped_path(), data)


if __name__ == "__main__":
    print(write_shipped())
