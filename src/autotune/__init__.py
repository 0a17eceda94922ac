"""autotune: a GPU-memory-aware auto-tuner for DeepSpeed training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.core.versions import AUTOTUNE_VERSION as __version__

if TYPE_CHECKING:
    from autotune.tuner import TuneResult


def tune(*args: Any, **kwargs: Any) -> TuneResult:
    """Find the fastest DeepSpeed config that fits; see autotune.tuner.tune for the arguments."""
    from autotune.tuner import tune as _tune

    return _tune(*args, **kwargs)


__all__ = ["__version__", "tune"]
