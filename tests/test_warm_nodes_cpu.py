"""Warm workers across nodes for real: DeepSpeed on the CPU backend with two "nodes" on this machine (one master
address, a torchrun per node), slow-marked: two hpZ trials in one process (passing only with the ZeRO++ groups
released, trial/worker/deepspeed_globals.py) and in one warm pool, a whole two-node tune with the new default path,
and the hook across two local nodes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.fakes.requests import tune_request
from tests.fakes.trials import GENEROUS_TIMEOUT_S, cpu_ops_built, marked_env, survivors, tiny_spec  # noqa: F401

from autotune import tune
from autotune.core.ladder import Candidate, Rung
from autotune.request.context import TuneContext
from autotune.search.records import LaunchPurpose, SearchEvent
from autotune.trial.launch.chooser import open_launchers
from autotune.trial.launch.processes import free_port
from autotune.trial.launch.warm import WarmWorkerPool
from autotune.trial.launch.warm_nodes import LocalNodesStart
from autotune.trial.trial_types import TrialSpec
from autotune.tuning.trials import request_facts

REPO = Path(__file__).resolve().parents[1]


def hpz_spec(*, nprocs: int = 1, nodes: int = 2) -> TrialSpec:
    """ZeRO-3 with hpZ over both ranks, the model built under zero.Init (partition_parameters.py:1118-1120 creates
    the hpZ group, asserting none is there yet: deepspeed/utils/groups.py:938-939)."""
    spec = tiny_spec(Rung.Z3, nprocs=nprocs, nodes=nodes)
    zero = {**spec.ds_config["zero_optimization"], "zero_hpz_partition_size": 2}
    return dataclasses.replace(spec, ds_config={**spec.ds_config, "zero_optimization": zero}, zero_init=True)


# Two hpZ trials run the way a warm worker runs them (run_rank twice in one process, two ranks under torchrun),
# with the worker's release of the ZeRO++ groups kept, or replaced by nothing ("kept").
_TWO_HPZ_TRIALS = """
import json, os, sys, time
from pathlib import Path
from autotune.trial.trial_types import TrialSpec
from autotune.trial.worker import train_steps
from autotune.trial.worker.deepspeed_globals import zeropp_groups_left
from autotune.trial.worker.main import export_placement, placement_from_env
from autotune.trial.worker.memory import MemoryTracker
spec, release = TrialSpec(**json.loads(sys.argv[1])), sys.argv[2] == "release"
if not release:
    train_steps.release_zeropp_groups = lambda: 0
placement = placement_from_env(os.environ)
export_placement(placement)
train_steps.import_runtime("cpu")
memory = MemoryTracker("cpu", 0)
train_steps.init_distributed("cpu", 0)
after = []
for _ in range(2):
    report = train_steps.run_rank(spec, placement, train_steps.PhaseClock(time.time()), memory)
    after.append({"status": report.status, "error": report.error, "groups_left": zeropp_groups_left()})
Path(sys.argv[3], f"rank{placement.rank}.json").write_text(json.dumps(after))
"""


def two_hpz_trials_in_one_process(spec: TrialSpec, way: str, out: Path) -> dict[int, list[dict]]:
    """Each rank writes its own file: ranks sharing torchrun's stdout would interleave their lines."""
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    command += ["--no-python", sys.executable, "-c", _TWO_HPZ_TRIALS, json.dumps(spec.to_dict()), way, str(out)]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=GENEROUS_TIMEOUT_S, cwd=REPO)
    found = {int(path.stem.removeprefix("rank")): json.loads(path.read_text()) for path in out.glob("rank*.json")}
    assert sorted(found) == [0, 1], run.stderr[-3000:]
    return found


@pytest.mark.slow
def test_two_hpz_trials_in_one_process_pass_only_with_the_zeropp_groups_released(tmp_path: Path) -> None:
    spec = hpz_spec(nprocs=2, nodes=1)
    released = two_hpz_trials_in_one_process(spec, "release", tmp_path / "released")
    for trials in released.values():
        assert [t["status"] for t in trials] == ["ok", "ok"], trials
        assert [t["groups_left"] for t in trials] == [0, 0]
    kept = two_hpz_trials_in_one_process(spec, "kept", tmp_path / "kept")
    for trials in kept.values():
        assert trials[0]["status"] == "ok" and trials[0]["groups_left"] == 1, trials
        assert trials[1]["status"] == "error", trials
        assert "ZeRO parameter intra parallel group is already initialized" in trials[1]["error"]


@pytest.mark.slow
def test_two_hpz_trials_in_one_warm_pool_across_two_nodes_run_in_one_launch() -> None:
    mark, env = marked_env()
    spec = hpz_spec(nodes=2)
    with WarmWorkerPool(env=env, start=LocalNodesStart()) as pool:
        first, second = pool.run(spec), pool.run(spec)
        assert pool.restarts == 1 and pool.recycled == []  # nothing held back: no replacement between them
    for result in (first, second):
        assert result.status == "ok", result.error
        assert [r.rank for r in result.ranks] == [0, 1]  # one rank on each "node", merged into one result
    assert survivors(mark) == []


