"""Multi-node trials outside SLURM: the DeepSpeed launcher over a hostfile built from the job's node list.

The deepspeed launcher reads `host slots=N` lines, one per node, in rank order: the first host is
node rank 0. The file is written atomically because every node of a job may write the same shared
path at once, and the launcher must never read a half-written list.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_text
from autotune.trial.launch.heartbeat import HeartbeatTiming

if TYPE_CHECKING:
    from autotune.trial.launch.spawn import LaunchPlan
    from autotune.trial.trial_types import TrialResult, TrialSpec


def hostfile_text(hosts: Sequence[str], slots: int) -> str:
    if not hosts:
        raise UserError("cannot write a hostfile for an empty node list")
    if slots <= 0:
        raise UserError(f"a hostfile needs a positive slot count per node, got {slots}")
    if len(set(hosts)) != len(hosts):
        raise UserError(f"the node list repeats a host: {', '.join(hosts)}")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def write_hostfile(path: str | Path, hosts: Sequence[str], slots: int) -> Path:
    return atomic_write_text(path, hostfile_text(hosts, slots))


def read_hostfile(path: str | Path) -> list[tuple[str, int]]:
    """Hosts and slots from a DeepSpeed hostfile (comments and blank lines skipped)."""
    entries: list[tuple[str, int]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise UserError(f"cannot read hostfile {path}: {error.strerror or error}") from None
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        host, _, slots = text.partition(" ")
        slots = slots.strip()
        if not slots.startswith("slots=") or not slots[len("slots=") :].isdigit():
            raise UserError(f"hostfile {path} line {number}: expected 'HOST slots=N', got {line.strip()!r}")
        entries.append((host, int(slots[len("slots=") :])))
    if not entries:
        raise UserError(f"hostfile {path} lists no host")
    return entries


TRIAL_MASTER_PORT = 29531  # not torchrun's 29500 / 29400: the job's own rendezvous may be listening there


class HostfileLauncher:
    """`python -m deepspeed.launcher.runner --hostfile H ... -m autotune.trial.worker.main` for one trial.

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
        heartbeat: HeartbeatTiming = HeartbeatTiming(),  # trial/launch/heartbeat.py
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
        self.heartbeat = heartbeat

    def command(self, spec: TrialSpec, worker: list[str]) -> list[str]:
        from autotune.trial.launch.spawn import WORKER_MODULE

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
        from autotune.trial.launch.spawn import LaunchPlan, worker_args

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
            command=lambda spec_path, out, at: self.command(
                spec, worker_args(spec_path, out, at, heartbeat=self.heartbeat)
            ),
            ranks=ranks,
            env={**os.environ, **self.env},
            rank_exit_codes=lambda _code, _log: {},  # DeepSpeed's launcher names failed pids, not ranks
            master_port=self.master_port,
            heartbeat=self.heartbeat,
        )

    def run(self, spec: TrialSpec) -> TrialResult:
        from autotune.trial.launch.spawn import launch_trial, trial_directory

        with trial_directory(self.workdir) as trial_dir:
            return launch_trial(spec, self.plan(spec), trial_dir, self.poll_interval_s, kill_grace_s=self.kill_grace_s)
