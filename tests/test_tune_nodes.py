"""Multi-node direct tuning (`--nodes`) without SLURM: a master port chosen per trial and passed to every
node's launcher; two "nodes" on localhost on the CPU backend."""

from __future__ import annotations

import pytest
from tests.fakes.requests import tune_request

from autotune import tune
from autotune.core.ladder import Rung
from autotune.trial.launch.nodes import LocalNodesLauncher, merge_node_results
from autotune.trial.trial_types import RankMetrics, TrialResult, TrialSpec

SPEC = TrialSpec(model_config={}, architecture="X", family="decoder-only", ds_config={}, seq_len=8, nodes=2)


def test_every_node_gets_the_same_fresh_master_port_and_its_own_rank() -> None:
    ports = iter([29511, 29622])
    launcher = LocalNodesLauncher(port_source=lambda: next(ports))
    first = launcher.launchers(SPEC)
    assert [(n.node_rank, n.master_port, n.master_addr) for n in first] == [
        (0, 29511, "127.0.0.1"),
        (1, 29511, "127.0.0.1"),
    ]
    assert all(n.plan(SPEC).ranks == range(n.node_rank, n.node_rank + 1) for n in first)
    assert {n.master_port for n in launcher.launchers(SPEC)} == {29622}  # a new port for the next trial


def test_node_results_merge_to_the_root_cause() -> None:
    ok = TrialResult(status="ok", ranks=[RankMetrics(0)], step_times_s=[1.0], samples_per_s=4.0, wall_s=3.0)
    oom = TrialResult(status="oom_gpu", error="CUDA out of memory", ranks=[RankMetrics(1)], wall_s=5.0)
    broken = TrialResult(status="error", error="connection reset", ranks=[RankMetrics(2)], wall_s=4.0)
    merged = merge_node_results([broken, oom, ok])
    assert (merged.status, merged.error, merged.wall_s) == ("oom_gpu", "CUDA out of memory", 5.0)
    assert [r.rank for r in merged.ranks] == [0, 1, 2]
    both = merge_node_results(
        [ok, TrialResult(status="ok", ranks=[RankMetrics(1)], step_times_s=[1.0], samples_per_s=4.0)]
    )
    assert both.ok and both.samples_per_s == 4.0 and [r.rank for r in both.ranks] == [0, 1]


@pytest.mark.slow
def test_two_node_direct_tuning_on_localhost(tmp_path) -> None:
    two_nodes = dict(gpus=1, nodes=2, seq_len=32, rungs=(Rung.Z0,), use_cache=False)
    result = tune(tune_request(tmp_path, **two_nodes, micro_batches=(2,), max_trials=2))
    assert result.verified and result.candidate is not None and result.trials_launched >= 1
    trial = result.report.to_json()["trials"][0]
    assert trial["result"]["status"] == "ok", trial["result"]["error"]
    assert [r["rank"] for r in trial["result"]["ranks"]] == [0, 1]  # one rank on each "node"
    assert result.ds_config["train_batch_size"] == 2 * 2
