"""Warm workers across nodes: one launch of every node serves trial after trial, as the one-node pool does.

The design the simulator chose for multi-node tunes (benchmarks/records/multinode_design_sim_2026-11-29.md: a median
of 2 full-allocation launches against 17 when every trial is a fresh launch, the same picks). The pool is the
one-node `WarmWorkerPool` (trial/launch/warm.py) with its request/report protocol unchanged: every rank polls
`requests/<index>.json` in the pool directory and writes its own report into the trial's directory, so the
directory must be one every node sees (the SLURM launcher requires one already). One trial's reports are read
together, all ranks at once, so a node's failure is the trial's (the root cause first, as
`merge_node_results` does for the fresh multi-node launchers). Here is only how the workers start:

- inside SLURM (`SrunStart`): one background `srun` step, one task per rank, `--kill-on-bad-exit=1`: a rank that
  fails ends the step, the pool sees its launcher gone, and the next trial starts a new step;
- outside SLURM (`LocalNodesStart`): one torchrun per node with one master address and port, each with its node
  rank, as `LocalNodesLauncher` runs a fresh trial (nodes are processes on this host; a remote node would need a
  command prefix that runs its launcher there, which is not wired, as for the fresh launcher).

A trial's leftovers in a worker are watched as on one node (host and device memory, pinned blocks, and the ZeRO++
process groups that only a multi-node trial makes: trial/worker/deepspeed_globals.py); the chooser
(trial/launch/chooser.py) confirms the pick in a fresh launch of every node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from autotune.errors import UserError
from autotune.trial.launch.local import torchrun_command, torchrun_exit_codes
from autotune.trial.launch.processes import free_port, spawn
from autotune.trial.launch.slurm import (
    DEFAULT_MASTER_PORT,
    first_hostname,
    srun_command,
    srun_exit_codes,
    step_refusal,
)
from autotune.trial.launch.warm import launcher_log
from autotune.trial.trial_types import TrialSpec


class LocalNodesStart:
    """Every node's torchrun on this host, one master address and a port chosen per start."""

    ranks_here = True

    def __init__(
        self,
        python: str = sys.executable,
        master_addr: str = "127.0.0.1",
        port_source: Callable[[], int] = free_port,
    ) -> None:
        self.python = python
        self.master_addr = master_addr
        self.port_source = port_source

    def ranks_per_host(self, spec: TrialSpec) -> int:
        """Every node's ranks: the "nodes" share this host's cores (nodes.py local_nodes_threads)."""
        return spec.world_size

    def refuse(self, spec: TrialSpec) -> None:
        if spec.nodes < 2:
            raise UserError("warm workers across nodes run several nodes; one node runs in the one-node pool")

    def commands(self, spec: TrialSpec, serve: list[str]) -> list[list[str]]:
        """One torchrun per node, all with the same master port (torchrun's static rendezvous meets there)."""
        port = self.port_source()
        return [
            torchrun_command(self.python, spec, node, self.master_addr, master_port=port, worker=serve)
            for node in range(spec.nodes)
        ]

    def start(self, spec: TrialSpec, serve: list[str], env: dict[str, str], pool_dir: Path) -> list[subprocess.Popen]:
        return [
            spawn(command, {**env, "AUTOTUNE_NODE_RANK": str(node)}, launcher_log(pool_dir, node), pool_dir)
            for node, command in enumerate(self.commands(spec, serve))
        ]

    def exit_codes(self, spec: TrialSpec, pool_dir: Path, codes: list[int | None]) -> dict[int, int]:
        """Every node's torchrun names its own failed ranks (global ranks) in its log."""
        found: dict[int, int] = {}
        for node in range(spec.nodes):
            log = launcher_log(pool_dir, node)
            found.update(torchrun_exit_codes(log.read_text(errors="replace") if log.exists() else ""))
        return found


class SrunStart:
    """One `srun` step across the allocation, one task per rank, running the serve loop (ranks from SLURM_*)."""

    ranks_here = False  # ranks on other hosts: their RSS is not readable from here

    def __init__(
        self,
        python: str = sys.executable,
        *,
        srun: str = "srun",
        master_addr: str | None = None,  # default: first host of SLURM_JOB_NODELIST
        master_port: int = DEFAULT_MASTER_PORT,
    ) -> None:
        self.python = python
        self.srun = srun
        self.master_addr = master_addr
        self.master_port = master_port

    def ranks_per_host(self, spec: TrialSpec) -> int:
        return spec.nprocs_per_node

    def refuse(self, spec: TrialSpec) -> None:
        if "SLURM_JOB_ID" not in os.environ:
            raise UserError("warm workers across nodes through srun need a SLURM allocation (run inside salloc/sbatch)")

    def start(self, spec: TrialSpec, serve: list[str], env: dict[str, str], pool_dir: Path) -> list[subprocess.Popen]:
        master = self.master_addr or first_hostname(env.get("SLURM_JOB_NODELIST", ""))
        env = {**env, "MASTER_ADDR": master, "MASTER_PORT": str(self.master_port)}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # the worker takes its rank from SLURM_* (worker/main.py)
            env.pop(name, None)
        serve = without_owner(serve)
        return [spawn(srun_command(self.srun, self.python, spec, serve), env, launcher_log(pool_dir), pool_dir)]

    def exit_codes(self, spec: TrialSpec, pool_dir: Path, codes: list[int | None]) -> dict[int, int]:
        log = launcher_log(pool_dir)
        text = log.read_text(errors="replace") if log.exists() else ""
        if refused := step_refusal(text):  # every start would fail the same way: one clear line, as SlurmLauncher
            raise UserError(
                f"srun cannot start the warm workers' {spec.world_size} task(s) ({spec.nodes} node(s) x"
                f" {spec.nprocs_per_node}) in SLURM job {os.environ.get('SLURM_JOB_ID', '?')}: {refused}"
            )
        return srun_exit_codes(text)


def without_owner(serve: list[str]) -> list[str]:
    """The serve arguments without `--owner-pid`: on another node that pid is nobody's, and the worker would exit at
    once (worker/owner_watch.py watch_owner). The pool's heartbeat stays: it is what stops the step's workers when
    this tuner is killed with SIGKILL, which leaves srun (our child) running (trial/launch/heartbeat.py)."""
    if "--owner-pid" not in serve:
        return serve
    at = serve.index("--owner-pid")
    return serve[:at] + serve[at + 2 :]
