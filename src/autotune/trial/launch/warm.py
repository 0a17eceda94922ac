"""Warm workers: successive trials of one world size reuse processes that have imported and joined already.

The default on the CPU backend; on GPUs when asked (`--trial-workers warm`), where a trial's leftovers would be device
memory: the pool then watches that too.

Start-up (interpreter, torch/DeepSpeed/transformers imports, process group, DeepSpeed op loading)
dominates small trials; a warm worker pays it once. Each trial still gets a fresh model and engine,
freed afterwards. After any failure the workers are killed and the next trial starts new ones: a rank
that ran out of memory or raised may hold state no later trial should inherit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from autotune.errors import UserError
from autotune.infra.atomic import atomic_write_json
from autotune.infra.leftovers import owned_tempdir
from autotune.trial.launch.gpus import nvml_used_bytes, wait_for_release
from autotune.trial.launch.heartbeat import HEARTBEAT_FILE, HeartbeatTiming, OwnerHeartbeat
from autotune.trial.launch.local import torchrun_command, torchrun_exit_codes
from autotune.trial.launch.oom_evidence import OomKillWatch
from autotune.trial.launch.processes import (
    BudgetWatch,
    free_port,
    new_tag,
    one_rank_env,
    own_trial_env,
    spawn,
    stop_processes,
    trial_env,
    wait_for,
)
from autotune.trial.launch.spawn import WORKER_MODULE
from autotune.trial.outcome import LaunchOutcome, build_result
from autotune.trial.rank_report import (
    HEALTHY_STATUSES,
    RankReport,
    log_path,
    read_reports,
    report_path,
    request_path,
)
from autotune.trial.trial_types import TrialLauncher, TrialResult, TrialSpec

# How far a warm worker's resident set may grow, once a trial's memory is freed, above where it stood after its
# first trial before the pool replaces it: beyond this, what the next trial measures would include an earlier
# trial's leftovers, which the user's fresh process does not carry. Our measurement (benchmarks/README.md, "Warm
# workers and DeepSpeed's leftovers"): across the demo's whole trial order (ZeRO-0 to 3, checkpointing, both
# offloads), 56 MiB of growth once DeepSpeed's leftovers are dropped (44 of it at the first ZeRO-1 trial: first-use
# costs a fresh process pays too), against 102 MiB of tensors left by each ZeRO-3 trial of the demo's model before.
WARM_GROWTH_LIMIT_BYTES = 64 * 2**20
# The same for a GPU worker's device memory. No GPU measurement of a warm worker's growth yet (the GPU kit's warm
# stage, benchmarks/gpu/kit.py, takes it): until then the limit is the smallest unit torch's caching allocator
# reserves for a large tensor (kLargeBuffer, 20 MiB: c10/cuda/CUDACachingAllocator.cpp), so a single segment that an
# earlier trial left held, or a communicator's buffers a new process group left behind, replaces the workers.
WARM_DEVICE_GROWTH_LIMIT_BYTES = 20 * 2**20
# Pinned host blocks torch's host allocator still owns after a trial, above the floor. They are in the host RSS
# too; watched apart because they are exactly what an offload trial leaves when the host cache is not emptied
# (trial/worker/memory.py empty_host_cache, where a torch lacks it), and because the next offload trial's host peak
# would
# carry them into the search's host-headroom verdict (search/walk.py drops a whole rung on it). A choice: the same
# 20 MiB as the device limit; any pinned block of an offload trial's size (a power of two of MiBs) is above it.
WARM_PINNED_GROWTH_LIMIT_BYTES = 20 * 2**20
# What the pool watches after each trial: the name its note uses, the rank report's figure, how far it may grow, and
# whether its floor is taken before the first trial (the worker's report of itself after the process group, one
# matmul and one collective: worker.py serve, training.settle) or after it. Pinned host blocks: before, so an
# offload trial's pins left in the worker are caught at once instead of sitting in the floor. Host RSS and device
# memory: after, because a first trial's first-use costs (DeepSpeed's lazily imported modules, glibc's arenas,
# CUDA's lazily loaded kernel modules) are paid by a fresh process too, inside its own trial, and counting them would
# replace every worker after its first trial. How large they are on a GPU is unmeasured: the reports carry both
# floors, and the GPU lease's warm stage brings them back.
_WATCHED = (
    ("host memory", "host_rss_after_bytes", WARM_GROWTH_LIMIT_BYTES, False),
    ("device memory", "device_after_bytes", WARM_DEVICE_GROWTH_LIMIT_BYTES, False),
    ("pinned host memory", "pinned_after_bytes", WARM_PINNED_GROWTH_LIMIT_BYTES, True),
    # Not memory: ZeRO++ process groups DeepSpeed still holds after a trial (trial/worker/deepspeed_globals.py), from
    # the worker's count before its first trial (none). Any one left replaces the workers: their next hpZ trial would
    # fail DeepSpeed's assertion (deepspeed/utils/groups.py:938-939), or, its model built outside zero.Init, run on
    # the last trial's group whatever its own size (runtime/zero/stage3.py:267-273;
    # benchmarks/zeropp_group_reuse_cpu.py).
    ("ZeRO++ process groups", "zeropp_groups_after", 0, True),
)


@dataclass
class _Workers:
    shape: tuple[object, ...]  # (world size, device[, nodes]): what these processes can run
    process: subprocess.Popen  # the launcher of the workers (node 0's, where every node has its own)
    tag: str
    pool_dir: Path
    gpus_before: dict[int, int] | None  # NVML used before the workers started: what stopping them must restore
    next_index: int = 0
    # per rank, the floor of each watched figure (_WATCHED says whether from before or after the first trial; a
    # worker that reports no floor of its own gets its after-first-trial figures)
    floors: dict[str, dict[int, int]] | None = None
    others: list[subprocess.Popen] = field(default_factory=list)  # the other nodes' launchers, where each has one
    heartbeat: OwnerHeartbeat | None = None  # renewed while these workers live (trial/launch/heartbeat.py)

    @property
    def launchers(self) -> list[subprocess.Popen]:
        return [self.process, *self.others]

    def poll(self) -> int | None:
        """The first exit code among the launchers, None while all run: one node's launcher gone ends them all
        (its ranks are gone from every collective)."""
        codes = [launcher.poll() for launcher in self.launchers]
        return next((code for code in codes if code is not None), None)

    def growth(self, reports: Mapping[int, RankReport]) -> tuple[str, int] | None:
        """The memory that grew past its limit since its floor, and by how much: host RSS, and on a GPU the device
        memory and the pinned host blocks the worker still holds between trials. The first trial is checked
        against the floors taken before it (pinned host blocks)."""
        after = {
            what: {r.rank: held for r in reports.values() if (held := getattr(r, figure)) is not None}
            for what, figure, _, _ in _WATCHED
        }
        if self.floors is None:
            before = {
                what: {r.rank: r.floor[figure] for r in reports.values() if figure in r.floor} if early else {}
                for what, figure, _, early in _WATCHED
            }
            self.floors = {what: {**after[what], **before[what]} for what in after}
        for what, _, limit, _ in _WATCHED:
            floor = self.floors[what]
            grown = max((held - floor[rank] for rank, held in after[what].items() if rank in floor), default=0)
            if grown > limit:
                return what, grown
        return None


class WorkerStart(Protocol):
    """How a pool starts its workers (one node here; across nodes in trial/launch/warm_nodes.py): the processes
    that launch every rank's `--serve` loop, and how to read which rank failed from their logs."""

    ranks_here: bool  # every rank runs on this host: their RSS can be watched from here (BudgetWatch)

    def refuse(self, spec: TrialSpec) -> None:
        """Raise UserError for a trial these workers cannot run."""

    def start(self, spec: TrialSpec, serve: list[str], env: dict[str, str], pool_dir: Path) -> list[subprocess.Popen]:
        """The launchers, started (node 0's first)."""
        ...

    def exit_codes(self, spec: TrialSpec, pool_dir: Path, codes: list[int | None]) -> dict[int, int]:
        """Per-rank exit codes of failed workers, from the launchers' logs and `codes` (their own)."""
        ...

    def ranks_per_host(self, spec: TrialSpec) -> int:
        """The trial's ranks that share one host's cores (their OpenMP threads split them: processes.py)."""
        ...


