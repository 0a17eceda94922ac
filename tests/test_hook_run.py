"""`run_hook` with a stand-in tune(): roles, byte-identical configs, fallbacks, failures, concurrency.

The stand-in (tests/fakes/hook.py FakeTune) keeps these tests fast; tests/test_hook_e2e.py runs the same paths
with real DeepSpeed trials through the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.fakes.hook import (
    PLANNED,
    TUNED,
    FakeTune,
    PartialReadWatcher,
    hook_request,
    slurm_env,
    slurm_launcher_chooser,
)

from autotune.core.ladder import Candidate, Rung
from autotune.core.stop import StopReason
from autotune.errors import NothingFitsError, UserError
from autotune.hook import HookError, HookRequest, HookResult, JobOverrides, run_hook
from autotune.hook.coordinate import SharedSlot
from autotune.report.assumptions import assumptions_path, read_assumptions
from autotune.trial.launch.chooser import JobFacts, choose_launch
from autotune.tuner import ds_config_for

REPO = Path(__file__).resolve().parents[1]


def slurm_hook(request: HookRequest, environ: dict[str, str], tune_fn: FakeTune) -> HookResult:
    """run_hook inside a (simulated) SLURM job of several nodes."""
    return run_hook(request, environ=environ, tune_fn=tune_fn, launcher_chooser=slurm_launcher_chooser)


def test_one_tunes_then_every_later_call_is_a_hit_with_identical_bytes(tmp_path: Path) -> None:
    fake = FakeTune()
    first = run_hook(hook_request(tmp_path / "a/ds_config.json", tmp_path / "shared"), environ={}, tune_fn=fake)
    second = run_hook(hook_request(tmp_path / "b/ds_config.json", tmp_path / "shared"), environ={}, tune_fn=fake)
    assert (first.role, second.role, len(fake.requests)) == ("leader", "hit", 1)
    assert (tmp_path / "a/ds_config.json").read_bytes() == (tmp_path / "b/ds_config.json").read_bytes()
    assert json.loads((tmp_path / "a/ds_config.json").read_text()) == TUNED
    assert first.record.status == "complete" and first.to_dict()["sha256"] == second.to_dict()["sha256"]
    tuned_with = fake.requests[0]
    assert (tuned_with.hardware.gpus, tuned_with.hardware.nodes) == (1, 1)
    assert tuned_with.output.cache_dir == str(tmp_path / "shared")  # a directory, as for `autotune --cache-dir`
    assert tuned_with.output.out != str(tmp_path / "a/ds_config.json")  # staged privately, then copied
    # what `autotune check` reads lies beside every process's --out, leader's and hit's alike
    for out in ("a", "b"):
        record = read_assumptions(tmp_path / out / "ds_config.json")
        assert record is not None
        assert (record["model"], record["seq_len"], record["verified"]) == ("tiny-gpt2", 32, True)
    assert (
        assumptions_path(tmp_path / "a/ds_config.json").read_bytes()
        == assumptions_path(tmp_path / "b/ds_config.json").read_bytes()
    )


def test_the_job_shape_comes_from_slurm_and_changes_the_key(tmp_path: Path) -> None:
    fake = FakeTune()
    result = slurm_hook(hook_request(tmp_path / "ds.json", tmp_path), slurm_env(), tune_fn=fake)
    assert (fake.requests[0].hardware.gpus, fake.requests[0].hardware.nodes, result.job.world_size) == (4, 2, 8)
    facts = fake.launchers[0]  # trials would run in warm workers of one srun step spanning both nodes
    choice = choose_launch(facts) if isinstance(facts, JobFacts) else None
    assert choice is not None and (choice.kind, choice.confirm_fresh, facts.nodes) == ("warm_srun", True, 2)
    alone = run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=fake)
    assert alone.key != result.key and alone.role == "leader"


def test_best_verified_trial_is_written_when_tuning_crashes_and_strict_refuses_it(tmp_path: Path) -> None:
    candidate = Candidate(Rung.Z1, 2)
    fake = FakeTune(trials=(candidate,), error=RuntimeError("launcher lost"))
    request = hook_request(tmp_path / "ds.json", tmp_path / "shared")
    result = run_hook(request, environ={}, tune_fn=fake)
    assert (result.role, result.record.status, result.record.source) == ("leader", "fallback", "best verified so far")
    assert result.record.verified and "tuning failed: RuntimeError: launcher lost" in (result.record.warning or "")
    expected = ds_config_for(fake.requests[0], candidate)
    assert json.loads((tmp_path / "ds.json").read_text()) == expected
    strict_out = tmp_path / "strict.json"
    with pytest.raises(HookError, match="--strict: no config written"):
        slurm_hook(hook_request(strict_out, tmp_path / "shared", strict=True), slurm_env(), tune_fn=fake)
    assert not strict_out.exists()


def test_plan_only_recommendation_when_nothing_was_verified(tmp_path: Path) -> None:
    fake = FakeTune(error=RuntimeError("worker crashed"))
    result = run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=fake)
    assert (result.record.status, result.record.source, result.record.verified) == ("fallback", "plan only", False)
    assert json.loads((tmp_path / "ds.json").read_text()) == PLANNED
    plan = fake.requests[-1]
    assert (plan.hardware.device, plan.hardware.gpu_memory, plan.training.precision, plan.output.use_cache) == (
        "cuda",
        f"{2**30}B",
        "bf16",
        False,
    )
    assert "NOT verified" in (result.record.warning or "")


def test_time_budget_stop_is_a_fallback_with_a_warning(tmp_path: Path) -> None:
    fake = FakeTune(stop_reason=StopReason.TIME_BUDGET)
    result = run_hook(hook_request(tmp_path / "ds.json", tmp_path, time_budget_s=5), environ={}, tune_fn=fake)
    assert (result.record.status, result.record.source) == ("fallback", "best verified so far")
    assert "time budget spent" in (result.record.warning or "")
    assert fake.requests[0].search.trial_timeout_s == 5  # no single trial may outlast the budget


def test_bad_input_fails_every_rank_of_the_job_with_one_tuning(tmp_path: Path) -> None:
    fake = FakeTune(error=UserError("--seq-len 4096 exceeds the model's 256 positions"))
    for rank in (0, 5):
        with pytest.raises(UserError, match="exceeds the model's 256 positions"):
            slurm_hook(hook_request(tmp_path / "ds.json", tmp_path), slurm_env(rank=rank), tune_fn=fake)
    assert len(fake.requests) == 1 and not (tmp_path / "ds.json").exists()


def test_nothing_fits_is_a_failure_not_a_fallback(tmp_path: Path) -> None:
    fake = FakeTune(error=NothingFitsError("nothing fits 1x1 CPU rank"))
    with pytest.raises(NothingFitsError, match="nothing fits"):
        run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=fake)
    assert not (tmp_path / "ds.json").exists()


def test_later_jobs_reuse_a_finished_tuning_but_retry_a_fallback(tmp_path: Path) -> None:
    fake = FakeTune()
    slurm_hook(hook_request(tmp_path / "ds.json", tmp_path), slurm_env("1"), tune_fn=fake)
    later = slurm_hook(hook_request(tmp_path / "ds.json", tmp_path), slurm_env("2"), tune_fn=fake)
    assert (later.role, len(fake.requests)) == ("hit", 1)
    failing = FakeTune(error=RuntimeError("boom"))
    shared = tmp_path / "other"
    slurm_hook(hook_request(tmp_path / "ds.json", shared), slurm_env("1"), tune_fn=failing)
    same_job = slurm_hook(hook_request(tmp_path / "ds.json", shared), slurm_env("1", rank=3), tune_fn=failing)
    assert same_job.role == "hit" and same_job.fallback
    next_job = slurm_hook(hook_request(tmp_path / "ds.json", shared), slurm_env("2"), tune_fn=FakeTune())
    assert next_job.role == "leader" and next_job.record.status == "complete"


def test_corrupt_published_result_is_retuned_not_trusted(tmp_path: Path) -> None:
    fake = FakeTune()
    first = run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=fake)
    record_path = SharedSlot(tmp_path / "hook", first.key).record_path
    record_path.write_text(record_path.read_text().replace('\\"stage\\": 2', '\\"stage\\": 0'))
    again = run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=fake)
    assert (again.role, again.ignored, len(fake.requests)) == ("leader", "checksum mismatch", 2)
    assert json.loads((tmp_path / "ds.json").read_text()) == TUNED


def test_contradictory_environment_is_a_user_error_before_any_tuning(tmp_path: Path) -> None:
    fake = FakeTune()
    env = {**slurm_env(), "SLURM_GPUS_ON_NODE": "8"}
    with pytest.raises(UserError, match="SLURM_GPUS_ON_NODE=8 says 8 GPU"):
        run_hook(
            hook_request(tmp_path / "ds.json", tmp_path, device="cuda"),
            environ=env,
            tune_fn=fake,
            gpu_prober=lambda: [object(), object()],  # type: ignore[list-item]
        )
    with pytest.raises(UserError, match="--gpus 2 contradicts"):
        request = hook_request(tmp_path / "ds.json", tmp_path)
        run_hook(HookRequest(request.tuning, request.shared_dir, JobOverrides(gpus=2)), environ=env, tune_fn=fake)
    assert fake.requests == []


HOOK_PROCESS = """
import json, sys
from tests.fakes.hook import FakeTune, hook_request, slurm_launcher_chooser
from autotune.hook import run_hook

