"""One node: the worker started directly (world size 1) or under torchrun (several ranks, or nodes)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from autotune.errors import UserError
from autotune.trial.launch.heartbeat import HeartbeatTiming
from autotune.trial.launch.processes import free_port, one_rank_env, own_trial_env
from autotune.trial.launch.spawn import WORKER_MODULE, LaunchPlan, launch_trial, trial_directory, worker_args
from autotune.trial.trial_types import TrialResult, TrialSpec

# torchrun's failure table: "rank      : 1 (local_rank: 1)" then "exitcode  : -9 (pid: 1234)".
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_exit_codes(log_text: str) -> dict[int, int]:
    """Per-rank exit codes of failed workers, which torchrun reports only in its log (it exits 1 itself)."""
    return {int(rank): int(code) for rank, code in _TORCHRUN_FAILURE.findall(log_text)}


def torchrun_command(
    python: str, spec: TrialSpec, node_rank: int, master_addr: str, master_port: int, worker: list[str]
) -> list[str]:
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={spec.nprocs_per_node}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        # our own rendezvous, said outright: nothing an outer job set (PET_RDZV_*) may take its place
        "--rdzv-backend=static",
        f"--rdzv-endpoint={master_addr}:{master_port}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m", WORKER_MODULE, *worker,
    ]  # fmt: skip


class LocalLauncher:
    """Runs trials on this node and leaves no process behind.

    World size 1 runs the worker directly: one interpreter and one torch import fewer than torchrun.
    Several ranks, or several nodes, go through torchrun. A multi-node trial without SLURM: on each
    node start a LocalLauncher with the same master_addr/master_port and node_rank 0..nodes-1, then
    call run(spec) on each at the same time; each result covers that node's ranks (step times and
    rates are the same on every node, memory is per rank).
    """

    def __init__(
        self,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        *,
        node_rank: int = 0,
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        use_torchrun: bool | None = None,  # None: only when there is more than one rank
        poll_interval_s: float = 0.1,
        kill_grace_s: float = 5.0,
        heartbeat: HeartbeatTiming = HeartbeatTiming(),  # trial/launch/heartbeat.py
    ) -> None:
        self.python = python
        self.env = dict(env or {})
        self.workdir = workdir
        self.node_rank = node_rank
        self.master_addr = master_addr
        self.master_port = master_port
        self.use_torchrun = use_torchrun
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self.heartbeat = heartbeat

    def run(self, spec: TrialSpec) -> TrialResult:
        with trial_directory(self.workdir) as trial_dir:
            return launch_trial(spec, self.plan(spec), trial_dir, self.poll_interval_s, kill_grace_s=self.kill_grace_s)

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        if spec.nodes > 1 and self.master_port is None:
            raise UserError("a multi-node trial needs master_port, the same on every node's launcher")
        if not 0 <= self.node_rank < spec.nodes:
            raise UserError(f"node_rank {self.node_rank} is outside the trial's {spec.nodes} node(s)")
        port = self.master_port or free_port()
        owner = os.getpid()
        first = self.node_rank * spec.nprocs_per_node
        ranks = range(first, first + spec.nprocs_per_node)
        env = own_trial_env({**os.environ, **self.env})
        torchrun = self.use_torchrun if self.use_torchrun is not None else spec.world_size > 1
        if torchrun:
            return LaunchPlan(
                command=lambda spec_path, out, at: torchrun_command(
                    self.python,
                    spec,
                    self.node_rank,
                    self.master_addr,
                    master_port=port,
                    worker=worker_args(spec_path, out, at, owner, heartbeat=self.heartbeat),
                ),
                ranks=ranks,
                env=env,
                rank_exit_codes=lambda _code, log: torchrun_exit_codes(log),
                master_port=port,
                heartbeat=self.heartbeat,
            )
        if spec.world_size != 1:
            raise UserError("more than one rank needs torchrun (use_torchrun=False allows world size 1 only)")
        env.update(one_rank_env(self.master_addr, port))
        return LaunchPlan(
            command=lambda spec_path, out, at: [
                self.python,
                "-m",
                WORKER_MODULE,
                *worker_args(spec_path, out, at, owner, heartbeat=self.heartbeat),
            ],
            ranks=ranks,
            env=env,
            rank_exit_codes=lambda code, _log: {} if code is None else {0: code},
            master_port=port,
            heartbeat=self.heartbeat,
        )