def launcher_log(pool_dir: Path, node: int = 0) -> Path:
    """Where the launcher of `node` logs (node 0's is the one-node pool's `launcher.log`)."""
    return pool_dir / ("launcher.log" if node == 0 else f"launcher-node{node}.log")


class OneNodeStart:
    """One node: torchrun for several ranks, the worker itself for one."""

    ranks_here = True

    def __init__(self, python: str, master_addr: str) -> None:
        self.python = python
        self.master_addr = master_addr

    def refuse(self, spec: TrialSpec) -> None:
        if spec.nodes != 1:
            raise UserError("the warm pool runs one node; trial/launch/warm_nodes.py starts workers across nodes")

    def start(self, spec: TrialSpec, serve: list[str], env: dict[str, str], pool_dir: Path) -> list[subprocess.Popen]:
        port = free_port()
        if spec.world_size > 1:
            command = torchrun_command(self.python, spec, 0, self.master_addr, master_port=port, worker=serve)
        else:
            command = [self.python, "-m", WORKER_MODULE, *serve]
            env = {**env, **one_rank_env(self.master_addr, port)}
        return [spawn(command, env, launcher_log(pool_dir), pool_dir)]

    def ranks_per_host(self, spec: TrialSpec) -> int:
        return spec.nprocs_per_node

    def exit_codes(self, spec: TrialSpec, pool_dir: Path, codes: list[int | None]) -> dict[int, int]:
        log = launcher_log(pool_dir)
        if spec.world_size > 1:
            return torchrun_exit_codes(log.read_text(errors="replace") if log.exists() else "")
        return {} if codes[0] is None else {0: codes[0]}


