"""A two-node tune, warm workers across nodes (the default) against a fresh launch per trial, side by side (CPU).

    python benchmarks/multinode_warm_cpu.py [--repeats 2] [--out results/multinode_warm_cpu.json]

Two "nodes" on this machine (one rank each, one master address, a torchrun per node: the path the hook and tune take
outside SLURM on the CPU backend), tiny GPT-2, the same search both ways: `--trial-workers auto` (warm workers across
both nodes, the pick confirmed in a fresh two-node launch: trial/launch/chooser.py) and `--trial-workers fresh`
(every trial a fresh launch of both nodes). The runs alternate (auto, fresh, auto, fresh, ...) so both see the same
load; each records its wall, its launches of both nodes (the report's process_starts; for fresh, one per trial),
its trials, its pick and the 1-minute load average before and after. No cache: every trial runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from autotune.core.ladder import Rung
from autotune.infra.atomic import atomic_write_json
from autotune.trial.launch.ops import prebuild_ops
from autotune.tuner import TuneRequest, tune

RESULTS = Path(__file__).resolve().parent / "results" / "multinode_warm_cpu.json"
WAYS = ("auto", "fresh")


def request(workers: str, out: Path) -> TuneRequest:
    return TuneRequest.of(
        model="tiny-gpt2",
        device="cpu",
        gpus=1,
        nodes=2,
        memory_budget="2GiB",
        seq_len=32,
        rungs=(Rung.Z0, Rung.Z2),
        micro_batches=(1, 2, 4),
        max_trials=6,
        trial_workers=workers,  # type: ignore[arg-type]
        out=str(out),
        use_cache=False,
    )


def one_tune(workers: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="multinode-warm-") as where:
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        result = tune(request(workers, Path(where) / "ds_config.json"))
        wall = time.monotonic() - started
        report = result.report.to_json()
    trials = report["trials"]
    starts = report["process_starts"]
    return {
        "trial_workers": workers,
        "wall_s": round(wall, 1),
        "launches_of_both_nodes": starts if starts is not None else len(trials),
        "trials": len(trials),
        "launches_by_purpose": report["launches_by_purpose"],
        "pick": report["choice"] and {k: report["choice"][k] for k in ("rung", "micro_batch", "grad_checkpointing")},
        "pick_samples_per_s": report["choice"] and report["choice"]["samples_per_s"],
        "trials_detail": [trial_row(t) for t in trials],
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
    }


def trial_row(trial: dict) -> dict:
    """One trial as the report has it: what ran, why, its wall (launch included) and its speed."""
    candidate, result = trial["candidate"], trial["result"]
    return {
        "candidate": f"{candidate['rung']}/mb{candidate['micro_batch']}{'/ckpt' * candidate['grad_checkpointing']}",
        "purpose": trial["purpose"],
        "status": result["status"],
        "wall_s": round(result["wall_s"], 2),
        "samples_per_s": round(result.get("samples_per_s") or 0.0, 1),
        "startup_s": round(result.get("startup_s") or 0.0, 2),
    }


def summary(runs: list[dict]) -> dict:
    out = {}
    for way in WAYS:
        mine = [r for r in runs if r["trial_workers"] == way]
        walls = [r["wall_s"] for r in mine]
        out[way] = {
            "runs": len(mine),
            "wall_s_median": statistics.median(walls),
            "wall_s_range": [min(walls), max(walls)],
            "launches_of_both_nodes": sorted({r["launches_of_both_nodes"] for r in mine}),
            "trials": sorted({r["trials"] for r in mine}),
            "picks": sorted({str(r["pick"]) for r in mine}),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    prebuild_ops("cpu")  # outside every timing: the first DeepSpeed op build takes minutes
    runs = []
    for repeat in range(args.repeats):
        for way in WAYS:
            print(f"repeat {repeat}: --trial-workers {way}", file=sys.stderr, flush=True)
            runs.append(one_tune(way))
            print(runs[-1], file=sys.stderr, flush=True)
    import deepspeed
    import torch

    atomic_write_json(
        args.out,
        {
            "benchmark": "two-node tune on one machine, warm workers across nodes vs a fresh launch per trial (CPU)",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "cores": os.cpu_count(),
            "runs": runs,
            "summary": summary(runs),
        },
    )


if __name__ == "__main__":
    main()
