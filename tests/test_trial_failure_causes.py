"""A failure is recorded for what it was: OOM classes from real error texts, OOM only with evidence, the rest
inconclusive (not cached, retried once, not a memory fact), and our own trials deaf to an outer job's torchrun.

Error texts and where they come from:
- "CUDA driver error: out of memory": torch's C10_CUDA_DRIVER_CHECK (torch/include/c10/cuda/driver_api.h:19,
  "CUDA driver error: " + cuGetErrorString, which is "out of memory" for CUDA_ERROR_OUT_OF_MEMORY).
- "NCCL WARN Failed to CUDA calloc 536870912 bytes": NCCL src/include/alloc.h ncclCudaCalloc,
  WARN("Failed to CUDA calloc %ld bytes", ...); the async variant "Failed to CUDA calloc async %ld bytes".
- A failed pinned host allocation: torch's CachingHostAllocator calls C10_CUDA_CHECK(cudaHostAlloc(...)), which
  raises "CUDA error: out of memory" (c10/cuda/CUDAException.cpp); DeepSpeed reaches it through
  accelerator/cuda_accelerator.py `pin_memory`: `return tensor.pin_memory()` (traceback as in DeepSpeed#2977).
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from tests.fakes.torch_errors import DistNetworkError

from autotune.trial.launch.oom_evidence import OomKillWatch, kernel_oom_record, oom_kill_files
from autotune.trial.launch.processes import launcher_variables, own_trial_env
from autotune.trial.outcome import LaunchOutcome, build_result, classify_exception, classify_line
from autotune.trial.trial_types import TrialSpec

CUDA_DRIVER_OOM = "CUDA driver error: out of memory"
NCCL_CALLOC = "node01:1234:1300 [0] include/alloc.h:103 NCCL WARN Failed to CUDA calloc 536870912 bytes"
NCCL_CALLOC_ASYNC = "ncclUnhandledCudaError: Failed to CUDA calloc async 2432 bytes"
CUDA_ERROR_OOM = (
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call, so the"
    " stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)
PINNED_TRACEBACK = """\
[2026-11-26 10:50:54,882] [INFO] [config.py:1003:print] {"offload_optimizer": {"device": "cpu", "pin_memory": true}}
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", line 479, in __init__
    self.single_partition_of_fp32_groups.append(get_accelerator().pin_memory(fp32_partition))
  File "/opt/conda/lib/python3.11/site-packages/deepspeed/accelerator/cuda_accelerator.py", line 293, in pin_memory
    return tensor.pin_memory()
RuntimeError: CUDA error: out of memory
"""
DEVICE_TRACEBACK_WITH_PINNED_CONFIG = """\
[2026-11-26 10:50:54,882] [INFO] [config.py:1003:print] {"offload_optimizer": {"device": "cpu", "pin_memory": true}}
Traceback (most recent call last):
  File "/opt/conda/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 2210, in forward
    loss = self.module(*inputs, **kwargs)