class WarmWorkerPool:
    """A TrialLauncher that keeps its workers between trials; close() (or `with`) ends them. One node unless
    `start` says otherwise (trial/launch/warm_nodes.py: across nodes).

    Workers also exit on their own when this process dies, so none is left behind either way: on this host they
    watch its pid, on any node its heartbeat (heartbeat.py), which stops with it even under SIGKILL.
    """

    def __init__(
        self,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        *,
        master_addr: str = "127.0.0.1",
        poll_interval_s: float = 0.02,
        kill_grace_s: float = 5.0,
        on_replace: Callable[[int, str], None] | None = None,
        start: WorkerStart | None = None,
        heartbeat: HeartbeatTiming = HeartbeatTiming(),
    ) -> None:
        """`on_replace(grown_bytes, what)`: called when healthy workers are replaced because their memory (host or
        device, `what`) grew. `start`: how the workers start (default: on this one node). `heartbeat`: how often
        this pool renews its heartbeat and how long workers wait on an unchanged one before they exit."""
        self.start = start or OneNodeStart(python, master_addr)
        self.python = python
        self.env = dict(env or {})
        self.workdir = workdir
        self.master_addr = master_addr
        self.poll_interval_s = poll_interval_s
        self.kill_grace_s = kill_grace_s
        self._workers: _Workers | None = None
        self.restarts = 0  # how many times workers were (re)started: the cost the pool did not save
        self.recycled: list[int] = []  # growth (bytes) that made the pool replace healthy workers, one per time
        self.on_replace = on_replace
        self.heartbeat = heartbeat

    def __enter__(self) -> WarmWorkerPool:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # leaving on an exception (SIGTERM, Ctrl-C): no polite stop request, SIGKILL's grace is short
        self.close(graceful=exc_type is None)

    def run(self, spec: TrialSpec) -> TrialResult:
        self.start.refuse(spec)
        workers = self._workers_for(spec)
        index = workers.next_index
        workers.next_index += 1
        trial_dir = workers.pool_dir / f"trial-{index:06d}"
        trial_dir.mkdir()
        try:
            return self._run_in(spec, workers, index, trial_dir)
        finally:
            if self.workdir is None:
                shutil.rmtree(trial_dir, ignore_errors=True)

    def _run_in(self, spec: TrialSpec, workers: _Workers, index: int, trial_dir: Path) -> TrialResult:
        ranks = range(spec.world_size)
        spec_path = atomic_write_json(trial_dir / "spec.json", spec.to_dict())
        started = time.monotonic()
        oom_watch = OomKillWatch.start()
        request = {"spec": str(spec_path), "out": str(trial_dir), "dispatched_at": time.time()}
        atomic_write_json(request_path(workers.pool_dir, index), request)
        budget = None
        if spec.device == "cpu" and spec.host_memory_budget_bytes and self.start.ranks_here:
            budget = BudgetWatch(trial_dir, ranks, spec.host_memory_budget_bytes)
        waited = wait_for(
            workers,
            started + spec.timeout_s,
            self.poll_interval_s,
            done=lambda: all(report_path(trial_dir, rank).exists() for rank in ranks),
            budget=budget,
        )
        reports = read_reports(trial_dir, ranks)
        # a rank's own stop over the search's limit after warm-up (TrialSpec.stop_over_bytes) leaves it healthy
        healthy = all(r.status in HEALTHY_STATUSES for r in reports.values())
        stopped_itself = healthy and any(r.status != "ok" for r in reports.values())
        failed = waited.timed_out or waited.breach is not None or not healthy
        stopped = None
        if failed or len(reports) < len(ranks) or workers.poll() is not None:
            stopped = self._stop()
        codes = [launcher.returncode for launcher in workers.launchers]
        exit_codes = self.start.exit_codes(spec, workers.pool_dir, codes)
        outcome = LaunchOutcome(
            ranks=ranks,
            wall_s=time.monotonic() - started,
            timed_out=waited.timed_out,
            budget_breach=waited.breach,
            exit_codes=exit_codes,
            logs={rank: log_path(trial_dir, rank) for rank in ranks},
            launcher_log=launcher_log(workers.pool_dir),
            oom_evidence=oom_watch.explain(exit_codes, trial_dir, ranks),
        )
        result = build_result(spec, reports, outcome)
        if not (result.ok or stopped_itself) and stopped is None:  # a failure stopped them above already
            stopped = self._stop()
        if stopped is None and (grown := workers.growth(reports)) is not None:
            what, size = grown
            self.recycled.append(size)  # the next trial must not start on this one's leftovers
            stopped = self._stop(graceful=True)
            if self.on_replace is not None:
                self.on_replace(size, what)
        if stopped is not None:
            self._remove(stopped)
        return result

    def _workers_for(self, spec: TrialSpec) -> _Workers:
        shape = _shape(spec)
        if self._workers is not None and (self._workers.shape != shape or self._workers.poll() is not None):
            self.close()
        if self._workers is None:
            self._workers = self._start(spec)
        return self._workers

    def _start(self, spec: TrialSpec) -> _Workers:
        pool_dir = owned_tempdir("autotune-warm-", self.workdir)  # a SIGKILLed pool's dir goes at the next start
        (pool_dir / "requests").mkdir()
        heartbeat = OwnerHeartbeat(pool_dir / HEARTBEAT_FILE, self.heartbeat.interval_s).start()
        serve = [
            *("--serve", str(pool_dir), "--device", spec.device, "--owner-pid", str(os.getpid())),
            *self.heartbeat.worker_args(heartbeat.path),
        ]
        tag = new_tag()
        own = own_trial_env({**os.environ, **self.env})
        env = trial_env(own, tag, spec.device, self.start.ranks_per_host(spec))
        gpus_before = nvml_used_bytes() if spec.device == "cuda" else None
        try:
            first, *others = self.start.start(spec, serve, env, pool_dir)
        except BaseException:
            heartbeat.stop()
            raise
        self.restarts += 1
        return _Workers(_shape(spec), first, tag, pool_dir, gpus_before=gpus_before, others=others, heartbeat=heartbeat)

    def _stop(self, graceful: bool = False) -> _Workers | None:
        """Graceful: ask idle workers to exit (they close their process group); else just kill them."""
        workers, self._workers = self._workers, None
        if workers is None:
            return None
        if graceful and workers.poll() is None:
            atomic_write_json(request_path(workers.pool_dir, workers.next_index), {"stop": True})
            for launcher in workers.launchers:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    launcher.wait(timeout=2.0)
        for launcher in workers.launchers:
            stop_processes(launcher, workers.tag, self.kill_grace_s)
        if workers.heartbeat is not None:
            workers.heartbeat.stop()
        wait_for_release(workers.gpus_before)
        return workers

    def _remove(self, workers: _Workers) -> None:
        if self.workdir is None:
            shutil.rmtree(workers.pool_dir, ignore_errors=True)

    def close(self, graceful: bool = True) -> None:
        stopped = self._stop(graceful=graceful)
        if stopped is not None:
            self._remove(stopped)


def _shape(spec: TrialSpec) -> tuple[object, ...]:
    """What a pool's workers can run: its world size and device, and across nodes how the ranks are spread."""
    return (spec.world_size, spec.device) if spec.nodes == 1 else (spec.world_size, spec.device, spec.nodes)


class FreshAfterWarm:
    """A TrialLauncher for one trial in a process of its own beside a warm pool: the pool's workers stop first, so
    the fresh trial finds the device memory a job starting now would find (idle warm workers still hold a CUDA
    context and communicator buffers); the pool starts new workers at its next trial."""

    def __init__(self, pool: WarmWorkerPool, fresh: TrialLauncher) -> None:
        self.pool = pool
        self.fresh = fresh
        self.launches = 0  # processes this launcher started: one per trial

    def run(self, spec: TrialSpec) -> TrialResult:
        self.pool.close()
        self.launches += 1
        return self.fresh.run(spec)
