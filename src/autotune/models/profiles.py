"""Built-in model profiles: real published configs stored in profiles/models/*.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autotune.infra.paths import profiles_dir


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    name: str
    architecture: str
    config: dict
    hf_id: str | None
    description: str
    published_params: int | None
    published_params_tolerance: float | None
    path: Path


@cache
def _load_profiles(directory: Path) -> dict[str, ModelProfile]:
    profiles: dict[str, ModelProfile] = {}
    for path in sorted(directory.glob("*.json")):
        raw = json.loads(path.read_text())
        profiles[raw["name"].lower()] = ModelProfile(
            name=raw["name"],
            architecture=raw["architecture"],
            config=raw["config"],
            hf_id=raw.get("hf_id"),
            description=raw.get("description", ""),
            published_params=raw.get("published_params"),
            published_params_tolerance=raw.get("published_params_tolerance"),
            path=path,
        )
    return profiles


def model_profiles() -> dict[str, ModelProfile]:
    return _load_profiles(profiles_dir() / "models")


def find_profile(name: str) -> ModelProfile | None:
    profiles = model_profiles()
    key = name.strip().lower()
    if key in profiles:
        return profiles[key]
    for profile in profiles.values():  # also accept the hub id, e.g. google-t5/t5-3b
        if profile.hf_id and profile.hf_id.lower() == key:
            return profile
    return None