RuntimeError: CUDA error: out of memory
"""


def spec() -> TrialSpec:
    return TrialSpec(model_config={}, architecture="GPT2LMHeadModel", family="decoder-only", ds_config={}, seq_len=8)


def _raise_from_pin_memory() -> None:
    def pin_memory() -> None:  # stands for Tensor.pin_memory / DeepSpeed's accelerator pin_memory frame
        raise RuntimeError(CUDA_ERROR_OOM)

    pin_memory()


@pytest.mark.parametrize("text", [CUDA_DRIVER_OOM, NCCL_CALLOC, NCCL_CALLOC_ASYNC])
def test_driver_and_nccl_allocation_failures_are_gpu_oom(text: str) -> None:
    assert classify_exception(RuntimeError(text))[0] == "oom_gpu"
    assert classify_line(f"RuntimeError: {text}") == "oom_gpu"


def test_a_failed_pinned_host_allocation_is_host_memory_not_gpu() -> None:
    try:
        _raise_from_pin_memory()
    except RuntimeError as error:
        status, line = classify_exception(error)
    assert status == "oom_host" and "pinned host allocation" in line
    assert classify_exception(RuntimeError(CUDA_ERROR_OOM))[0] == "oom_gpu"  # raised elsewhere: the device's


def test_pinned_failure_is_told_apart_in_a_log_by_its_traceback_not_by_the_config_print(tmp_path: Path) -> None:
    pinned, device = tmp_path / "pinned.log", tmp_path / "device.log"
    pinned.write_text(PINNED_TRACEBACK)
    device.write_text(DEVICE_TRACEBACK_WITH_PINNED_CONFIG)
    for log, expected in ((pinned, "oom_host"), (device, "oom_gpu")):
        outcome = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: 1}, logs={0: log})
        assert build_result(spec(), {}, outcome).status == expected


def test_own_command_logs_use_the_same_matcher() -> None:
    from autotune.trial.own_command.script import ScriptOutcome, classify

    for log, expected in ((PINNED_TRACEBACK, "oom_host"), (NCCL_CALLOC, "oom_gpu"), (CUDA_DRIVER_OOM, "oom_gpu")):
        outcome = ScriptOutcome(exit_code=1, log_text=log, metric=None, wall_s=1.0)
        assert classify(outcome, 60, 5)[0] == expected


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        DistNetworkError("The client socket has failed to connect to [127.0.0.1]:9 (errno: 111 - Connection refused)."),
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"),
    ],
    ids=["enospc", "refused", "rendezvous", "gloo-peer"],
)
def test_file_system_and_network_failures_are_inconclusive(error: BaseException) -> None:
    assert classify_exception(error)[0] == "inconclusive"
    assert classify_exception(ValueError("bad config"))[0] == "error"


@pytest.mark.parametrize("code", [-9, -11, -6, 128 + 9, 128 + 11])
def test_a_signal_death_without_evidence_is_inconclusive(code: int, tmp_path: Path) -> None:
    outcome = LaunchOutcome(ranks=range(1), wall_s=1.0, exit_codes={0: code}, logs={0: tmp_path / "none.log"})
    result = build_result(spec(), {}, outcome)
    assert result.status == "inconclusive"


def test_only_sigkill_with_evidence_is_an_oom(tmp_path: Path) -> None:
    evidence = "kernel log: Out of memory: Killed process 4242 (python)"
    for code, expected in ((-9, "oom_host"), (-11, "inconclusive")):
        outcome = LaunchOutcome(
            ranks=range(1), wall_s=1.0, exit_codes={0: code}, logs={0: tmp_path / "x.log"}, oom_evidence=evidence
        )
        assert build_result(spec(), {}, outcome).status == expected


# --- the kernel's evidence ----------------------------------------------------------------------------------


def _cgroup_v2(tmp_path: Path, kills: int) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "job" / "step").mkdir(parents=True)
    events = root / "job" / "step" / "memory.events"
    events.write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\noom_group_kill 0\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/job/step\n")
    return root, proc


def test_cgroup_v2_oom_kill_count_is_the_evidence(tmp_path: Path) -> None:
    root, proc = _cgroup_v2(tmp_path, kills=2)
    watch = OomKillWatch.start(root, proc, kmsg=tmp_path / "no-kmsg")
    assert watch.evidence() is None  # nothing happened since the start
    (root / "job" / "step" / "memory.events").write_text("oom 2\noom_kill 3\n")
    assert "rose by 1" in (watch.evidence() or "")


def test_cgroup_v1_oom_control_is_read_too(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "memory" / "batch").mkdir(parents=True)
    (root / "memory" / "batch" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("9:pids:/\n4:memory:/batch\n0::/\n")
    assert oom_kill_files(root, proc) == [root / "memory" / "batch" / "memory.oom_control"]


def test_kernel_record_must_name_one_of_the_trials_pids(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"  # /dev/kmsg's record format: "prio,seq,usec,flags;text" (Documentation/ABI)
    kmsg.write_text(
        "6,1001,52000000,-;python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0\n"
        "3,1002,52000100,-;Out of memory: Killed process 4242 (python) total-vm:9000000kB, anon-rss:8000000kB\n"
    )
    assert "Killed process 4242" in (kernel_oom_record({4242}, kmsg) or "")
    assert kernel_oom_record({777}, kmsg) is None
    assert kernel_oom_record({4242}, tmp_path / "unreadable") is None


# --- an outer job's launcher variables --------------------------------------------------------------------


def _closed_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed once the socket is: nothing listens there


def test_own_trials_drop_an_outer_jobs_launcher_variables() -> None:
    outer = {"PATH": "/bin", "PET_RDZV_ENDPOINT": "127.0.0.1:9", "PET_NNODES": "4", "TORCHELASTIC_RUN_ID": "job"}
    assert launcher_variables(outer) == ["PET_NNODES", "PET_RDZV_ENDPOINT", "TORCHELASTIC_RUN_ID"]
    assert own_trial_env(outer) == {"PATH": "/bin"}


def test_torchrun_trials_name_their_own_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.trial.launch.local import LocalLauncher

    monkeypatch.setenv("PET_RDZV_ENDPOINT", f"127.0.0.1:{_closed_loopback_port()}")
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "outer-job")
    plan = LocalLauncher(use_torchrun=True, master_port=29777).plan(spec())
    command = plan.command(Path("spec.json"), Path("out"), 0.0)
    assert "--rdzv-backend=static" in command and "--rdzv-endpoint=127.0.0.1:29777" in command
    assert not launcher_variables(plan.env)


def test_own_command_mode_keeps_the_environment_and_says_what_it_saw(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from autotune.trial.own_command.script import ScriptLauncher

    monkeypatch.setenv("PET_RDZV_ENDPOINT", "127.0.0.1:9")
    launcher = ScriptLauncher(["python", "train.py", "--deepspeed", "{ds_config}"])
    with caplog.at_level("WARNING"):
        env = launcher._environment(spec(), 29500)
        launcher._environment(spec(), 29501)
    assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:9"
    said = [r.getMessage() for r in caplog.records if "PET_RDZV_ENDPOINT" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.slow  # ~33 s on the shared 2-core machine; test_torchrun_trials_name_their_own_rendezvous is quick
def test_a_real_torchrun_trial_ignores_pet_rdzv_endpoint_at_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun would otherwise join the outer job's endpoint (torch/distributed/run.py:790-793) and fail."""
    from tests.fakes.trials import assert_measured, marked_env, survivors, tiny_spec

    from autotune.trial import LocalLauncher, run_trial

    port = _closed_loopback_port()
    # An outer job's rendezvous on another host: c10d, not hosted here (is_host=false, as torchrun decides on a
    # node whose name is not the endpoint's), nothing listening (a closed loopback port: no traffic leaves the host)
    outer = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ID": "outer",
             "PET_RDZV_CONF": "is_host=false,read_timeout=10", "TORCHELASTIC_RUN_ID": "outer"}  # fmt: skip
    for name, value in outer.items():
        monkeypatch.setenv(name, value)
    mark, env = marked_env()
    result = run_trial(tiny_spec(timeout_s=120.0), LocalLauncher(env=env, use_torchrun=True))
    assert_measured(result, world_size=1)
    assert not survivors(mark)
    assert os.environ["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{port}"  # the caller's environment is untouched


# --- the tuner: an inconclusive trial is retried once, never cached, never a memory fact ------------------------


def test_a_sigkilled_worker_is_retried_once_not_cached_and_not_an_oom(tmp_path: Path) -> None:
    import json

    from tests.fakes.launchers import FaultInjectingLauncher
    from tests.fakes.requests import tune_request

    from autotune import tune
    from autotune.core.ladder import Rung
    from autotune.errors import TrialsFailedError

    request = tune_request(tmp_path, micro_batches=(2,), rungs=(Rung.Z0,))
    killed = FaultInjectingLauncher()  # SIGKILLed at the worker's entry, as `kill -9` would
    with pytest.raises(TrialsFailedError, match="inconclusive"):
        tune(request, launcher=killed)

    def tried(specs: list[TrialSpec]) -> list[str]:
        return [json.dumps([s.ds_config["zero_optimization"], s.ds_config["train_micro_batch_size_per_gpu"],
                            s.grad_checkpointing], sort_keys=True) for s in specs]  # fmt: skip

    distinct = set(tried(killed.specs))
    assert len(killed.specs) == 2 * len(distinct)  # each candidate once more, then given up
    report = json.loads((tmp_path / "autotune-report.json").read_text())
    assert {t["result"]["status"] for t in report["trials"]} == {"inconclusive"}
    assert report["calibration"]["oom_bounds"] == [] and report["calibration"]["samples"] == 0
    again = FaultInjectingLauncher()
    with pytest.raises(TrialsFailedError):
        tune(request, launcher=again)  # the next run launches them again: nothing was cached
    assert tried(again.specs) == tried(killed.specs)


# --- the search: only a failure of the modelled memory moves the memory model -----------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ("oom_host", "pinned host allocation failed (page-locked host memory): CUDA error: out of memory"),
        ("inconclusive", "rank 0 killed by SIGKILL with no out-of-memory evidence"),
    ],
    ids=["pinned-host", "inconclusive"],
)
def test_a_host_or_inconclusive_failure_on_a_gpu_run_does_not_raise_the_device_prediction(
    status: str, error: str
) -> None:
    from tests.fakes.machines import GIB, LinearMachine, LinearMemory
    from tests.fakes.searches import mode_search

    from autotune.core.ladder import Rung
    from autotune.trial.trial_types import TrialResult

    class HostFailing(LinearMachine):
        def run(self, candidate):  # the device would fit everything; the host side fails once
            if not self.launched:
                self.launched.append(candidate)
                return TrialResult(status=status, error=error), False
            return super().run(candidate)

    memory = LinearMemory()
    mode_search(HostFailing(memory_bytes=80 * GIB), memory, {}, [Rung.Z3]).run_search()
    assert memory.oom_calibrations == []
    device_oom = LinearMemory(optimizer_gib=2.0)  # believes the states small; the machine's are 12 GiB: a device OOM
    mode_search(LinearMachine(memory_bytes=16 * GIB), device_oom, {}, [Rung.Z3]).run_search()
    assert device_oom.oom_calibrations  # still teaches the model