out, shared, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
result = run_hook(hook_request(out, shared), tune_fn=FakeTune(delay_s=delay), launcher_chooser=slurm_launcher_chooser)
print(json.dumps(result.to_dict()))
"""


def start_hook(out: Path, shared: Path, delay_s: float, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOOK_PROCESS, str(out), str(shared), str(delay_s)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_concurrent_hook_processes_one_tunes_all_identical(tmp_path: Path) -> None:
    shared_out = tmp_path / "shared-fs" / "ds_config.json"  # ranks 0-3 share one path, 4-7 write their own
    outs = [shared_out] * 4 + [tmp_path / f"node-local-{rank}" / "ds_config.json" for rank in range(4, 8)]
    with PartialReadWatcher(sorted(set(outs))) as watcher:
        processes = [start_hook(out, tmp_path / "cache", 3.0, slurm_env(rank=rank)) for rank, out in enumerate(outs)]
        results = []
        for process in processes:
            # every process imports DeepSpeed to re-validate the config it read: minutes on 2 loaded cores
            stdout, stderr = process.communicate(timeout=600)
            assert process.returncode == 0, stderr
            results.append(json.loads(stdout))
    roles = sorted(r["role"] for r in results)
    assert roles.count("leader") == 1, roles
    assert {r["sha256"] for r in results} == {results[0]["sha256"]}
    assert len({out.read_bytes() for out in outs}) == 1
    assert watcher.reads > 0 and watcher.bad == []


def test_a_hook_killed_mid_tuning_leaves_no_stale_lock(tmp_path: Path) -> None:
    killed = start_hook(tmp_path / "killed.json", tmp_path, 3600.0, {})
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "hook").glob("*.leader.json")):
            assert killed.poll() is None and time.monotonic() < deadline, killed.stderr.read() if killed.stderr else ""
            time.sleep(0.1)
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
    finally:
        killed.kill()
        killed.communicate()
    started = time.monotonic()
    result = run_hook(hook_request(tmp_path / "ds.json", tmp_path), environ={}, tune_fn=FakeTune())
    assert (result.role, result.record.status) == ("leader", "complete")
    assert time.monotonic() - started < 30 and not (tmp_path / "killed.json").exists()
