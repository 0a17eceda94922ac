"""The trial worker: one process per rank, started by a launcher (directly, torchrun or srun).

    python -m autotune.trial.worker.main --spec SPEC.json --out DIR [--launched-at EPOCH] [--owner-pid PID]
    python -m autotune.trial.worker.main --serve POOL_DIR --device cpu|cuda [--owner-pid PID]
        [--owner-heartbeat FILE --owner-stale-s S]

The first form runs one trial and exits. The second is the warm worker: it imports and joins the
process group once, then runs the trials the pool drops into POOL_DIR/requests/, one fresh DeepSpeed
engine each, until told to stop or a trial fails. With --owner-pid, a worker exits when that process
is gone; with --owner-heartbeat, when that file has stood still for --owner-stale-s seconds (owner_watch.py:
a worker on another node cannot see the tuner's pid). Either way every rank writes DIR/rank<R>.json (a
RankReport) and logs to DIR/rank<R>.log.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from autotune.trial.outcome import classify_exception
from autotune.trial.rank_report import HEALTHY_STATUSES, RankReport, log_path, pid_path, request_path, write_report
from autotune.trial.trial_types import TrialSpec
from autotune.trial.worker.deepspeed_globals import zeropp_groups_left
from autotune.trial.worker.faults import maybe_inject_fault
from autotune.trial.worker.memory import MemoryTracker, host_rss_bytes, pinned_host_bytes
from autotune.trial.worker.owner_watch import watch_heartbeat, watch_owner
from autotune.trial.worker.train_steps import PhaseClock, Placement, import_runtime, init_distributed, run_rank, settle

REQUEST_POLL_S = 0.02


def placement_from_env(env: Mapping[str, str]) -> Placement:
    """torchrun and our direct launch set RANK/LOCAL_RANK/WORLD_SIZE; srun sets only SLURM_*."""
    if "RANK" in env:
        return Placement(int(env["RANK"]), int(env.get("LOCAL_RANK", "0")), int(env.get("WORLD_SIZE", "1")))
    if "SLURM_PROCID" in env:
        return Placement(int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", "0")), int(env["SLURM_NTASKS"]))
    return Placement(0, 0, 1)


def export_placement(placement: Placement) -> None:
    """torch.distributed's env:// rendezvous and DeepSpeed read these names, whoever launched us."""
    os.environ["RANK"] = str(placement.rank)
    os.environ["LOCAL_RANK"] = str(placement.local_rank)
    os.environ["WORLD_SIZE"] = str(placement.world_size)


def redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (C++ included) to the rank's own log file."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def load_spec(path: Path) -> TrialSpec:
    return TrialSpec(**json.loads(path.read_text()))


