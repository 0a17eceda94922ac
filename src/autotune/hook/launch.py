"""Which trial launcher the tuning process uses, so that trials span the job's whole allocation.

- one node: tune()'s default LocalLauncher (None), or one that ignores torchrun's agent store when
  the hook itself runs as a torchrun worker;
- several nodes inside SLURM: SlurmLauncher, one `srun` step across the allocation;
- several nodes elsewhere, with a node list: the DeepSpeed launcher over a hostfile built from it
  (`host slots=N` lines), which reaches the other nodes with pdsh, as `deepspeed --hostfile` does.

HostfileLauncher can also start one node's share only (`node_rank`, DeepSpeed's `--no_ssh`): one
launcher per node with the same master address and port, which is how the two-"node" test runs a
real multi-node trial on one machine, and how nodes without ssh between them can be driven.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError
from autotune.hook.env import JobEnv
from autotune.hook.hostfile import read_hostfile, write_hostfile

if TYPE_CHECKING:
    from autotune.trial.launch import LaunchPlan
    from autotune.trial.types import TrialLauncher, TrialResult, TrialSpec

TRIAL_MASTER_PORT = 29531  # not torchrun's 29500 / 29400: the job's own rendezvous may be listening there


class HostfileLauncher:
    """`python -m deepspeed.launcher.runner --hostfile H ... -m autotune.trial.worker` for one trial.

    The trial directory must be on a filesystem every node sees (ranks write their results there),
    and every node needs the same Python environment, as with any `deepspeed --hostfile` run.
    """

    def __init__(
        self,
        hostfile: Path,
        master_addr: str,
        master_port: int = TRIAL_MASTER_PORT,
        workdir: Path | None = None,
        *,
        node_rank: int | None = None,  # None: every node, through pdsh; else this node only (--no_ssh)
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        poll_interval_s: float = 0.2,
        kill_grace_s: float = 10.0,
    ) -> None:
        self.hostfile = Path(hostfile)
        self.master_addr = master_addr
        self.master_port = master_port
        self.workdir = workdir
        self.node_rank = node_rank
        self.python = python
        self.env = dict(env or {})
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s

    def command(self, spec: TrialSpec, worker: list[str]) -> list[str]:
        from autotune.trial.launch import WORKER_MODULE

        scope = ["--no_ssh", f"--node_rank={self.node_rank}"] if self.node_rank is not None else []
        return [
            self.python, "-u", "-m", "deepspeed.launcher.runner",
            f"--hostfile={self.hostfile}",
            f"--num_nodes={spec.nodes}",
            f"--num_gpus={spec.nprocs_per_node}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
            *scope,
            "--no_local_rank",
            "--module", WORKER_MODULE, *worker,
        ]  # fmt: skip

    def plan(self, spec: TrialSpec) -> LaunchPlan:
        from autotune.trial.launch import LaunchPlan, worker_args

        hosts = read_hostfile(self.hostfile)
        if len(hosts) < spec.nodes:
            raise UserError(f"hostfile {self.hostfile} lists {len(hosts)} host(s), the trial needs {spec.nodes}")
        if self.node_rank is None:
            ranks = range(spec.world_size)
        elif 0 <= self.node_rank < spec.nodes:
            ranks = range(self.node_rank * spec.nprocs_per_node, (self.node_rank + 1) * spec.nprocs_per_node)
        else:
            raise UserError(f"node_rank {self.node_rank} is outside the trial's {spec.nodes} node(s)")
        return LaunchPlan(
            command=lambda spec_path, out, at: self.command(spec, worker_args(spec_path, out, at)),
            ranks=ranks,
            env={**os.environ, **self.env},
            rank_exit_codes=lambda _code, _log: {},  # DeepSpeed's launcher names failed pids, not ranks
        )

    def run(self, spec: TrialSpec) -> TrialResult:
        from autotune.trial.launch import launch_trial, trial_directory

        with trial_directory(self.workdir) as trial_dir:
            return launch_trial(spec, self.plan(spec), trial_dir, self.poll_interval_s, self.kill_grace_s)


def _outside_torchrun(environ: Mapping[str, str]) -> dict[str, str]:
    """Environment overrides for trials started from inside a torchrun worker.

    torchrun tells its workers to use the agent's rendezvous store (TORCHELASTIC_USE_AGENT_STORE);
    a trial inheriting that waits for a store nobody serves, and times out.
    """
    return {"TORCHELASTIC_USE_AGENT_STORE": "False"} if "TORCHELASTIC_USE_AGENT_STORE" in environ else {}


def _trial_port(job: JobEnv) -> int:
    return TRIAL_MASTER_PORT + 1 if job.master_port == TRIAL_MASTER_PORT else TRIAL_MASTER_PORT


def choose_launcher(
    job: JobEnv,
    shared_dir: Path,
    environ: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
) -> TrialLauncher | None:
    """The launcher for the tuning process of `job`; trial directories go under the shared dir."""
    env = os.environ if environ is None else environ
    trial_env = _outside_torchrun(env)
    if job.nodes == 1:
        from autotune.trial import LocalLauncher

        return LocalLauncher(env=trial_env) if trial_env else None
    trials = shared_dir / "trials"
    if env.get("SLURM_JOB_ID"):
        from autotune.trial import SlurmLauncher

        # SLURM_OVERLAP: when the hook itself runs under srun, its step holds the node's resources, and
        # a trial step must share them or it waits forever; the hook processes use no GPU themselves.
        trial_env["SLURM_OVERLAP"] = "1"
        master = job.nodelist[0] if job.nodelist else None
        return SlurmLauncher(env=trial_env, workdir=trials, master_addr=master, master_port=_trial_port(job))
    if not job.nodelist:
        raise UserError(
            f"{job.nodes} nodes but no node list: run the hook inside SLURM, or pass --nodelist so the deepspeed"
            " launcher can reach the other nodes (over pdsh)"
        )
    if which("pdsh") is None:
        raise UserError("multi-node trials outside SLURM use the deepspeed launcher over pdsh, which is not installed")
    hostfile = write_hostfile(
        shared_dir / "hostfiles" / f"{job.job_id or os.getpid()}.hostfile", job.nodelist, job.gpus_per_node
    )
    return HostfileLauncher(hostfile, job.nodelist[0], _trial_port(job), trials, env=trial_env)
