"""Trial runner logic that needs no DeepSpeed run: classification, result assembly, launch commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.torch_errors import OutOfMemoryError

from autotune.errors import UserError
from autotune.trial import LocalLauncher, SlurmLauncher, TrialSpec
from autotune.trial.launch.gpus import nvml_used_bytes, wait_for_release
from autotune.trial.launch.local import torchrun_exit_codes
from autotune.trial.launch.slurm import first_hostname, srun_exit_codes
from autotune.trial.outcome import BudgetBreach, LaunchOutcome, build_result, classify_exception, first_error_line
from autotune.trial.rank_report import RankReport
from autotune.trial.throughput import flops_per_token, throughput
from autotune.trial.trial_types import RankMetrics, TrialResult

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}


def make_spec(**overrides: object) -> TrialSpec:
    values: dict = dict(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config={"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
        seq_len=128,
        device="cpu",
    )
    values.update(overrides)
    return TrialSpec(**values)


def ok_report(rank: int, rss: int = 500 << 20) -> RankReport:
    return RankReport(
        rank=rank,
        status="ok",
        memory=RankMetrics(rank=rank, host_rss_peak_bytes=rss),
        step_times_s=[0.5, 0.4, 0.4, 0.4],
        phases={
            "launch": 1.0,
            "imports": 3.0,
            "dist_init": 0.5,
            "model_build": 1.0,
            "engine_init": 2.0,
            "warmup": 1.0,
            "measured": 2.0,
        },
        train_batch_size=4,
        hardware_flops_per_token=8e6,
        model_flops_per_token=6e6,
    )


# --- exceptions and logs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), "oom_gpu"),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "oom_gpu"),
        (MemoryError(), "oom_host"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes"), "oom_host"),
        (ValueError("bad shape\nmore detail"), "error"),
    ],
)
def test_classify_exception(error: BaseException, status: str) -> None:
    assert classify_exception(error)[0] == status


def test_classify_exception_follows_the_cause_and_keeps_one_line() -> None:
    try:
        try:
            raise OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB")
        except OutOfMemoryError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        status, line = classify_exception(outer)
    assert (status, line) == ("oom_gpu", "OutOfMemoryError: CUDA out of memory.")


def test_first_error_line_is_the_root_cause_not_a_traceback_line() -> None:
    log = "\n".join(
        [
            "[transformers] some warning",
            "Traceback (most recent call last):",
            '  File "x.py", line 3, in <module>',
            "IndexError: index out of range in self",
            "",
            "During handling of the above exception, another exception occurred:",
            "RuntimeError: wrapper",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        ]
    )
    assert first_error_line(log) == "IndexError: index out of range in self"
    assert first_error_line("all fine\n") is None


def test_a_rank_that_died_unreported_is_still_classified_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried 2 GiB\n")
    outcome = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: 1}, logs={0: log})
    assert build_result(make_spec(), {}, outcome).status == "oom_gpu"


def test_torchrun_and_srun_exit_codes_from_their_logs() -> None:
    torchrun_log = """
