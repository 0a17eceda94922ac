"""Multi-node trials without SLURM: one LocalLauncher per node, a master address and port chosen per trial.

`autotune --nodes N` outside a SLURM allocation used to fail at the first trial ("needs master_port"):
nothing chose the rendezvous for a direct tune. Here every trial gets a fresh free port on the master
node, and every node's launcher runs at the same time with its node_rank, so torchrun's rendezvous
meets. Nodes are processes on this host (`host_command` None); a remote node needs a command prefix
that runs the launcher there (e.g. ssh), which is not wired yet.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from autotune.trial.launch.local import LocalLauncher
from autotune.trial.launch.processes import cpu_threads_per_rank, free_port
from autotune.trial.trial_types import TrialResult, TrialSpec


def local_nodes_threads(spec: TrialSpec, env: Mapping[str, str]) -> dict[str, str]:
    """OMP_NUM_THREADS for ranks of `spec` all on this host, where neither `env` nor this process sets it.

    Nodes here are processes of one host, so every node's ranks share its cores: OpenMP threads per rank are the
    host's cores over all of them, not over one node's (processes.py cpu_threads_per_rank). Measured
    (benchmarks/records/multinode_warm_cpu_2026-11-29.md): two one-rank "nodes" on 2 cores with 2 threads each ran
    ZeRO-0 at 10-57 samples/s in fresh launches, with 1 thread each at 245-525; real nodes each own their cores.
    """
    if "OMP_NUM_THREADS" in env or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(cpu_threads_per_rank(spec.world_size))}


# Root cause first, as in outcome.py: a node that ran out of memory makes the others fail to connect.
_PRIORITY = ("oom_gpu", "oom_host", "over_budget", "timeout", "inconclusive", "error", "ok")


def merge_node_results(results: list[TrialResult]) -> TrialResult:
    """One result for the whole trial: the worst node's status and error, every node's ranks, node 0's
    rates (step times are all-reduced, so every node measured the same steps)."""
    worst = min(results, key=lambda r: _PRIORITY.index(r.status) if r.status in _PRIORITY else 0)
    first = results[0]
    ranks = sorted((rank for r in results for rank in r.ranks), key=lambda rank: rank.rank)
    base = first if worst.ok else worst
    return replace(base, ranks=ranks, wall_s=max(r.wall_s for r in results))


class LocalNodesLauncher:
    """Runs each trial as `spec.nodes` nodes on this host, with a master address and port it chooses."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        master_addr: str = "127.0.0.1",
        workdir: Path | None = None,
        port_source: Callable[[], int] = free_port,
    ) -> None:
        self.env = dict(env or {})
        self.master_addr = master_addr
        self.workdir = workdir
        self.port_source = port_source

    def launchers(self, spec: TrialSpec) -> list[LocalLauncher]:
        port = self.port_source()
        threads = local_nodes_threads(spec, self.env)
        return [
            LocalLauncher(
                env={**self.env, **threads, "AUTOTUNE_NODE_RANK": str(node)},
                workdir=self.workdir,
                node_rank=node,
                master_addr=self.master_addr,
                master_port=port,
                use_torchrun=True,
            )
            for node in range(spec.nodes)
        ]

    def run(self, spec: TrialSpec) -> TrialResult:
        launchers = self.launchers(spec)
        with ThreadPoolExecutor(max_workers=len(launchers)) as pool:
            results = list(pool.map(lambda launcher: launcher.run(spec), launchers))
        return merge_node_results(results)
