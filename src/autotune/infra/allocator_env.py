"""The CUDA caching allocator's settings as the environment gives them to a trial.

`expandable_segments`, `max_split_size_mb`, `garbage_collection_threshold` and the like change a step's reserved
peak (expandable segments alone by tens of percent), so a measured peak is only the same fact under the same
settings: each trial's result records them and the trials' cache key includes them (request/context.py).

torch reads them from `PYTORCH_CUDA_ALLOC_CONF`, then (where that is unset) `PYTORCH_ALLOC_CONF`
(torch 2.13 c10/cuda/CUDAAllocatorConfig.h:136-147; c10/core/AllocatorConfig.h:158-160 names the latter the primary
one for every accelerator). Both are recorded as set, so neither reading order is assumed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ALLOCATOR_ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def allocator_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allocator variables set in env (default: this process's), by name; empty where none is."""
    source = os.environ if env is None else env
    return {name: source[name] for name in ALLOCATOR_ENV_VARS if source.get(name)}