@pytest.mark.slow
@pytest.mark.parametrize("workers_busy_before", [True, False], ids=["pick-after-other-trials", "pick-first"])
def test_a_two_node_tune_runs_warm_workers_across_nodes_and_confirms_the_pick_in_a_fresh_launch(
    tmp_path: Path, workers_busy_before: bool
) -> None:
    """The launchers `tune` opens for two CPU "nodes" (the one chooser: warm workers across both, the pick confirmed
    in a fresh launch of both). Workers that already ran a trial (another micro-batch's, before the tune) leave the
    pick a warm trial: it runs once more in a fresh two-node launch. Fresh workers make the tune's first trial, the
    pick here, the first of their launch: a fresh two-node launch's figures already, and nothing is launched again."""
    replaced: list[str] = []

    def observe(event: SearchEvent) -> None:
        if event.message and event.message.startswith("new trial workers"):
            replaced.append(event.message)

    two_nodes = dict(gpus=1, nodes=2, seq_len=32, rungs=(Rung.Z0,), use_cache=False)
    request = tune_request(tmp_path, **two_nodes, micro_batches=(1, 2), max_trials=3)
    with open_launchers(request_facts(request, os.environ)) as launchers:
        if workers_busy_before:
            other = TuneContext.build(request, outputs=False).spec(Candidate(Rung.Z0, 1))
            assert launchers.trials.run(other).status == "ok"
        result = tune(request, observe=observe, launcher=launchers)
    assert result.verified and result.candidate is not None
    report = result.report.to_json()
    trials = report["trials"]
    choice = report["choice"]
    picked = {key: choice[key] for key in ("rung", "micro_batch", "grad_checkpointing")}
    warm = [t for t in trials if t["candidate"] == picked and t["purpose"] != LaunchPurpose.FRESH]
    assert warm and choice.get("peak_in_fresh_process") is True  # measured in warm workers, its peak a fresh one's
    confirmed = [t for t in trials if t["purpose"] == LaunchPurpose.FRESH]
    assert len(confirmed) == (1 if workers_busy_before else 0)
    assert warm[-1]["result"]["first_in_process"] is not workers_busy_before
    fresh = confirmed or warm  # the trial the pick's fresh figures come from: a launch's first
    assert fresh[-1]["candidate"] == picked and fresh[-1]["result"]["status"] == "ok"
    assert fresh[-1]["result"]["first_in_process"] and [r["rank"] for r in fresh[-1]["result"]["ranks"]] == [0, 1]
    # one warm launch of every node, any replacement, and the fresh confirmation's launch where there is one
    assert report["process_starts"] == 1 + len(replaced) + len(confirmed)
    text = result.report_path.read_text()
    measured = "1 fresh, full-scale" if confirmed else "the pick's own trial the first of its launch"
    assert f"launch(es) of all 2 nodes: {measured}" in text
    assert "in a fresh launch of all 2 nodes" in text
    assert result.ds_config["train_batch_size"] == result.candidate.micro_batch * 2


def json_documents(text: str) -> list[dict]:
    decoder, documents, position = json.JSONDecoder(), [], 0
    while text[position:].strip():
        document, position = decoder.raw_decode(text, len(text) - len(text[position:].lstrip()))
        documents.append(document)
    return documents


@pytest.mark.slow
def test_the_hook_across_two_local_nodes_tunes_in_warm_workers_and_every_rank_gets_the_same_config(
    tmp_path: Path,
) -> None:
    """`torchrun --nnodes 2 --no-python autotune hook` twice on this machine (node ranks 0 and 1, one master): the
    hook's one chooser (hook/trial_facts.py) runs the trials in warm workers across both "nodes" and confirms the
    pick in a fresh two-node launch; both nodes' hooks end with the same bytes."""
    hook = ["autotune", "hook", "--device", "cpu", "--model", "tiny-gpt2", "--micro-batches", "1,2", "--rungs", "z0"]
    hook += ["--seq-len", "32", "--max-trials", "3", "--memory-budget", "2GiB", "--trial-timeout", "400", "--json"]
    port = free_port()
    nodes = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}"]
        command += ["--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}", "--no-python", *hook]
        command += ["--cache-dir", str(tmp_path / "shared"), "--out", str(tmp_path / f"node{node}" / "ds_config.json")]
        (tmp_path / f"node{node}").mkdir()
        nodes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    results = []
    for process in nodes:
        stdout, stderr = process.communicate(timeout=2 * GENEROUS_TIMEOUT_S)
        assert process.returncode == 0, stderr[-3000:]
        results.extend(json_documents(stdout))
    assert sorted(r["role"] for r in results) in (["follower", "leader"], ["hit", "leader"])
    assert {r["status"] for r in results} == {"complete"} and {r["job"]["world_size"] for r in results} == {2}
    configs = [(tmp_path / f"node{node}" / "ds_config.json").read_bytes() for node in (0, 1)]
    assert configs[0] == configs[1] and json.loads(configs[0])["train_batch_size"] in (2, 4)
    reports = [json.loads(p.read_text()) for p in tmp_path.glob("node*/*autotune-report.json")]
    assert reports, sorted(str(p) for p in tmp_path.rglob("*report*"))
    report = reports[0]
    choice = report["choice"]
    picked = {key: choice[key] for key in ("rung", "micro_batch", "grad_checkpointing")}
    # the pick's fresh figure: its confirmation, or its own trial where that was the first of a launch of both nodes
    fresh = [t for t in report["trials"] if t["candidate"] == picked and t["result"]["first_in_process"]]
    assert fresh and [r["rank"] for r in fresh[-1]["result"]["ranks"]] == [0, 1]
    assert fresh[-1]["result"]["status"] == "ok" and choice["peak_in_fresh_process"] is True
