"""Issue 46: a failure that says nothing about the config is inconclusive: retried once, never cached.

TMPDIR filled 6 s into trial 1: both trials were "error: rank 0 exit code 1 without writing a result", the rows
were cached as errors, and the rerun with the disk freed printed them "(cached)" and never re-measured.
Fast tests classify what the launcher saw (trial/outcome.py); the real one runs DeepSpeed's worker with a rank
that vanishes (exit 1, no report, no error line) and then the same tuning with the disk "freed".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.fakes.launchers import FaultInjectingLauncher

from autotune import tune
from autotune.core.ladder import Rung
from autotune.errors import TrialsFailedError
from autotune.trial.outcome import LaunchOutcome, build_result, classify_line
from autotune.trial.trial_types import TrialSpec
from autotune.tuner import TuneRequest

SPEC = TrialSpec(model_config={"model_type": "gpt2"}, architecture="GPT2LMHeadModel", family="decoder-only",
                 ds_config={}, seq_len=32, device="cpu")  # fmt: skip


def test_a_rank_that_left_no_report_and_no_error_line_is_inconclusive(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("")
    result = build_result(SPEC, {}, LaunchOutcome(ranks=range(1), wall_s=6.0, exit_codes={0: 1}, logs={0: log}))
    assert result.status == "inconclusive"
    assert "without writing a result or an error line" in (result.error or "")


@pytest.mark.parametrize(
    "line",
    [
        "OSError: [Errno 28] No space left on device",
        "OSError: [Errno 122] Disk quota exceeded",
        "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/autotune-trial-x/report.json'",
        "RuntimeError: [Errno 2] No such file or directory: '/tmp/torch_extensions/lock'",
    ],
)
def test_a_full_disk_or_a_missing_file_is_inconclusive(line: str) -> None:
    assert classify_line(line) == "inconclusive"


def test_an_error_about_the_config_stays_an_error() -> None:
    assert classify_line("ValueError: train_batch_size is not equal to micro_batch * grad_acc * world_size") == "error"


def _request(tmp_path: Path) -> TuneRequest:
    return TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=32, rungs=(Rung.Z0,), micro_batches=(2,),
        out=str(tmp_path / "ds_config.json"), cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip


def test_a_rank_that_vanishes_is_retried_once_not_cached_and_measured_by_the_rerun(tmp_path: Path) -> None:
    request = _request(tmp_path)
    full = FaultInjectingLauncher("vanish", "start")  # real worker, exits 1 before writing anything
    with pytest.raises(TrialsFailedError, match="inconclusive"):
        tune(request, launcher=full)
    tried = [json.dumps([s.ds_config["train_micro_batch_size_per_gpu"], s.grad_checkpointing]) for s in full.specs]
    assert len(tried) == 2 * len(set(tried))  # each candidate once more, then given up
    report = json.loads((tmp_path / "autotune-report.json").read_text())
    assert {t["result"]["status"] for t in report["trials"]} == {"inconclusive"}
    assert "without writing a result" in report["trials"][0]["result"]["error"]
    rerun = tune(request)  # the disk freed: a real trial, nothing "(cached)"
    assert rerun.trials_launched >= 1 and not rerun.from_cache and rerun.samples_per_s and rerun.candidate is not None


def test_an_mlock_failure_in_the_ranks_log_is_a_locked_memory_verdict_not_retried(tmp_path: Path) -> None:
    """DeepSpeed's native allocator prints this, asserts and aborts (page_alloc.cpp:25-28, deepspeed_pin_tensor.cpp:
    47-48): a host-memory verdict (cached, not retried), where the SIGABRT alone read as inconclusive."""
    log = tmp_path / "rank0.log"
    log.write_text(
        "mlock failed to allocate 4194304 bytes with error no 12 msg Cannot allocate memory\n"
        "python3: deepspeed_pin_tensor.cpp:48: torch::Tensor deepspeed_pin_tensor_t::alloc(...): Assertion"
        " `nullptr != pinned_buffer' failed.\n"
    )
    outcome = LaunchOutcome(ranks=range(1), wall_s=9.0, exit_codes={0: -6}, logs={0: log})
    result = build_result(SPEC, {}, outcome)
    assert result.status == "oom_host" and "locked-memory limit" in (result.error or "")
    assert "mlock failed to allocate 4194304 bytes" in (result.error or "")
