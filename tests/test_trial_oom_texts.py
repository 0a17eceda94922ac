"""GPU-side allocation failures from every library are OOMs, not errors (real message texts, sources cited).

- NCCL: `WARN("Cuda failure %d '%s'", err, errStr)` in NCCL's src/include/checks.h (CUCHECK); torch's
  ProcessGroupNCCL appends NCCL's last error to the DistBackendError it raises.
- cuDNN: torch's AT_CUDNN_CHECK (ATen/cudnn/Exceptions.h) raises "cuDNN error: " + cudnnGetErrorString.
- cuBLAS: torch's TORCH_CUDABLAS_CHECK (ATen/cuda/Exceptions.h) raises "CUDA error: <status> when calling `...`".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fakes.torch_errors import DistBackendError

from autotune.trial.outcome import LaunchOutcome, build_result, classify_exception, classify_line, is_gpu_oom_text
from autotune.trial.trial_types import TrialSpec

NCCL_OOM = (
    "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with"
    " NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
    "ncclUnhandledCudaError: Call to CUDA function failed.\n"
    "Last error:\n"
    "Cuda failure 2 'out of memory'"
)
NCCL_OOM_OLD = "NCCL WARN Cuda failure 'out of memory'"
CUDNN_OOM = "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"
CUBLAS_OOM = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
CUBLASLT_OOM = (
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasLtMatmul( ltHandle, computeDesc.descriptor(), ...)`"
)


@pytest.mark.parametrize(
    "error",
    [
        DistBackendError(NCCL_OOM),
        RuntimeError(NCCL_OOM_OLD),
        RuntimeError(CUDNN_OOM),
        RuntimeError(CUBLAS_OOM),
        RuntimeError(CUBLASLT_OOM),
    ],
    ids=["nccl", "nccl-old", "cudnn", "cublas", "cublaslt"],
)
def test_library_allocation_failures_are_gpu_oom(error: BaseException) -> None:
    status, line = classify_exception(error)
    assert status == "oom_gpu"
    assert "\n" not in line
    assert "out of memory" in line.lower() or "alloc_failed" in line.lower()


def test_nccl_oom_line_names_the_cause() -> None:
    _, line = classify_exception(DistBackendError(NCCL_OOM))
    assert line.startswith("DistBackendError: NCCL error in:") and "Cuda failure 2 'out of memory'" in line


@pytest.mark.parametrize(
    "text",
    [
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 1 'invalid argument'",
        "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input.",
        "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx(...)`",
        "RuntimeError: NCCL communicator was aborted on rank 1.",
    ],
)
def test_other_library_failures_stay_errors(text: str) -> None:
    assert not is_gpu_oom_text(text)
    assert classify_exception(RuntimeError(text))[0] == "error"
    assert classify_line(text.splitlines()[0]) == "error"


def test_a_rank_killed_by_nccl_oom_is_classified_from_its_log(tmp_path: Path) -> None:
    """The exception line in the log is not the OOM; NCCL's last error a few lines below is."""
    log = tmp_path / "rank1.log"
    log.write_text("Traceback (most recent call last):\ntorch.distributed.DistBackendError: " + NCCL_OOM + "\n")
    spec = TrialSpec(model_config={}, architecture="X", family="decoder-only", ds_config={}, seq_len=8)
    outcome = LaunchOutcome(ranks=range(2), wall_s=1.0, exit_codes={1: 1}, logs={1: log})
    result = build_result(spec, {}, outcome)
    assert result.status == "oom_gpu" and "Cuda failure 2 'out of memory'" in (result.error or "")
