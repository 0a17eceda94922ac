"""Where a tuning's trials run: one decision from plain facts about the job, for `autotune tune` and the hook alike.

`autotune tune` reads its facts from the request and this process's environment; the hook reads them from the job
(its node list, its rendezvous port, the shared directory every node sees) and hands them to tune, which makes the
same decision with them. Every row below is tested, tune against hook, in tests/test_launcher_choice.py.

| nodes | inside SLURM | node list | `--trial-workers` | trials run in |
|---|---|---|---|---|
| 1 | either | either | `auto`, `warm` | warm workers (`WarmWorkerPool`) |
| 1 | either | either | `fresh` | a fresh process per trial (`LocalLauncher`) |
| >1 | yes | either | `auto`, `warm` | warm workers across nodes: one background `srun` step (`SrunStart`) |
| >1 | yes | either | `fresh` | one `srun` step per trial across the allocation (`SlurmLauncher`) |
| >1 | no | yes | `auto`, `fresh` | the DeepSpeed launcher over a hostfile of the list, pdsh (`HostfileLauncher`) |
| >1 | no | yes | `warm` | refused: warm workers over pdsh are not built |
| >1 | no | no, CPU | `auto`, `warm` | warm workers across nodes: a torchrun per node here (`LocalNodesStart`) |
| >1 | no | no, CPU | `fresh` | every node as processes on this host, per trial (`LocalNodesLauncher`) |
| >1 | no | no, GPUs | any | refused: the nodes' ranks would share this host's GPUs and measure the wrong memory |

`auto` confirms the pick in a fresh process wherever warm workers ran the trials, except on one node on the CPU
backend, where warm and fresh peaks were measured equal (benchmarks/README.md, "Warm workers and DeepSpeed's
leftovers"): across nodes no peaks were compared (two CPU "nodes" here gave the same pick warm and fresh and a tie in
its speed, benchmarks/records/multinode_warm_cpu_2026-11-29.md: speeds of one small search, not peaks), so the pick is
confirmed in a fresh launch of every node, the job's own shape (`FreshAfterWarm` around the row's `fresh` launcher),
unless the pick's own trial was the first of a warm launch, which started from a fresh process's state
(search/pick_decision.py Pick.confirm_fresh); `warm` never confirms. Warm workers across nodes
are the design the simulator chose (benchmarks/records/multinode_design_sim_2026-11-29.md: a median of 2
full-allocation launches per multi-node tune, against 17 with a fresh launch per trial, the same picks);
trial/launch/warm_nodes.py starts them. An own command runs every trial itself (`ScriptLauncher`), fresh. Started
from inside a torchrun worker, every row is the same, with the trials told not to wait for the agent's rendezvous
store (which nobody serves them). On the CPU backend every launcher gets glibc's mmap threshold lowered, so that peak
RSS is the working set (benchmarks/results/estimate.md).

Before this module, tune and the hook chose apart and disagreed: several nodes outside SLURM without a node list
ran locally from tune and failed in the hook (now: locally on CPU, refused on GPUs, both), and under torchrun the
hook handed tune a plain fresh-process launcher, so `--trial-workers` was never consulted there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from autotune.core.choices import Device, TrialWorkers
from autotune.errors import UserError
from autotune.trial.trial_types import TrialLauncher

LauncherKind = Literal[
    "own_command", "warm", "warm_srun", "warm_local_nodes", "fresh", "srun", "hostfile", "local_nodes"
]
# The launcher that runs one trial in fresh processes of the job's shape where warm workers run the others: the
# pick's confirmation.
FRESH_BESIDE_WARM: dict[LauncherKind, LauncherKind] = {
    "warm": "fresh",
    "warm_srun": "srun",
    "warm_local_nodes": "local_nodes",
}

# glibc keeps freed arenas; returning large frees to the OS makes peak RSS the working set the memory model
# predicts (about 20% lower than default glibc on CPU trials; benchmarks/results/estimate.md).
CPU_TRIAL_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
# torchrun tells its workers to use the agent's rendezvous store; a trial inheriting that waits for a store nobody
# serves, and times out (torch/distributed/elastic/agent/server/local_elastic_agent.py sets it for its workers).
TORCHRUN_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"


@dataclass(frozen=True)
class JobFacts:
    """What decides where trials run. `shared_dir`: a directory every node sees (trial directories and hostfiles
    go there; default: beside the submit directory); `job_master_port`: the job's own rendezvous port, which trials
    keep clear of; `master_addr`: where the job rendezvouses, where the trials do too (default: the first node)."""

    nodes: int
    device: Device
    trial_workers: TrialWorkers = "auto"
    in_slurm: bool = False
    under_torchrun: bool = False
    nodelist: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    consumer: str | None = None  # --consumer: who reads the own command's config (trial/own_command/script_command.py)
    job_master_port: int | None = None
    gpus_per_node: int = 1
    job_id: str | None = None
    shared_dir: Path | None = None
    master_addr: str | None = None  # the job's own master (MASTER_ADDR, else its first node): the trials' too

    @classmethod
    def of_process(cls, environ: Mapping[str, str], **facts: object) -> JobFacts:
        """The facts this process's environment gives (SLURM, torchrun, MASTER_PORT), beside the caller's."""
        port = environ.get("MASTER_PORT", "")
        known: dict[str, object] = {
            "in_slurm": bool(environ.get("SLURM_JOB_ID")),
            "under_torchrun": TORCHRUN_STORE_VAR in environ,
            "job_master_port": int(port) if port.isdigit() else None,
        }
        return cls(**{**known, **facts})  # type: ignore[arg-type]


@dataclass(frozen=True)
class LaunchChoice:
    """The decision: which launcher, whether the pick is confirmed in a fresh process after warm workers, and the
    environment every trial gets on top of ours."""

    kind: LauncherKind
    confirm_fresh: bool = False
    env: dict[str, str] = field(default_factory=dict)


def uses_warm(*, nodes: int, own_command: bool, trial_workers: TrialWorkers, over_pdsh: bool = False) -> bool:
    """Warm workers unless asked for fresh processes, on one node or across nodes; never for an own command, whose
    trials start fresh processes (see SearchAsk.trial_workers), nor across nodes reached over pdsh (a node list
    outside SLURM: not built)."""
    return not own_command and trial_workers != "fresh" and not (nodes > 1 and over_pdsh)


def confirms_fresh(
    *, nodes: int, own_command: bool, trial_workers: TrialWorkers, device: Device, over_pdsh: bool = False
) -> bool:
    """By default (`auto`) wherever warm workers run the trials, but one CPU node: the pick once more in a fresh
    launch of the job's shape. Warm and fresh peaks were measured equal on one node of the CPU backend only, not on a
    GPU and not across nodes."""
    warm = uses_warm(nodes=nodes, own_command=own_command, trial_workers=trial_workers, over_pdsh=over_pdsh)
    return warm and trial_workers == "auto" and (device != "cpu" or nodes > 1)


def choose_launch(facts: JobFacts) -> LaunchChoice:
    """The table in this module's docstring; raises UserError for its refused rows."""
    env = {**(CPU_TRIAL_ENV if facts.device == "cpu" else {}), **_torchrun_env(facts)}
    if facts.command is not None:
        return LaunchChoice("own_command")
    over_pdsh = facts.nodes > 1 and not facts.in_slurm and bool(facts.nodelist)
    rule = {"nodes": facts.nodes, "own_command": False, "trial_workers": facts.trial_workers, "over_pdsh": over_pdsh}
    warm = uses_warm(**rule)  # type: ignore[arg-type]
    confirm = confirms_fresh(**rule, device=facts.device)  # type: ignore[arg-type]
    if facts.nodes == 1:
        return LaunchChoice("warm", confirm_fresh=confirm, env=env) if warm else LaunchChoice("fresh", env=env)
    if facts.in_slurm:
        env = {**env, "SLURM_OVERLAP": "1"}
        return LaunchChoice("warm_srun", confirm_fresh=confirm, env=env) if warm else LaunchChoice("srun", env=env)
    if facts.nodelist:
        if facts.trial_workers == "warm":
            raise UserError(
                "--trial-workers warm across nodes runs inside SLURM or on this host's CPU; over a node list (pdsh)"
                " every trial starts fresh: use --trial-workers auto or fresh"
            )
        return LaunchChoice("hostfile", env=env)
    if facts.device != "cpu":
        raise UserError(
            f"{facts.nodes} nodes outside SLURM and no node list: run inside a SLURM allocation, or give the hook"
            " --nodelist so the deepspeed launcher can reach the other nodes (over pdsh)"
        )
    if not warm:
        return LaunchChoice("local_nodes", env=env)
    return LaunchChoice("warm_local_nodes", confirm_fresh=confirm, env=env)


