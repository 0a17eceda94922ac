"""Locked memory is a limit: RLIMIT_MEMLOCK and the memory cgroup are probed, and a config that would mlock more than
`ulimit -l` allows is ruled out (tune) or flagged (check, plan --config) with the reason, never run to an abort.

The predicate is DeepSpeed's own: with DS_PIN_MEMORY_BACKEND=native its pin path mlocks (estimate/pinned.py), and
a process without CAP_IPC_LOCK over its limit aborts (measured; see the slow test). Root holds CAP_IPC_LOCK, which
lifts the limit, so the subprocess tests drop it with setpriv where they run as root.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.launchers import CountingLauncher

from autotune import tune
from autotune.core.ladder import Rung
from autotune.errors import NothingFitsError
from autotune.hardware.machine_probe import LockedMemory, _cgroup_limit, probe_locked_memory
from autotune.tuner import TuneRequest

LIMIT = 65536  # `ulimit -l 64`, the limit the shared-machine session tried


def _unprivileged(argv: list[str]) -> list[str]:
    """`argv` without CAP_IPC_LOCK: as root through setpriv, otherwise as is (no capabilities to drop)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_IPC_LOCK, so ulimit -l would not bind")
    return ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", *argv]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (LIMIT, LIMIT))


def test_the_probe_reads_ulimit_and_cap_ipc_lock_of_a_real_process() -> None:
    code = (
        "from autotune.hardware.machine_probe import probe_locked_memory as p; "
        "m = p(); print(m.rlimit_bytes, m.binding_bytes)"
    )
    done = subprocess.run(
        _unprivileged([sys.executable, "-c", code]), preexec_fn=_limited, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [str(LIMIT), str(LIMIT)]
    here = probe_locked_memory()
    assert here.binding_bytes is None or here.binding_bytes == here.rlimit_bytes


@pytest.mark.parametrize(
    "cgroup,files,expected",
    [
        ("0::/job\n", {"job/memory.max": "8589934592\n"}, 8 << 30),
        ("0::/job\n", {"job/memory.max": "max\n"}, None),
        ("4:memory:/docker/abc\n0::/\n", {"memory/docker/abc/memory.limit_in_bytes": "4294967296\n"}, 4 << 30),
        ("4:memory:/outside\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),
    ],
)
def test_the_memory_cgroup_limit_is_read_in_v1_and_v2(tmp_path: Path, cgroup: str, files: dict, expected) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _cgroup_limit(cgroup, tmp_path) == expected


def test_cap_ipc_lock_lifts_the_limit() -> None:
    assert LockedMemory(LIMIT, cap_ipc_lock=True).binding_bytes is None
    assert LockedMemory(LIMIT, cap_ipc_lock=False).binding_bytes == LIMIT


def test_an_offload_rung_that_would_mlock_past_the_limit_is_ruled_out_not_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native pinning under `ulimit -l 64` without CAP_IPC_LOCK: no offload trial is launched, the report says why."""
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    monkeypatch.setattr(
        "autotune.hardware.machine_probe.probe_locked_memory", lambda: LockedMemory(LIMIT, cap_ipc_lock=False)
    )
    launcher = CountingLauncher()
    request = TuneRequest.of(
        model="tiny-gpt2", device="cpu", memory_budget="2GiB", seq_len=64, rungs=(Rung.Z2_OFFLOAD_OPT, Rung.Z0),
        micro_batches=(1, 2), out=str(tmp_path / "ds.json"), use_cache=False,
    )  # fmt: skip
    result = tune(request, launcher=launcher)
    assert launcher.specs and not any(s.ds_config["zero_optimization"].get("offload_optimizer") for s in launcher.specs)
    assert result.candidate.rung is Rung.Z0
    skipped = " ".join(str(s.to_json()) for s in result.report.skipped)
    assert "ulimit -l 64.0 KiB" in skipped and "mlock" in skipped
    only_offload = request.updated(rungs=(Rung.Z2_OFFLOAD_OPT,), out=str(tmp_path / "only_offload.json"))
    with pytest.raises(NothingFitsError, match="ulimit -l"):
        tune(only_offload, launcher=CountingLauncher())


def test_check_and_plan_flag_a_config_whose_locked_need_exceeds_the_limit(tmp_path: Path) -> None:
    config = tmp_path / "offload.json"
    config.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
            }
        )
    )
    env = {**os.environ, "DS_PIN_MEMORY_BACKEND": "native", "COLUMNS": "400"}
    target = ["--model", "gpt2", "--gpu-type", "a100-80gb"]
    for argv, code in ((["check", str(config), *target, "--json"], 1), (["plan", *target, "--config", str(config)], 3)):
        done = subprocess.run(
            _unprivileged([sys.executable, "-m", "autotune", *argv]),
            preexec_fn=_limited, capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        said = done.stdout + done.stderr
        assert done.returncode == code, said
        assert "ulimit -l 64.0 KiB" in said and "DS_PIN_MEMORY_BACKEND=native" in said and "Traceback" not in said
    plain = subprocess.run(
        [sys.executable, "-m", "autotune", "check", str(config), *target, "--json"],
        capture_output=True, text=True, env={**env, "DS_PIN_MEMORY_BACKEND": "torch"}, timeout=300,
    )  # fmt: skip
    assert "ulimit -l" not in plain.stdout  # torch's pin path does not mlock (estimate/pinned.py)


@pytest.mark.slow
def test_real_trials_agree_with_the_rule_on_both_sides_of_the_limit(tmp_path: Path) -> None:
    """DeepSpeed's own native pin path, unprivileged: at 64 KiB the offload rung is ruled out and the pick runs;
    at 8 MiB (tiny-gpt2's ZeRO-2 offload locks about 1.9 MiB) the same rung is tried, pins for real and completes.
    Without the rule the 64 KiB trial aborts (SIGABRT from deepspeed_pin_tensor.cpp:48, seen before the rule)."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    roomy = 8 << 20
    if hard != resource.RLIM_INFINITY and hard < roomy:
        pytest.skip(f"the hard memlock limit {hard} is below the 8 MiB the roomy case needs")
    env = {**os.environ, "DS_PIN_MEMORY_BACKEND": "native"}
    common = ["--model", "tiny-gpt2", "--device", "cpu", "--memory-budget", "1GiB", "--seq-len", "32"]
    common += ["--micro-batches", "1", "--no-cache"]
    outcomes = {}
    for limit, rungs in ((LIMIT, "z2+offload_opt,z0"), (roomy, "z2+offload_opt")):
        out = tmp_path / str(limit) / "ds.json"
        argv = [sys.executable, "-m", "autotune", *common, "--rungs", rungs, "--max-trials", "1", "--out", str(out)]
        done = subprocess.run(
            _unprivileged(argv), preexec_fn=lambda s=limit: resource.setrlimit(resource.RLIMIT_MEMLOCK, (s, hard)),
            capture_output=True, text=True, env=env, timeout=1500,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        outcomes[limit] = (json.loads(out.read_text())["zero_optimization"], done.stderr)
    small, said = outcomes[LIMIT]
    assert "offload_optimizer" not in small and "ruled out: locks" in said and "SIGABRT" not in said
    roomy_zero, _ = outcomes[roomy]
    assert roomy_zero["offload_optimizer"]["pin_memory"] is True
