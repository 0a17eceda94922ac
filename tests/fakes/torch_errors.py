"""Stand-ins for the exceptions torch raises when a trial fails, for tests of the failure classifier
(autotune.trial.outcome) that import no torch. The classifier recognises these by class name and message, as it
does torch's own. Each is a RuntimeError, as torch's are, and carries only a message; not modelled: torch's
intermediate DistError base class and its extra attributes."""

from __future__ import annotations


class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError (the caching allocator's CUDA out of memory)."""


class DistBackendError(RuntimeError):
    """Stands for torch.distributed.DistBackendError (ProcessGroupNCCL appends NCCL's last error to its message)."""


class DistNetworkError(RuntimeError):
    """Stands for torch.distributed.DistNetworkError (the rendezvous store's socket failures)."""
