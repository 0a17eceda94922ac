"""Real DeepSpeed trials on the CPU backend (gloo): every launcher path, every way a trial can end.

Each test marks its processes through the launcher's env and then checks that none survives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.fakes.trials import (
    TINY_GPT2,
    assert_measured,
    cpu_ops_built,  # noqa: F401 (an autouse fixture: every trial here needs the ops)
    marked_env,
    survivors,
    tiny_spec,
    wait_until,
)

from autotune.core.ladder import Rung
from autotune.trial import (
    FreshAfterWarm,
    LocalLauncher,
    WarmWorkerPool,
    run_trial,
)
from autotune.trial.launch.processes import free_port
from autotune.trial.launch.warm import WARM_GROWTH_LIMIT_BYTES
from autotune.trial.worker.faults import FAULT_ENV, LEAK_BYTES, fault_value

# --- cold trials ---------------------------------------------------------------------------------


def test_cold_trial_reports_rates_memory_and_where_the_time_went() -> None:
    mark, env = marked_env()
    result = run_trial(tiny_spec(peak_tflops=1.0), LocalLauncher(env=env))
    assert_measured(result)
    assert list(result.phases) == ["launch", "imports", "dist_init", "model_build", "engine_init", "warmup", "measured"]
    assert result.startup_s and 0 < result.startup_s < result.wall_s
    assert result.mfu and 0 < result.mfu < 1
    assert not survivors(mark)


@pytest.mark.slow
def test_two_rank_trial_under_torchrun() -> None:
    mark, env = marked_env()
    result = run_trial(tiny_spec(Rung.Z2, nprocs=2), LocalLauncher(env=env))
    assert_measured(result, world_size=2)
    assert not survivors(mark)


def test_hanging_trial_is_killed_at_the_timeout_without_orphans() -> None:
    mark, env = marked_env(**{FAULT_ENV: fault_value("hang", "start")})
    result = run_trial(tiny_spec(timeout_s=8.0), LocalLauncher(env=env, kill_grace_s=2.0))
    assert result.status == "timeout"
    assert 8.0 <= result.wall_s < 8.0 + 15.0
    assert not survivors(mark)


def test_rank_killed_by_sigkill_without_oom_evidence_is_inconclusive() -> None:
    """A SIGKILL from outside (here the worker's own) is not the OOM killer's unless the kernel says so."""
    mark, env = marked_env(**{FAULT_ENV: fault_value("sigkill", "entry")})
    result = run_trial(tiny_spec(), LocalLauncher(env=env))
    assert result.status == "inconclusive"
    assert "SIGKILL" in (result.error or "") and "no out-of-memory evidence" in (result.error or "")
    assert not survivors(mark)


@pytest.mark.slow
def test_sigkilled_rank_under_torchrun_fails_the_whole_trial() -> None:
    """Rank 1 dies mid-training; rank 0, stuck in a collective or failing in it, must not hide the cause."""
    mark, env = marked_env(**{FAULT_ENV: fault_value("sigkill", "step", rank=1)})
    result = run_trial(tiny_spec(Rung.Z1, nprocs=2), LocalLauncher(env=env))
    assert (result.status, "rank 1" in (result.error or "")) == ("inconclusive", True)
    assert not survivors(mark)


def test_workers_exit_when_the_tuner_itself_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the tuner no chance to clean up: each worker watches its owner instead."""
    mark, env = marked_env(**{FAULT_ENV: fault_value("hang", "entry")})
    code = (
        "from autotune.trial import LocalLauncher, TrialSpec, run_trial\n"
        f"launcher = LocalLauncher(env={env!r}, workdir={str(tmp_path)!r})\n"  # no temp dir left behind
        f"run_trial(TrialSpec(**{tiny_spec().to_dict()!r}), launcher)\n"
    )
    tuner = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_until(lambda: bool(survivors(mark)), timeout_s=120), "the worker never started"
    finally:
        tuner.kill()
        tuner.wait()
    assert wait_until(lambda: not survivors(mark), timeout_s=10)


def test_over_budget_trial_is_stopped_early_by_a_parent_that_never_imports_torch() -> None:
    code = (
        "import json, sys; from autotune.trial import run_trial, TrialSpec\n"
        f"spec = TrialSpec(**{tiny_spec(host_memory_budget_bytes=64 << 20).to_dict()!r})\n"
        "result = run_trial(spec)\n"
        "print(json.dumps({'torch_imported': 'torch' in sys.modules, **result.to_dict()}))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert (result["status"], result["torch_imported"]) == ("over_budget", False)
    assert "enforced cap" in result["error"]
    assert result["phases"] == {}  # stopped by the parent's RSS watch before the rank could finish


@pytest.mark.slow
def test_two_node_trial_from_two_launchers_on_localhost() -> None:
    """How the pre-launch hook runs multi-node without SLURM: one LocalLauncher per node, same master."""
    mark, env = marked_env()
    spec = tiny_spec(Rung.Z3, nprocs=1, nodes=2)
    port = free_port()
    launchers = [LocalLauncher(env=env, node_rank=node, master_port=port) for node in (0, 1)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        node0, node1 = pool.map(lambda launcher: launcher.run(spec), launchers)
    assert_measured(node0)
    assert_measured(node1)
    assert [r.rank for r in node0.ranks + node1.ranks] == [0, 1]
    assert node0.step_times_s == node1.step_times_s  # all-reduced: every rank times the same steps
    assert not survivors(mark)


# --- warm workers --------------------------------------------------------------------------------


@pytest.mark.slow
def test_warm_pool_runs_every_rung_and_restarts_after_model_code_raises() -> None:
    mark, env = marked_env()
    with WarmWorkerPool(env=env) as pool:
        first = [run_trial(tiny_spec(rung), pool) for rung in (Rung.Z0, Rung.Z1)]
        too_long = run_trial(tiny_spec(seq_len=TINY_GPT2["n_positions"] + 64), pool)  # past the position table
        second = [run_trial(tiny_spec(rung), pool) for rung in (Rung.Z2, Rung.Z3)]
        second.append(run_trial(tiny_spec(Rung.Z3_OFFLOAD_ALL, grad_checkpointing=True), pool))
        assert pool.restarts == 2  # once at the start, once after the failed trial
    assert (too_long.status, too_long.error) == ("error", "IndexError: index out of range in self")
    assert "engine_init" in too_long.phases  # it failed in the first step, after start-up
    for result in first + second:
        assert_measured(result)
    cold, warm = first[0], [first[1], *second[1:]]
    assert "imports" not in cold.phases and cold.startup_s is not None
    assert all(r.startup_s is not None and r.startup_s < cold.startup_s for r in warm)
    assert not survivors(mark)


def test_a_fresh_confirmation_beside_the_pool_runs_after_the_warm_workers_have_stopped() -> None:
    """The GPU default's fresh-process confirmation (tuning/trials.py launcher_for): the warm workers hold memory
    while idle, so they stop before the fresh trial starts; the next warm trial would start new ones."""
    mark, env = marked_env()
    with WarmWorkerPool(env=env) as pool:
        confirm = FreshAfterWarm(pool, LocalLauncher(env=env))
        warm = run_trial(tiny_spec(), pool)
        workers = pool._workers
        assert workers is not None and workers.process.poll() is None  # idle, alive, holding its memory
        fresh = run_trial(tiny_spec(), confirm)
        assert workers.process.poll() is not None and pool._workers is None  # stopped before the fresh one ran
        assert (pool.restarts, confirm.launches) == (1, 1)
    for result in (warm, fresh):
        assert_measured(result)
    assert not survivors(mark)


def test_warm_pool_replaces_workers_whose_memory_grows_between_trials() -> None:
    """A trial's leftovers (here a fault that keeps 96 MiB per trial) must not reach the next trial's measurement."""
    mark, env = marked_env(**{FAULT_ENV: fault_value("leak", "step")})
    replaced: list[tuple[int, str]] = []
    with WarmWorkerPool(env=env, on_replace=lambda grown, what: replaced.append((grown, what))) as pool:
        first, second = run_trial(tiny_spec(), pool), run_trial(tiny_spec(), pool)  # the second grows past the first
        assert pool.restarts == 1 and len(pool.recycled) == 1
        assert pool.recycled[0] >= LEAK_BYTES - WARM_GROWTH_LIMIT_BYTES // 2  # measured, give or take allocator noise
        third = run_trial(tiny_spec(), pool)
        assert pool.restarts == 2  # fresh workers for the third
        fourth = run_trial(tiny_spec(), pool)  # warm again: the third set the new workers' floor, the fourth grew
        assert (pool.restarts, len(pool.recycled)) == (2, 2)
    assert replaced == [(grown, "host memory") for grown in pool.recycled]  # what the tuner's progress line reports
    for result in (first, second, third, fourth):
        assert_measured(result)
    assert third.startup_s and fourth.startup_s and fourth.startup_s < third.startup_s  # third cold, fourth warm
    assert not survivors(mark)
