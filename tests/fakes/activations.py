"""Activation memory measured with torch's MemTracker, for the tests that check the estimate's activation terms
against a real forward/backward on the CPU (imports torch: only those tests import this)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

# torch's MemTracker ships from torch 2.5 (torch/distributed/_tools/mem_tracker.py); on an older torch every test
# module importing this one is skipped with this reason instead of failing the run at collection.
MemTracker = pytest.importorskip(
    "torch.distributed._tools.mem_tracker", reason="needs torch >= 2.5 (MemTracker measures the activations)"
).MemTracker


def activation_peak(model: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> int:
    """All live tensors minus parameters and their gradients at the peak of one forward/backward (MemTracker),
    after a warm-up step (lazy buffers, first-call allocations)."""
    loss().backward()
    model.zero_grad(set_to_none=True)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        loss().backward()
    peak = {str(k).split(".")[-1]: v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
    return peak["Total"] - peak.get("PARAM", 0) - peak.get("GRAD", 0)