# --- which rank the error names -------------------------------------------------------------------------------


def _two_ranks(tmp_path: Path, codes: dict[int, int]) -> LaunchOutcome:
    return LaunchOutcome(
        ranks=range(2), wall_s=1.0, exit_codes=codes, logs={rank: tmp_path / f"rank{rank}.log" for rank in range(2)}
    )


def test_the_rank_that_died_is_named_not_the_peer_torchrun_stopped(tmp_path: Path) -> None:
    """torch 2.13's torchrun lists the SIGTERMed survivor (rank 0) first and the root cause (rank 1, SIGKILL) after
    it; both read as inconclusive, and the error must name rank 1."""
    from autotune.trial.launch.local import torchrun_exit_codes

    table = (
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1167)  (SIGTERM)\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 1168)  (SIGKILL)\n"
    )  # torch 2.13.0 torchrun's failure table, a rank SIGKILLing itself while its peer sleeps
    codes = torchrun_exit_codes(table)
    assert codes == {0: -15, 1: -9}
    result = build_result(spec(), {}, _two_ranks(tmp_path, codes))
    assert result.status == "inconclusive" and (result.error or "").startswith("rank 1 killed by SIGKILL")


def test_a_peers_lost_connection_does_not_hide_the_rank_that_died(tmp_path: Path) -> None:
    from autotune.trial.rank_report import RankReport

    lost = RankReport(0, "inconclusive", "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    result = build_result(spec(), {0: lost}, _two_ranks(tmp_path, {1: -9}))
    assert result.status == "inconclusive" and (result.error or "").startswith("rank 1 killed by SIGKILL")


def test_a_ranks_own_error_is_not_hidden_by_the_peer_the_launcher_stopped(tmp_path: Path) -> None:
    from autotune.trial.rank_report import RankReport

    failed = RankReport(0, "error", "ValueError: bad batch shape")
    result = build_result(spec(), {0: failed}, _two_ranks(tmp_path, {1: -15}))
    assert (result.status, result.error) == ("error", "ValueError: bad batch shape")
    stopped_alone = build_result(spec(), {}, _two_ranks(tmp_path, {0: -15, 1: -15}))  # scancel: every rank
    assert stopped_alone.status == "inconclusive" and (stopped_alone.error or "").startswith("rank 0 killed by SIGTERM")
