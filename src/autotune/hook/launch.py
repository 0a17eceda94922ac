"""Which trial launcher the tuning process uses, so that trials span the job's whole allocation.

- one node: tune()'s default LocalLauncher (None), or one that ignores torchrun's agent store when
  the hook itself runs as a torchrun worker;
- several nodes inside SLURM: SlurmLauncher, one `srun` step across the allocation;
- several nodes elsewhere, with a node list: the DeepSpeed launcher over a hostfile built from it
  (`host slots=N` lines), which reaches the other nodes with pdsh, as `deepspeed --hostfile` does.

The launchers themselves live in trial/ (HostfileLauncher in trial/hostfile.py); HostfileLauncher can
also start one node's share only (`node_rank`, DeepSpeed's `--no_ssh`): one launcher per node with the
same master address and port, which is how the two-"node" test runs a real multi-node trial on one
machine, and how nodes without ssh between them can be driven.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError
from autotune.hook.env import JobEnv
from autotune.trial.hostfile import TRIAL_MASTER_PORT, HostfileLauncher, write_hostfile

if TYPE_CHECKING:
    from autotune.trial.types import TrialLauncher


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

        if which("srun") is None:
            raise UserError("multi-node trials inside SLURM run with srun, which is not on PATH")

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
