"""The parent's view of GPU memory through NVML (no CUDA context): is the card free again after a trial?

The driver frees a dead process's memory asynchronously; starting the next trial before it has would
make that trial see a smaller card than the user has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from autotune.core.units import MiB, format_bytes

RELEASE_SLACK_BYTES = 256 * MiB  # other tenants and NVML's own bookkeeping move this much
RELEASE_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


def nvml_used_bytes() -> dict[int, int] | None:
    """Used memory per physical GPU index, or None without NVML (CPU machines)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return {
            index: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)
            for index in range(pynvml.nvmlDeviceGetCount())
        }
    except Exception:  # pynvml raises its own NVMLError family, or ImportError
        return None


def wait_for_release(
    before: dict[int, int] | None,
    timeout_s: float = RELEASE_TIMEOUT_S,
    poll_s: float = 0.2,
    read_used: Callable[[], dict[int, int] | None] = nvml_used_bytes,
) -> bool:
    """Wait until every GPU is back to its pre-trial use (within slack); False, and a warning, if it is not."""
    if not before:
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        now = read_used() or {}
        held = {i: now[i] - used for i, used in before.items() if now.get(i, 0) > used + RELEASE_SLACK_BYTES}
        if not held:
            return True
        if time.monotonic() >= deadline:
            busy = ", ".join(f"GPU {i}: +{format_bytes(extra)}" for i, extra in sorted(held.items()))
            log.warning("GPU memory not back to its pre-trial level after %.0f s (%s)", timeout_s, busy)
            return False
        time.sleep(poll_s)
