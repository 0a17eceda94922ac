"""Where the tool finds its shipped profiles and keeps its caches."""

from __future__ import annotations

import os
from pathlib import Path


def profiles_dir() -> Path:
    """Profiles ship inside the wheel as autotune/_profiles; in a source checkout they live at the top."""
    package = Path(__file__).resolve().parents[1]  # autotune/, this file being autotune/infra/paths.py
    packaged = package / "_profiles"
    if packaged.is_dir():
        return packaged
    return package.parents[1] / "profiles"


def cache_dir() -> Path:
    """AUTOTUNE_CACHE_DIR, else $XDG_CACHE_HOME/autotune, else ~/.cache/autotune."""
    explicit = os.environ.get("AUTOTUNE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autotune"