def _torchrun_env(facts: JobFacts) -> dict[str, str]:
    return {TORCHRUN_STORE_VAR: "False"} if facts.under_torchrun else {}


def check_tools(choice: LaunchChoice, which: Callable[[str], str | None] = shutil.which) -> None:
    """The client tools the chosen launcher runs, there before the first trial (one clear line, not a trial error)."""
    if choice.kind in ("srun", "warm_srun") and which("srun") is None:
        raise UserError("multi-node trials inside SLURM run with srun, which is not on PATH")
    if choice.kind == "hostfile" and which("pdsh") is None:
        raise UserError("multi-node trials outside SLURM use the deepspeed launcher over pdsh, which is not installed")


def trials_master(facts: JobFacts) -> str | None:
    """The trials' rendezvous host: the job's own master, else its first node (None: srun's first host)."""
    return facts.master_addr or (facts.nodelist[0] if facts.nodelist else None)


def trial_master_port(job_master_port: int | None) -> int:
    """The trials' rendezvous port: not the job's own."""
    from autotune.trial.launch.hostfile import TRIAL_MASTER_PORT

    return TRIAL_MASTER_PORT + 1 if job_master_port == TRIAL_MASTER_PORT else TRIAL_MASTER_PORT


@dataclass(frozen=True)
class TrialLaunchers:
    """Where the search's trials run, and where those are warm workers no fresh process has been compared with
    (GPUs), the launcher that confirms the pick in a process of its own (Search.confirm_fresh)."""

    trials: TrialLauncher
    confirm: TrialLauncher | None = None

    @property
    def process_starts(self) -> int | None:
        """Processes started for the trials where warm workers ran several in one; None: one per trial."""
        starts = getattr(self.trials, "restarts", None)
        if starts is None:
            return None
        return starts + getattr(self.confirm, "launches", 0)


