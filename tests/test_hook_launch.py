"""Trial launchers for the hook: a real two-"node" trial on one machine, and hooks run as torchrun workers (the
choice of launcher, tune's and the hook's alike, is tests/test_launcher_choice.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.fakes.hook import job_env

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.hook.env import JobEnv
from autotune.models import resolve_model
from autotune.trial.launch.hostfile import HostfileLauncher, write_hostfile
from autotune.trial.launch.processes import free_port
from autotune.trial.trial_types import TrialResult, TrialSpec


def job(nodes: int, nodelist: tuple[str, ...] = (), scheduler: str = "none", port: int | None = None) -> JobEnv:
    return job_env(nodes, nodelist=nodelist, scheduler=scheduler, port=port)


def json_documents(text: str) -> list[dict]:
    decoder, documents, position = json.JSONDecoder(), [], 0
    while text[position:].strip():
        document, position = decoder.raw_decode(text, len(text) - len(text[position:].lstrip()))
        documents.append(document)
    return documents


def tiny_spec(nodes: int, nprocs_per_node: int = 1) -> TrialSpec:
    source = resolve_model("tiny-gpt2")
    world = nodes * nprocs_per_node
    return TrialSpec(
        model_config=source.config,
        architecture=source.architecture or "GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(Rung.Z2, 1), TrainSettings(world_size=world, precision="fp32")),
        seq_len=32,
        device="cpu",
        nprocs_per_node=nprocs_per_node,
        nodes=nodes,
        max_steps=4,
        timeout_s=200,
    )


@pytest.mark.slow
def test_two_nodes_on_one_machine_run_one_real_multi_node_trial(tmp_path: Path) -> None:
    """Two deepspeed launchers on localhost, node ranks 0 and 1, one master: a world-size-2 gloo trial."""
    hostfile = write_hostfile(tmp_path / "hostfile", ["node0", "node1"], 1)
    port = free_port()
    spec = tiny_spec(nodes=2)
    results: dict[int, TrialResult] = {}

    def node(rank: int) -> None:
        results[rank] = HostfileLauncher(hostfile, "127.0.0.1", port, node_rank=rank).run(spec)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(results) == [0, 1]
    for rank, result in results.items():
        assert result.status == "ok", result.error
        assert [metrics.rank for metrics in result.ranks] == [rank]  # each launcher answers for its node's rank
        assert result.samples_per_s and result.samples_per_s > 0
    # one trial, not two: both nodes measured the same synchronised steps
    assert results[0].samples_per_s == pytest.approx(results[1].samples_per_s, rel=0.05)


@pytest.mark.slow
def test_hooks_run_as_torchrun_workers_tune_once_with_a_real_trial(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 2 --no-python autotune hook`: two hooks, one tunes a world-size-2 trial."""
    hook = ["autotune", "hook", "--device", "cpu", "--model", "tiny-gpt2", "--micro-batches", "1", "--rungs", "z0"]
    hook += ["--seq-len", "32", "--max-trials", "1", "--memory-budget", "2GiB", "--trial-timeout", "240", "--json"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--no-python", *hook]
    command += ["--cache-dir", str(tmp_path / "shared"), "--out", str(tmp_path / "ds_config.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env={**os.environ}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json_documents(done.stdout)  # both workers print to torchrun's stdout
    assert sorted(r["role"] for r in results) in (["follower", "leader"], ["hit", "leader"])
    assert {r["status"] for r in results} == {"complete"} and {r["job"]["world_size"] for r in results} == {2}
    assert json.loads((tmp_path / "ds_config.json").read_text())["train_batch_size"] == 2