[1]:
  time      : 2026-11-22_03:00:00
  host      : node
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
"""
    assert torchrun_exit_codes(torchrun_log) == {1: -9}
    srun_log = "srun: error: n1: task 1: Killed\nsrun: error: n2: tasks 2-3,5: Exited with exit code 1\n"
    assert srun_exit_codes(srun_log) == {1: -9, 2: 1, 3: 1, 5: 1}


# --- result assembly -----------------------------------------------------------------------------


def test_ok_result_rates_and_startup() -> None:
    spec = make_spec(nprocs_per_node=2, peak_tflops=100.0)
    result = build_result(spec, {0: ok_report(0), 1: ok_report(1)}, LaunchOutcome(ranks=range(2), wall_s=12.0))
    assert result.status == "ok"
    assert result.samples_per_s == pytest.approx(4 / 0.4)  # median step
    assert result.tokens_per_s == pytest.approx(10 * 128)
    assert result.tflops_per_gpu == pytest.approx(8e6 * 1280 / 2 / 1e12)
    assert result.mfu == pytest.approx(6e6 * 1280 / 2 / 1e12 / 100.0)
    assert result.startup_s == pytest.approx(7.5)  # everything before the first step
    assert [r.rank for r in result.ranks] == [0, 1]
    assert TrialResult.from_dict(result.to_dict()) == result


def test_a_non_positive_step_time_is_an_error_not_a_speed() -> None:
    from dataclasses import replace

    spec = make_spec(nprocs_per_node=1)
    report = replace(ok_report(0), step_times_s=[-0.21, 0.05, 0.48])  # a ZenFlow trial, before the fix
    result = build_result(spec, {0: report}, LaunchOutcome(ranks=range(1), wall_s=12.0))
    assert result.status == "error" and result.samples_per_s is None
    assert "non-positive step time" in (result.error or "")


class _ZenFlowAutoEngine:
    """DeepSpeed's engine after ZenFlow's update_interval "auto": its accumulation reads 0 (zenflow/engine.py:69)."""

    def gradient_accumulation_steps(self) -> int:
        return 0

    def train_batch_size(self) -> int:
        return 64

    def train_micro_batch_size_per_gpu(self) -> int:
        return 8


def test_job_accumulation_comes_from_the_batch_arithmetic_not_zenflows_rewrite() -> None:
    from autotune.trial.worker.train_steps import job_accumulation

    assert job_accumulation(_ZenFlowAutoEngine(), world_size=2) == 4  # 64 = 8 x 4 x 2
    assert job_accumulation(_ZenFlowAutoEngine(), world_size=8) == 1


def test_root_cause_wins_over_peers_that_died_with_it() -> None:
    spec = make_spec(nprocs_per_node=2)
    oom = RankReport(rank=1, status="oom_gpu", error="OutOfMemoryError: CUDA out of memory.")
    peer = RankReport(rank=0, status="error", error="RuntimeError: Connection closed by peer")
    result = build_result(spec, {0: peer, 1: oom}, LaunchOutcome(ranks=range(2), wall_s=1.0))
    assert (result.status, result.error) == ("oom_gpu", "OutOfMemoryError: CUDA out of memory.")


def test_missing_report_after_sigkill_is_host_oom_only_with_the_kernels_word(tmp_path: Path) -> None:
    outcome = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: -9}, logs={0: tmp_path / "none.log"})
    assert build_result(make_spec(), {}, outcome).status == "inconclusive"
    evidence = "the memory cgroup's oom_kill count rose by 1 during the trial (memory.events)"
    seen = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: -9}, logs={0: tmp_path / "none.log"},
                         oom_evidence=evidence)  # fmt: skip
    result = build_result(make_spec(), {}, seen)
    assert result.status == "oom_host" and evidence in (result.error or "")


def test_missing_report_takes_the_error_line_from_the_rank_log(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("Traceback (most recent call last):\nModuleNotFoundError: No module named 'x'\n")
    outcome = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: 1}, logs={0: log})
    result = build_result(make_spec(), {}, outcome)
    assert (result.status, result.error) == ("error", "ModuleNotFoundError: No module named 'x'")


def test_timeout_and_parent_budget_stop_override_the_exit_codes_they_caused() -> None:
    killed = {0: -9}
    timed_out = LaunchOutcome(ranks=range(1), wall_s=5.0, timed_out=True, exit_codes=killed)
    assert build_result(make_spec(timeout_s=5), {}, timed_out).status == "timeout"
    breach = BudgetBreach(rank=0, rss_bytes=300 << 20, budget_bytes=200 << 20)
    stopped = LaunchOutcome(ranks=range(1), wall_s=1.0, budget_breach=breach, exit_codes=killed)
    result = build_result(make_spec(host_memory_budget_bytes=200 << 20), {}, stopped)
    assert result.status == "over_budget"
    assert "enforced cap" in (result.error or "")


def test_budget_checked_on_reported_peaks_for_cpu_only() -> None:
    outcome = LaunchOutcome(ranks=range(1), wall_s=1.0)
    over = make_spec(host_memory_budget_bytes=100 << 20)
    assert build_result(over, {0: ok_report(0, rss=150 << 20)}, outcome).status == "over_budget"
    assert build_result(over, {0: ok_report(0, rss=90 << 20)}, outcome).status == "ok"


# --- throughput arithmetic -----------------------------------------------------------------------


def test_flops_count_recompute_as_hardware_work_only() -> None:
    plain = flops_per_token(params=1_000_000, num_layers=2, hidden_size=64, seq_len=128, grad_checkpointing=False)
    ckpt = flops_per_token(params=1_000_000, num_layers=2, hidden_size=64, seq_len=128, grad_checkpointing=True)
    assert plain.model == plain.hardware == 6 * 1_000_000 + 12 * 2 * 64 * 128
    assert ckpt.model == plain.model
    assert ckpt.hardware == pytest.approx(plain.hardware * 4 / 3)
    assert throughput([], 4, 128, 1, flops=plain, peak_tflops=None) is None


# --- launch commands -----------------------------------------------------------------------------


def test_local_launcher_runs_world_size_one_directly_and_more_under_torchrun(tmp_path: Path) -> None:
    direct = LocalLauncher().plan(make_spec())
    argv = direct.command(tmp_path / "spec.json", tmp_path, 0.0)
    assert argv[1:3] == ["-m", "autotune.trial.worker.main"]
    assert direct.env["RANK"] == "0" and direct.env["WORLD_SIZE"] == "1"
    two_nodes = make_spec(nprocs_per_node=2, nodes=2)
    plan = LocalLauncher(node_rank=1, master_addr="10.0.0.1", master_port=29555).plan(two_nodes)
    argv = plan.command(tmp_path / "spec.json", tmp_path, 0.0)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert {
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=2",
        "--master-addr=10.0.0.1",
        "--master-port=29555",
    } <= set(argv)
    assert list(plan.ranks) == [2, 3]


def test_local_launcher_refuses_a_multi_node_trial_without_a_shared_port() -> None:
    with pytest.raises(UserError, match="master_port"):
        LocalLauncher().plan(make_spec(nodes=2))


def test_slurm_launcher_builds_one_srun_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv("RANK", "5")  # left over from an outer launcher: must not reach the tasks
    spec = make_spec(device="cuda", nprocs_per_node=4, nodes=2)
    plan = SlurmLauncher(workdir=tmp_path, master_addr="gpu01").plan(spec)
    argv = plan.command(tmp_path / "spec.json", tmp_path, 0.0)
    assert argv[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    assert argv[7:9] == ["-m", "autotune.trial.worker.main"]
    assert plan.env["MASTER_ADDR"] == "gpu01" and "RANK" not in plan.env
    assert list(plan.ranks) == list(range(8))
    assert first_hostname("gpu[01-02]", run=lambda *cmd: "gpu01\ngpu02\n") == "gpu01"


def test_slurm_launcher_needs_an_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(UserError, match="SLURM allocation"):
        SlurmLauncher().plan(make_spec())


def test_the_trial_package_never_imports_torch() -> None:
    code = "import sys, autotune.trial, autotune.trial.launch.warm; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "False"


def test_waits_for_the_driver_to_free_gpu_memory() -> None:
    readings = iter([{0: 9 << 30}, {0: 5 << 30}, {0: 1 << 30}])
    assert wait_for_release({0: 1 << 30}, poll_s=0.0, read_used=lambda: next(readings))
    assert not wait_for_release({0: 1 << 30}, timeout_s=0.05, poll_s=0.01, read_used=lambda: {0: 9 << 30})
    assert wait_for_release(None)
    used = nvml_used_bytes()  # None without an NVIDIA driver, as on the CPU test machines
    assert used is None or all(v >= 0 for v in used.values())
