"""Which modern DeepSpeed modes run on the CPU backend (DS_ACCELERATOR=cpu, gloo): one real trial per mode.

Each mode's config comes from autotune.dsconfig.build_config (the config autotune emits), runs through
autotune.trial.run_trial
on a tiny GPT-2, and the outcome (ok, or DeepSpeed's first error line) goes to
benchmarks/results/modes_cpu_backend.json. autotune.modes.applies.CPU_BACKEND restates the outcome; the slow test
tests/test_modes_cpu.py re-runs it and fails when they disagree.

    PYTHONPATH=src python3 benchmarks/modes_cpu_backend.py [--out benchmarks/results/modes_cpu_backend.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.infra.atomic import atomic_write_text
from autotune.modes.applies import HPZ, PARTIAL_OFFLOAD, QUANTIZED_GRADIENTS, QUANTIZED_WEIGHTS, SUPER_OFFLOAD, ZENFLOW
from autotune.trial import LocalLauncher, TrialSpec, run_trial
from autotune.trial.launch.ops import prebuild_ops

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}
TINY_GPT2_PARAMS = 182_400  # counted by the trial worker (count_parameters) for TINY_GPT2; sizes sub_group_size

# (family, rung, mode, ranks): ZeRO++ needs >1 rank for a partition group, so it runs on 2 ranks, hpZ over both.
CASES: list[tuple[str, Rung, Mode, int]] = [
    (PARTIAL_OFFLOAD, Rung.Z3_OFFLOAD_OPT, Mode(offload_ratio=0.5), 1),
    (ZENFLOW, Rung.Z2_OFFLOAD_OPT, Mode(zenflow=True), 1),
    (HPZ, Rung.Z3, Mode(hpz_partition_size=2), 2),
    (QUANTIZED_WEIGHTS, Rung.Z3, Mode(quantized_weights=True), 2),
    (QUANTIZED_GRADIENTS, Rung.Z3, Mode(quantized_gradients=True), 2),
    (SUPER_OFFLOAD, Rung.Z3_OFFLOAD_OPT, Mode(super_offload=True), 1),
]


def mode_spec(rung: Rung, mode: Mode, ranks: int, precision: str = "bf16", timeout_s: float = 900.0) -> TrialSpec:
    settings = TrainSettings(world_size=ranks, precision=precision, hidden_size=64, trainable_params=TINY_GPT2_PARAMS)
    return TrialSpec(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(rung, 2, False, mode), settings),
        seq_len=64,
        device="cpu",
        nprocs_per_node=ranks,
        nodes=1,
        warmup_steps=1,
        max_steps=3,
        timeout_s=timeout_s,
    )


def run_case(family: str, rung: Rung, mode: Mode, ranks: int) -> dict:
    result = run_trial(mode_spec(rung, mode, ranks), LocalLauncher(env={"OMP_NUM_THREADS": "1"}))
    return {
        "family": family,
        "rung": rung.value,
        "mode": mode.to_dict(),
        "ranks": ranks,
        "runs": result.ok,
        "status": result.status,
        "error": result.error or "",
        "step_times_s": result.step_times_s,
        "peak_host_rss_bytes": result.peak_memory_bytes,
        # what the engine really ran (trial/worker/train_steps.py engine_mode_facts)
        "engine_facts": result.engine_facts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/modes_cpu_backend.json")
    parser.add_argument("--only", nargs="*", help="families to re-run, keeping the others' rows (default: all)")
    args = parser.parse_args(argv)
    prebuild_ops("cpu")
    previous = json.loads(Path(args.out).read_text())["rows"] if args.only and Path(args.out).exists() else []
    rows = [row for row in previous if row["family"] not in (args.only or [])]
    for family, rung, mode, ranks in CASES:
        if args.only and family not in args.only:
            continue
        row = run_case(family, rung, mode, ranks)
        print(f"{family:22s} {'runs' if row['runs'] else 'FAILS'} {row['error']}", flush=True)
        rows.append(row)
    order = [case[0] for case in CASES]
    rows.sort(key=lambda row: order.index(row["family"]))
    import deepspeed
    import torch

    record = {
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "date": datetime.date.today().isoformat(),
        "rows": rows,
    }
    atomic_write_text(Path(args.out), json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