def start_rank_files(out_dir: Path, rank: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    redirect_output(log_path(out_dir, rank))
    pid_path(out_dir, rank).write_text(str(os.getpid()))


def failure_report(rank: int, error: BaseException, clock: PhaseClock) -> RankReport:
    status, line = classify_exception(error)
    return RankReport(rank=rank, status=status, error=line, phases=dict(clock.phases))


def run_once(spec_path: Path, out_dir: Path, launched_at: float, placement: Placement) -> bool:
    start_rank_files(out_dir, placement.rank)
    clock = PhaseClock(launched_at)
    clock.mark("launch")
    maybe_inject_fault("entry", placement.rank)
    try:
        spec = load_spec(spec_path)
        import_runtime(spec.device, spec.architecture)
        clock.mark("imports")
        maybe_inject_fault("start", placement.rank)
        memory = MemoryTracker(spec.device, placement.local_rank)  # NVML baseline before our CUDA context
        init_distributed(spec.device, placement.local_rank)
        clock.mark("dist_init")
        memory.reset(record_sites=spec.record_peak_sites, sample_period_s=spec.sample_period_s)
        report = run_rank(spec, placement, clock, memory)
    except Exception as error:
        report = failure_report(placement.rank, error, clock)
    write_report(out_dir, report)
    return report.status in HEALTHY_STATUSES


def _next_request(pool_dir: Path, index: int) -> dict:
    path = request_path(pool_dir, index)
    while not path.exists():
        time.sleep(REQUEST_POLL_S)
    return json.loads(path.read_text())


def held_between_trials(memory: MemoryTracker) -> dict[str, int]:
    """What this worker holds once a trial's memory is freed: host RSS, device memory (GPU) and the pinned host
    blocks torch's host allocator still owns (GPU); the warm pool compares them with the floor (warm.py)."""
    held = {
        "host_rss_after_bytes": host_rss_bytes(),
        "device_after_bytes": memory.held_after_trial_bytes(),
        "zeropp_groups_after": zeropp_groups_left(),
    }
    if memory.device == "cuda":
        held["pinned_after_bytes"] = pinned_host_bytes()
    return {name: value for name, value in held.items() if value is not None}


def held_groups_report(rank: int, held: int, clock: PhaseClock) -> RankReport:
    """Refusing a trial in a worker that still holds an earlier trial's ZeRO++ groups: not the candidate's fault
    (inconclusive, so it runs once more, in new workers)."""
    error = f"this warm worker still holds {held} ZeRO++ process group(s) of an earlier trial; new workers run it"
    return RankReport(rank=rank, status="inconclusive", error=error, phases=dict(clock.phases))


def serve(pool_dir: Path, device: str, placement: Placement) -> bool:
    """Run successive trials in this process; stop after the first failure (its state is suspect)."""
    start_rank_files(pool_dir, placement.rank)
    import_runtime(device)
    memory = MemoryTracker(device, placement.local_rank)
    init_distributed(device, placement.local_rank)
    floor: dict[str, int] | None = None
    index = 0
    while not (request := _next_request(pool_dir, index)).get("stop"):
        out_dir = Path(request["out"])
        start_rank_files(out_dir, placement.rank)
        clock = PhaseClock(request["dispatched_at"])
        clock.mark("launch")
        if groups_left := zeropp_groups_left():  # the pool replaces such workers (warm.py): never measure on them
            write_report(out_dir, held_groups_report(placement.rank, groups_left, clock))
            return False
        try:
            spec = load_spec(Path(request["spec"]))
            if spec.world_size != placement.world_size or spec.device != device:
                raise ValueError(
                    f"warm worker is {placement.world_size}x{device}, trial wants {spec.world_size}x{spec.device}"
                )
            if floor is None:  # before the first trial: the model's modules imported, cuBLAS and NCCL warmed
                import_runtime(device, spec.architecture)
                settle(device, placement.local_rank)
                floor = held_between_trials(memory)
            memory.reset(record_sites=spec.record_peak_sites, sample_period_s=spec.sample_period_s)
            report = run_rank(spec, placement, clock, memory)  # returns once the trial's memory is freed
            held = held_between_trials(memory)
            report = dataclasses.replace(
                report, host_rss_after_bytes=held.get("host_rss_after_bytes"),
                device_after_bytes=held.get("device_after_bytes"), pinned_after_bytes=held.get("pinned_after_bytes"),
                zeropp_groups_after=held.get("zeropp_groups_after"), floor=floor,
            )  # fmt: skip
        except Exception as error:
            report = failure_report(placement.rank, error, clock)
        write_report(out_dir, dataclasses.replace(report, trial_in_process=index))
        if report.status not in HEALTHY_STATUSES:
            return False
        index += 1
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m autotune.trial.worker.main", description=__doc__)
    parser.add_argument("--spec", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--launched-at", type=float, default=None, help="epoch seconds when the launcher spawned us")
    parser.add_argument("--serve", type=Path, default=None, help="warm-worker pool directory")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--owner-pid", type=int, default=None, help="exit when this process is gone")
    parser.add_argument("--owner-heartbeat", type=Path, default=None, help="exit when this file stops changing")
    parser.add_argument("--owner-stale-s", type=float, default=None, help="how long --owner-heartbeat may stand still")
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # old launchers pass it
    args = parser.parse_args(argv)
    if args.serve is None and (args.spec is None or args.out is None):
        parser.error("--spec and --out are required unless --serve is given")
    if (args.owner_heartbeat is None) != (args.owner_stale_s is None):
        parser.error("--owner-heartbeat and --owner-stale-s go together")
    return args


def main(argv: list[str] | None = None) -> None:
    entered = time.time()
    args = parse_args(argv)
    placement = placement_from_env(os.environ)
    export_placement(placement)
    if args.owner_pid is not None:
        watch_owner(args.owner_pid)
    if args.owner_heartbeat is not None:
        watch_heartbeat(args.owner_heartbeat, args.owner_stale_s)
    if args.serve is not None:
        ok = serve(args.serve, args.device, placement)
    else:
        ok = run_once(args.spec, args.out, args.launched_at or entered, placement)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (module destructors, process-group shutdown): the result is written and
    # every collective has finished, so exiting now only saves time.
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
