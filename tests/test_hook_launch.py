"""Trial launchers for the hook: chosen from the job, and a real two-"node" trial on one machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build import TrainSettings, build_ds_config
from autotune.errors import UserError
from autotune.hook.env import JobEnv
from autotune.hook.launch import choose_launcher
from autotune.models import resolve_model
from autotune.trial import LocalLauncher, SlurmLauncher
from autotune.trial.hostfile import TRIAL_MASTER_PORT, HostfileLauncher, read_hostfile, write_hostfile
from autotune.trial.processes import free_port
from autotune.trial.types import TrialResult, TrialSpec


def job(nodes: int, nodelist: tuple[str, ...] = (), scheduler: str = "none", port: int | None = None) -> JobEnv:
    return JobEnv(scheduler, "9", nodes, 4, 0, 0, 0, nodelist, nodelist[0] if nodelist else None, port)  # type: ignore[arg-type]


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


def slurm_client(name: str) -> str | None:
    """shutil.which where SLURM's client tools are installed: the launcher is built here, never run."""
    return f"/usr/bin/{name}" if name == "srun" else None


def test_one_node_uses_the_default_local_launcher(tmp_path: Path) -> None:
    assert choose_launcher(job(1), tmp_path, environ={"SLURM_JOB_ID": "9"}) is None


def test_trials_started_from_a_torchrun_worker_do_not_wait_for_its_agent_store(tmp_path: Path) -> None:
    worker_env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "SLURM_JOB_ID": "9"}
    local = choose_launcher(job(1), tmp_path, environ=worker_env)
    assert isinstance(local, LocalLauncher) and local.env == {"TORCHELASTIC_USE_AGENT_STORE": "False"}
    srun = choose_launcher(job(2, ("a", "b")), tmp_path, environ=worker_env, which=slurm_client)
    assert isinstance(srun, SlurmLauncher) and srun.env["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_several_slurm_nodes_use_srun_with_trials_on_the_shared_dir(tmp_path: Path) -> None:
    slurm = {"SLURM_JOB_ID": "9"}
    launcher = choose_launcher(job(2, ("gpu07", "gpu08"), "slurm"), tmp_path, environ=slurm, which=slurm_client)
    assert isinstance(launcher, SlurmLauncher)
    assert launcher.workdir == tmp_path / "trials" and launcher.master_addr == "gpu07"
    assert launcher.env["SLURM_OVERLAP"] == "1" and launcher.master_port == TRIAL_MASTER_PORT


def test_several_nodes_outside_slurm_get_a_hostfile_for_the_deepspeed_launcher(tmp_path: Path) -> None:
    launcher = choose_launcher(job(2, ("h1", "h2"), port=TRIAL_MASTER_PORT), tmp_path, {}, which=lambda name: name)
    assert isinstance(launcher, HostfileLauncher)
    assert read_hostfile(launcher.hostfile) == [("h1", 4), ("h2", 4)]
    assert launcher.hostfile.read_text() == "h1 slots=4\nh2 slots=4\n"
    assert launcher.master_port != TRIAL_MASTER_PORT  # the job's own rendezvous port is left alone
    command = launcher.command(tiny_spec(2, 4), ["--spec", "s.json"])
    assert "--no_ssh" not in command and f"--hostfile={launcher.hostfile}" in command
    assert command[-5:] == ["--no_local_rank", "--module", "autotune.trial.worker", "--spec", "s.json"]


def test_several_nodes_without_a_way_to_reach_them_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no node list"):
        choose_launcher(job(2), tmp_path, {})
    with pytest.raises(UserError, match="srun, which is not on PATH"):
        choose_launcher(job(2, ("h1", "h2"), "slurm"), tmp_path, {"SLURM_JOB_ID": "9"}, which=lambda name: None)
    with pytest.raises(UserError, match="pdsh, which is not installed"):
        choose_launcher(job(2, ("h1", "h2")), tmp_path, {}, which=lambda name: None)


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
