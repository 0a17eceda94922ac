"""What job this process belongs to: scheduler, node count, GPUs per node, ranks and the node list.

The hook runs before training, often on every node (or every rank) at once. Each process reads the
same job description from its environment, so every process derives the same world size and the
same run key; any contradiction (SLURM says 8 GPUs, 2 are visible) is a one-line error, because a
config tuned for the wrong world size would fail, or silently mis-size batches, at launch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from autotune.core.choices import Device
from autotune.errors import UserError
from autotune.hook.hostlist import ScontrolRunner, expand_hostlist, scontrol_hostnames

Scheduler = Literal["slurm", "torchrun", "none"]
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class JobEnv:
    scheduler: Scheduler
    job_id: str | None
    nodes: int
    gpus_per_node: int  # training ranks per node (CPU backend: processes per node)
    rank: int  # this hook process among the job's hook processes
    node_rank: int
    local_rank: int
    nodelist: tuple[str, ...]  # expanded, in node-rank order; empty when the job does not say
    master_addr: str | None
    master_port: int | None = None

    @property
    def world_size(self) -> int:
        """Training ranks across the job (not the number of hook processes)."""
        return self.nodes * self.gpus_per_node

    def describe(self) -> str:
        job = f" job {self.job_id}" if self.job_id else ""
        return (
            f"{self.scheduler}{job}: {self.nodes} node(s) x {self.gpus_per_node} rank(s) = world size"
            f" {self.world_size}; this process rank {self.rank}, node {self.node_rank}"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "nodelist": list(self.nodelist), "world_size": self.world_size}


@dataclass(frozen=True)
class JobOverrides:
    """Counts given on the command line: they fill gaps in the environment and must agree with it."""

    gpus: int | None = None
    nodes: int | None = None
    nodelist: str | None = None


def parse_gpu_count(text: str, name: str = "SLURM_GPUS_PER_NODE") -> int:
    """GPU counts as SLURM writes them: "8", "a100:8", "gpu:a100:8", "gpu:a100:4(S:0-1)", "a100:4,v100:2"."""
    total = 0
    for part in text.split(","):
        count = re.sub(r"\(.*\)$", "", part.strip()).split(":")[-1]
        if not count.isdigit():
            raise UserError(f"{name}={text!r}: cannot read a GPU count (expected e.g. 8, a100:8 or gpu:a100:8)")
        total += int(count)
    return total


def _slurm_gpu_count(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """GPUs on this node per SLURM, and the variable that said so (for error messages)."""
    on_node_text = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    on_node = parse_gpu_count(on_node_text, "SLURM_GPUS_ON_NODE") if on_node_text else None
    per_node_text = environ.get("SLURM_GPUS_PER_NODE", "").strip()
    per_node = parse_gpu_count(per_node_text) if per_node_text else None
    if on_node is not None and per_node is not None and on_node != per_node:
        raise UserError(
            f"contradictory SLURM environment: SLURM_GPUS_ON_NODE={on_node} but SLURM_GPUS_PER_NODE={per_node_text}"
        )
    if on_node is not None:
        return on_node, f"SLURM_GPUS_ON_NODE={on_node}"
    if per_node is not None:
        return per_node, f"SLURM_GPUS_PER_NODE={per_node_text}"
    return None, ""


@dataclass(frozen=True)
class _Sources:
    """What detection reads: the environment, the command-line counts, and how to look at this node."""

    environ: Mapping[str, str]
    overrides: JobOverrides
    device: Device
    visible_gpus: Callable[[], int]
    scontrol: ScontrolRunner

    def int_var(self, name: str) -> int | None:
        text = self.environ.get(name)
        if text is None or text.strip() == "":
            return None
        if not text.strip().isdigit():
            raise UserError(f"{name}={text!r} is not a whole number")
        return int(text)

    def int_var_or(self, name: str, default: int) -> int:
        value = self.int_var(name)
        return default if value is None else value

    def hosts(self, text: str | None) -> tuple[str, ...]:
        return tuple(expand_hostlist(text, self.scontrol)) if text else ()

    def master_addr(self, hosts: tuple[str, ...]) -> str | None:
        return self.environ.get("MASTER_ADDR") or (hosts[0] if hosts else None)

    def ranks_per_node(self, said: int | None, source: str) -> int:
        """From the scheduler, the --gpus flag or, on a GPU node, what is visible; all must agree."""
        flag = self.overrides.gpus
        if said is not None and flag is not None and said != flag:
            raise UserError(f"--gpus {flag} contradicts {source}")
        ranks = said if said is not None else flag
        if self.device == "cpu":  # CPU backend: ranks are processes; no GPU to check against
            return ranks or 1
        visible = self.visible_gpus()
        if ranks is None:
            if visible == 0:
                raise UserError("no GPU visible on this node: pass --gpus and run where GPUs are, or use --device cpu")
            return visible
        said_by = source or f"--gpus {ranks}"
        if ranks <= 0:
            raise UserError(f"{said_by} gives no GPU to train on; request GPUs or use --device cpu")
        if visible < ranks:
            raise UserError(
                f"{said_by} says {ranks} GPU(s) per node but {visible} are visible here"
                " (check CUDA_VISIBLE_DEVICES, and run the hook once per node rather than once per GPU task)"
            )
        return ranks

    def check_nodes(self, nodes: int, hosts: tuple[str, ...], source: str) -> None:
        if nodes <= 0:
            raise UserError(f"{source} must be positive")
        if self.overrides.nodes is not None and self.overrides.nodes != nodes:
            raise UserError(f"--nodes {self.overrides.nodes} contradicts {source}")
        if hosts and len(hosts) != nodes:
            raise UserError(f"{source} but the node list names {len(hosts)} node(s): {', '.join(hosts)}")


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE as SLURM writes it: "2(x3),1" is 2, 2, 2, 1."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise UserError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read a task count (expected e.g. 2(x3),1)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _slurm_cpu_ranks(src: _Sources) -> tuple[int | None, str]:
    """CPU backend under SLURM: a task is a rank. The allocation's tasks per node bound what --gpus may ask
    for: trial steps (srun) and the training step cannot start more tasks than the job was given."""
    env = src.environ
    per_node = src.int_var("SLURM_NTASKS_PER_NODE")
    source = f"SLURM_NTASKS_PER_NODE={per_node}"
    if per_node is None and env.get("SLURM_TASKS_PER_NODE", "").strip():
        text = env["SLURM_TASKS_PER_NODE"].strip()
        per_node, source = min(parse_tasks_per_node(text)), f"SLURM_TASKS_PER_NODE={text}"
    flag = src.overrides.gpus
    if per_node is not None and flag is not None and flag > per_node:
        raise UserError(
            f"--gpus {flag} asks for {flag} rank(s) per node but this SLURM allocation has {per_node} task(s) per"
            f" node ({source}); submit the job with --ntasks-per-node={flag}"
        )
    return (flag, f"--gpus {flag}") if flag is not None else (per_node, source)


def _slurm(src: _Sources) -> JobEnv:
    env = src.environ
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    job_nodes = src.int_var("SLURM_JOB_NUM_NODES")  # the allocation; SLURM_NNODES may be one step's
    nodes = job_nodes if job_nodes is not None else src.int_var("SLURM_NNODES")
    if nodes is None:
        raise UserError(f"SLURM job {job_id} but neither SLURM_JOB_NUM_NODES nor SLURM_NNODES is set")
    hosts = src.hosts(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or src.overrides.nodelist)
    src.check_nodes(nodes, hosts, f"SLURM_JOB_NUM_NODES={nodes}")
    gpus, source = _slurm_gpu_count(env)
    if src.device == "cpu" and not gpus:
        gpus, source = _slurm_cpu_ranks(src)
    return JobEnv(
        scheduler="slurm",
        job_id=job_id,
        nodes=nodes,
        gpus_per_node=src.ranks_per_node(gpus, source),
        rank=src.int_var_or("SLURM_PROCID", 0),
        node_rank=src.int_var_or("SLURM_NODEID", 0),
        local_rank=src.int_var_or("SLURM_LOCALID", 0),
        nodelist=hosts,
        master_addr=src.master_addr(hosts),
        master_port=src.int_var("MASTER_PORT"),
    )


def _torchrun(src: _Sources) -> JobEnv:
    env = src.environ
    missing = [k for k in TORCHRUN_KEYS if env.get(k, "").strip() == ""]
    if missing:
        raise UserError(f"incomplete torchrun environment: {', '.join(missing)} not set")
    world = src.int_var_or("WORLD_SIZE", 0)
    local_world = src.int_var_or("LOCAL_WORLD_SIZE", 0)
    if local_world <= 0 or world % local_world:
        raise UserError(f"contradictory torchrun environment: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE")
    nodes = world // local_world
    hosts = src.hosts(src.overrides.nodelist or env.get("SLURM_JOB_NODELIST"))
    src.check_nodes(nodes, hosts, f"WORLD_SIZE={world} / LOCAL_WORLD_SIZE={local_world} = {nodes} node(s)")
    slurm_nodes = src.int_var("SLURM_JOB_NUM_NODES")
    if slurm_nodes is not None and slurm_nodes != nodes:
        raise UserError(f"torchrun runs {nodes} node(s) but SLURM_JOB_NUM_NODES={slurm_nodes}")
    rank = src.int_var_or("RANK", 0)
    run_id = env.get("TORCHELASTIC_RUN_ID")
    return JobEnv(
        scheduler="torchrun",
        job_id=(run_id if run_id and run_id != "none" else None) or env.get("SLURM_JOB_ID"),
        nodes=nodes,
        gpus_per_node=src.ranks_per_node(local_world, f"LOCAL_WORLD_SIZE={local_world}"),
        rank=rank,
        node_rank=src.int_var_or("GROUP_RANK", rank // local_world),
        local_rank=src.int_var_or("LOCAL_RANK", 0),
        nodelist=hosts,
        master_addr=src.master_addr(hosts),
        master_port=src.int_var("MASTER_PORT"),
    )


def _standalone(src: _Sources) -> JobEnv:
    """No scheduler: the counts come from --nodes / --nodelist / --gpus, or this node alone."""
    hosts = src.hosts(src.overrides.nodelist)
    nodes = src.overrides.nodes or len(hosts) or 1
    src.check_nodes(nodes, hosts, f"--nodes {nodes}")
    return JobEnv(
        scheduler="none",
        job_id=None,
        nodes=nodes,
        gpus_per_node=src.ranks_per_node(None, ""),
        rank=0,
        node_rank=src.int_var_or("NODE_RANK", 0),
        local_rank=0,
        nodelist=hosts,
        master_addr=src.master_addr(hosts),
        master_port=src.int_var("MASTER_PORT"),
    )


def count_visible_gpus() -> int:
    """GPUs this process may use, honouring CUDA_VISIBLE_DEVICES (NVML, no CUDA context)."""
    from autotune.hardware.machine_probe import probe_gpus

    gpus, _, _ = probe_gpus()
    return len(gpus)


def detect_job_env(
    environ: Mapping[str, str],
    overrides: JobOverrides = JobOverrides(),
    *,
    device: Device = "cuda",
    visible_gpus: Callable[[], int] = count_visible_gpus,
    scontrol: ScontrolRunner = scontrol_hostnames,
) -> JobEnv:
    """torchrun's variables win when present (they describe the training world exactly), then SLURM's."""
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {device!r}")
    src = _Sources(environ, overrides, device, visible_gpus, scontrol=scontrol)
    if any(environ.get(k) for k in TORCHRUN_KEYS):
        job = _torchrun(src)
    elif environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"):
        job = _slurm(src)
    else:
        job = _standalone(src)
    _check_ranks(job)
    return job


def _check_ranks(job: JobEnv) -> None:
    """This process's node must lie inside the job: SLURM_NODEID=5 in a one-node job is a bad environment."""
    if not 0 <= job.node_rank < job.nodes:
        raise UserError(f"contradictory job environment: node rank {job.node_rank} but the job has {job.nodes} node(s)")