@contextlib.contextmanager
def open_launchers(
    facts: JobFacts,
    *,
    which: Callable[[str], str | None] = shutil.which,
    on_replace: Callable[[int, str], None] | None = None,
) -> Iterator[TrialLaunchers]:
    """The chosen launchers, open for the search (warm workers are stopped on the way out). `on_replace`: told when
    the warm pool replaced its workers because their memory grew (trial/launch/warm.py)."""
    choice = choose_launch(facts)
    check_tools(choice, which)
    if choice.kind not in FRESH_BESIDE_WARM:
        yield TrialLaunchers(build_launcher(facts, choice))
        return
    from autotune.trial.launch.warm import FreshAfterWarm, WarmWorkerPool

    with WarmWorkerPool(env=choice.env, on_replace=on_replace, **_pool_place(facts, choice)) as pool:  # type: ignore[arg-type]
        fresh = LaunchChoice(FRESH_BESIDE_WARM[choice.kind], env=choice.env)
        confirm = FreshAfterWarm(pool, build_launcher(facts, fresh)) if choice.confirm_fresh else None
        yield TrialLaunchers(pool, confirm)


def _pool_place(facts: JobFacts, choice: LaunchChoice) -> dict[str, object]:
    """Where the warm pool keeps its directory and how its workers start: across nodes, in the directory every node
    sees (the hook's shared dir), the fresh launchers' master and port."""
    if choice.kind == "warm":
        return {}
    from autotune.trial.launch.warm_nodes import LocalNodesStart, SrunStart

    if choice.kind == "warm_local_nodes":
        return {"start": LocalNodesStart()}
    workdir = facts.shared_dir / "trials" if facts.shared_dir else _slurm_workdir()
    start = SrunStart(master_addr=trials_master(facts), master_port=trial_master_port(facts.job_master_port))
    return {"start": start, "workdir": workdir}


def _slurm_workdir() -> Path:
    """As SlurmLauncher's default: beside the submit directory, which every node of the allocation sees."""
    return Path(os.environ.get("SLURM_SUBMIT_DIR", ".")) / "autotune-trials"


def build_launcher(facts: JobFacts, choice: LaunchChoice) -> TrialLauncher:
    """The launcher of every kind but warm workers (which open_launchers starts and stops)."""
    if choice.kind == "own_command":
        from autotune.trial.own_command.script import ScriptLauncher
        from autotune.trial.own_command.script_command import parse_command

        return ScriptLauncher(parse_command(facts.command or (), consumer=facts.consumer))
    if choice.kind == "fresh":
        from autotune.trial.launch.local import LocalLauncher

        return LocalLauncher(env=choice.env)
    if choice.kind == "local_nodes":
        from autotune.trial.launch.nodes import LocalNodesLauncher

        return LocalNodesLauncher(env=choice.env)
    workdir = facts.shared_dir / "trials" if facts.shared_dir else None
    master = trials_master(facts)
    port = trial_master_port(facts.job_master_port)
    if choice.kind == "srun":
        from autotune.trial.launch.slurm import SlurmLauncher

        return SlurmLauncher(env=choice.env, workdir=workdir, master_addr=master, master_port=port)
    if choice.kind == "hostfile" and master is not None:
        from autotune.trial.launch.hostfile import HostfileLauncher, write_hostfile

        where = (facts.shared_dir or Path.cwd() / "autotune-trials") / "hostfiles"
        name = f"{facts.job_id or os.getpid()}.hostfile"
        hostfile = write_hostfile(where / name, facts.nodelist, facts.gpus_per_node)
        return HostfileLauncher(hostfile, master, port, workdir, env=choice.env)
    raise ValueError(f"no launcher is built for {choice.kind!r}")  # warm: open_launchers; a bug, not bad input
