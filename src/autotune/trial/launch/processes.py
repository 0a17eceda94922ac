"""Starting, watching and killing a trial's processes so that none survives the trial.

torchrun starts each worker in its own session, and a worker can outlive a launcher that was killed,
so a process group is not enough: every process of a trial carries a tag in its environment (children
inherit it), and the tag is what we kill and what we check for survivors.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil

from autotune.trial.outcome import BudgetBreach
from autotune.trial.rank_report import pid_path

TRIAL_TAG_ENV = "AUTOTUNE_TRIAL_TAG"


def new_tag() -> str:
    return uuid.uuid4().hex


def free_port() -> int:
    """A port the OS just handed out; the rendezvous binds it a moment later (tiny race, as torchrun's own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# torchrun fills every option not given on its command line from PET_<OPTION> (torch/distributed/argparse_util.py,
# `env` action), PET_RDZV_ENDPOINT included even for the static backend (torch/distributed/run.py:790-793), and its
# agent hands TORCHELASTIC_* (run id, restart count, the agent's store) to its workers. A job that runs the tuner
# (Kubeflow's PyTorchJob sets PET_*; a torchrun-launched hook has TORCHELASTIC_*) must not steer our own trials.
LAUNCHER_VARIABLE_PREFIXES = ("PET_", "TORCHELASTIC_")


def launcher_variables(env: Mapping[str, str]) -> list[str]:
    """The names in `env` that an outer torchrun job set for its own launcher and workers."""
    return sorted(name for name in env if name.startswith(LAUNCHER_VARIABLE_PREFIXES))


def own_trial_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without an outer job's launcher variables: what our own trials (not the user's command) start with."""
    return {name: value for name, value in env.items() if not name.startswith(LAUNCHER_VARIABLE_PREFIXES)}


def one_rank_env(master_addr: str = "127.0.0.1", port: int | None = None) -> dict[str, str]:
    """The variables torchrun would set for a world of one rank, for a process we start without torchrun.

    torch.distributed's env:// rendezvous reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; DeepSpeed and
    accelerate read LOCAL_RANK and LOCAL_WORLD_SIZE. `port` defaults to a free one.
    """
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(free_port() if port is None else port),
    }


def spawn(command: list[str], env: Mapping[str, str], log: Path, cwd: Path) -> subprocess.Popen:
    """Start the launcher in a new session with stdin closed and all output in `log`."""
    with open(log, "ab") as handle:
        return subprocess.Popen(
            command,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def tagged_processes(tag: str, variable: str = TRIAL_TAG_ENV) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment has `variable` set to `tag`."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(variable) == tag:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _descendants(root: subprocess.Popen | None) -> list[psutil.Process]:
    if root is None:
        return []
    try:
        parent = psutil.Process(root.pid)
        return [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(processes: list[psutil.Process], sig: signal.Signals) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


def stop_processes(root: subprocess.Popen | None, tag: str, grace_s: float = 5.0) -> None:
    """SIGTERM (torchrun and srun forward it), then SIGKILL whatever is left; reap the root."""
    for attempt in range(3):
        victims = {p.pid: p for p in [*_descendants(root), *tagged_processes(tag)]}
        if not victims:
            break
        _signal_all(list(victims.values()), signal.SIGTERM if attempt == 0 else signal.SIGKILL)
        _, alive = psutil.wait_procs(list(victims.values()), timeout=grace_s if attempt == 0 else 5.0)
        _signal_all(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5.0)
    if root is not None:
        try:
            root.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            root.kill()
            root.wait()


class BudgetWatch:
    """Samples each rank's RSS from the parent, so an over-budget trial is stopped as soon as it crosses."""

    def __init__(self, out_dir: Path, ranks: range, budget_bytes: int) -> None:
        self.out_dir = out_dir
        self.ranks = ranks
        self.budget_bytes = budget_bytes
        self._pids: dict[int, int] = {}

    def check(self) -> BudgetBreach | None:
        for rank in self.ranks:
            pid = self._pids.get(rank) or self._read_pid(rank)
            if pid is None:
                continue
            try:
                rss = psutil.Process(pid).memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if rss > self.budget_bytes:
                return BudgetBreach(rank, int(rss), self.budget_bytes)
        return None

    def _read_pid(self, rank: int) -> int | None:
        try:
            self._pids[rank] = int(pid_path(self.out_dir, rank).read_text())
        except (OSError, ValueError):
            return None
        return self._pids[rank]


@dataclass(frozen=True)
class Waited:
    timed_out: bool = False
    breach: BudgetBreach | None = None


class Polled(Protocol):
    """What wait_for watches: a process, or several that end together (warm workers across nodes)."""

    def poll(self) -> int | None: ...


def wait_for(
    process: Polled,
    deadline: float,
    poll_s: float,
    done: Callable[[], bool] | None = None,
    budget: BudgetWatch | None = None,
) -> Waited:
    """Until the process exits or `done()` holds, the deadline passes, or the budget watch trips."""
    while process.poll() is None and not (done and done()):
        if time.monotonic() >= deadline:
            return Waited(timed_out=True)
        breach = budget.check() if budget else None
        if breach:
            return Waited(breach=breach)
        time.sleep(poll_s)
    return Waited()


def cpu_threads_per_rank(ranks_per_node: int, cores: int | None = None) -> int:
    """OpenMP threads one rank gets: the node's cores split evenly between its ranks, at least one.

    This is the `deepspeed` launcher's rule (deepspeed 0.19.8 launcher/launch.py:219-221, `--bind_cores_to_rank`:
    OMP_NUM_THREADS = cores per rank). torchrun instead sets OMP_NUM_THREADS=1 for every rank when it starts
    more than one (torch/distributed/run.py), which would run DeepSpeed's OpenMP-parallel CPU Adam (offload
    rungs) on one thread and measure it several times slower than the user's launch.
    """
    available = cores if cores is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    return max(1, (available or os.cpu_count() or 1) // max(1, ranks_per_node))


def trial_env(env: Mapping[str, str], tag: str, device: str, ranks_per_node: int = 1) -> dict[str, str]:
    """The launcher's environment plus the tag, the accelerator and unbuffered output (logs survive a kill).

    OMP_NUM_THREADS is set to the cores per rank unless the caller's environment already sets it.
    """
    threads = {"OMP_NUM_THREADS": str(cpu_threads_per_rank(ranks_per_node))} if "OMP_NUM_THREADS" not in env else {}
    return {**env, **threads, TRIAL_TAG_ENV: tag, "DS_ACCELERATOR": device, "PYTHONUNBUFFERED": "1"}
