"""What a warm worker must release between ZeRO++ trials, checked on the installed DeepSpeed (CPU backend, gloo).

    python benchmarks/zeropp_groups_cpu.py [--out results/zeropp_groups_cpu.json]

Two ranks on this machine (gloo over loopback). Each rank calls the two deepspeed.utils.groups functions that a
ZeRO++ engine calls when it is built (hpZ: `_create_zero_param_parallel_group`, from stage3.py and
partition_parameters.py; qgZ: `_get_local_all_to_all_group`, from engine.py), twice, as two successive trials in one
warm worker would:
1. as the warm worker runs them today (nothing released between trials);
2. with the process groups released between trials through `deepspeed.comm.destroy_process_group(group)`.
Records, per way, whether the second hpZ call succeeds and how many process groups are alive after it (torch's
registry, `torch.distributed.distributed_c10d._world.pg_map`). No engine is built: the calls are the part of an
engine's build that touches those globals, so the figures say what the globals do, not what a whole trial leaks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

from autotune.infra.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results" / "zeropp_groups_cpu.json"
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive_groups() -> int:
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def _say(message: str) -> None:
    print(f"[rank {os.environ.get('RANK')}] {message}", file=sys.stderr, flush=True)


def _trial(release: bool) -> dict:
    """One 'trial': the groups a ZeRO++ engine makes; with `release`, destroyed afterwards."""
    import deepspeed.comm as dist
    from deepspeed.utils import groups

    outcome: dict = {"hpz_ok": True, "error": None}
    _say(f"trial, release={release}")
    try:
        groups._create_zero_param_parallel_group(WORLD)
    except AssertionError as error:
        outcome.update(hpz_ok=False, error=f"AssertionError: {error}")
    _say("hpZ group done")
    all_to_all = dict(groups._get_local_all_to_all_group())
    _say("all-to-all groups done")
    outcome["all_to_all_groups"] = len(all_to_all)
    if release:
        made = [groups._ZERO_PARAM_INTRA_PARALLEL_GROUP, *all_to_all.values()]
        for group in made:
            if group is not None:
                dist.destroy_process_group(group)
        _say("released")
    outcome["alive_after"] = _alive_groups()
    return outcome


def _rank(rank: int, port: int, queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_SIZE="1",  # the CPU accelerator's device_count: one "device" per node, two nodes
        DS_ACCELERATOR="cpu",
        GLOO_SOCKET_IFNAME="lo",
    )
    import deepspeed

    _say("imported")
    deepspeed.init_distributed(dist_backend="gloo")
    _say("initialised")
    import deepspeed.comm as dist

    rows = {}
    for release in (False, True):
        dist.barrier()
        start = _alive_groups()
        first, second = _trial(release), _trial(release)
        rows["released" if release else "kept"] = {"alive_at_start": start, "first": first, "second": second}
        if not release:  # start the second way clean: drop what the first way left
            from deepspeed.utils import groups

            groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    queue.put((rank, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import multiprocessing

    import deepspeed
    import torch

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    started = time.monotonic()
    ranks = [context.Process(target=_rank, args=(r, port, queue)) for r in range(WORLD)]
    for process in ranks:
        process.start()
    results = dict(queue.get(timeout=600) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    data = {
        "benchmark": "ZeRO++ process groups in a warm worker (deepspeed.utils.groups), CPU backend",
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "world_size": WORLD,
        "load_average": os.getloadavg(),
        "elapsed_s": round(time.monotonic() - started, 1),
        "ranks": results,
    }
    atomic_write_text(args.out, json.dumps(data, indent=2) + "\n")
    print(json.dumps(results[0], indent=2))


if __name__ == "__main__":
    main()
