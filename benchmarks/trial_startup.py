"""Where a trial's wall time goes, and what the start-up cuts save (CPU backend).

    python benchmarks/trial_startup.py [--trials 5] [--measure-op-builds] [--out FILE.json]

Runs successive tiny GPT-2 trials (stage 0, world size 1) three ways: torchrun even for one rank
(the plain launcher, "before"), the worker started directly, and the warm worker pool; plus one
two-rank trial, and model materialisation of a GPT-2-small-sized model on CPU: torch default init
followed by HF init versus meta + to_empty + HF init once. --measure-op-builds also times DeepSpeed's
JIT op builds in a throw-away TORCH_EXTENSIONS_DIR (minutes), leaving the shared cache alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.trial import LocalLauncher, TrialResult, TrialSpec, WarmWorkerPool, run_trial
from autotune.trial.launch.ops import prebuild_ops

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1024, "n_positions": 256}
GPT2_SMALL = {
    "model_type": "gpt2",
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
}

MATERIALISE = """
import json, sys, time, torch, transformers
from autotune.models.architecture import build_model
config = json.loads(sys.argv[1])
transformers.GPT2LMHeadModel  # import outside the timed region
started = time.perf_counter()
build_model(config, "GPT2LMHeadModel", device="cpu")
direct = time.perf_counter() - started
started = time.perf_counter()
model, _ = build_model(config, "GPT2LMHeadModel", device="meta")
model.to_empty(device="cpu")
model.init_weights()
meta = time.perf_counter() - started
params = sum(p.numel() for p in model.parameters())
print(json.dumps({"params": params, "direct_init_s": round(direct, 3), "meta_to_empty_init_s": round(meta, 3)}))
"""


def tiny_spec(nprocs: int = 1) -> TrialSpec:
    settings = TrainSettings(world_size=nprocs, precision="bf16", hidden_size=64)
    return TrialSpec(
        model_config=TINY_GPT2,
        architecture="GPT2LMHeadModel",
        family="decoder-only",
        ds_config=build_ds_config(Candidate(Rung.Z0, micro_batch=2), settings),
        seq_len=128,
        device="cpu",
        nprocs_per_node=nprocs,
        warmup_steps=1,
        max_steps=5,
        timeout_s=900,
    )


def summary(result: TrialResult) -> dict:
    steps_s = result.phases.get("warmup", 0.0) + result.phases.get("measured", 0.0)
    return {
        "status": result.status,
        "wall_s": round(result.wall_s, 2),
        "startup_s": round(result.startup_s or 0.0, 2),
        "steps_s": round(steps_s, 2),
        "phases": result.phases,
    }


def run_series(launcher: object, count: int, nprocs: int = 1) -> list[dict]:
    results = []
    for _ in range(count):
        result = run_trial(tiny_spec(nprocs), launcher)  # type: ignore[arg-type]
        if not result.ok:
            raise SystemExit(f"benchmark trial failed: {result.status}: {result.error}")
        results.append(summary(result))
    return results


def mean_of(series: list[dict], key: str) -> float:
    return round(statistics.mean(item[key] for item in series), 2)


def materialisation() -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", MATERIALISE, json.dumps(GPT2_SMALL)],
        capture_output=True, text=True, check=True, env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    return json.loads(completed.stdout.strip().splitlines()[-1])


def op_builds() -> dict:
    with tempfile.TemporaryDirectory(prefix="torch-ext-") as scratch:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": scratch, "DS_ACCELERATOR": "cpu"}
        completed = subprocess.run(
            [sys.executable, "-m", "autotune.trial.worker.ops_build", "--device", "cpu"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def machine() -> dict:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "deepspeed": version("deepspeed"),
        "transformers": version("transformers"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--measure-op-builds", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trial_startup_cpu.json")
    args = parser.parse_args()

    report: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine()}
    if args.measure_op_builds:
        report["op_build_s"] = op_builds()
    report["op_load_cached_s"] = prebuild_ops("cpu")
    report["torchrun_cold"] = run_series(LocalLauncher(use_torchrun=True), args.trials)
    report["direct_cold"] = run_series(LocalLauncher(), args.trials)
    with WarmWorkerPool() as pool:
        report["warm_pool"] = run_series(pool, args.trials)
    report["two_rank_cold"] = run_series(LocalLauncher(), 1, nprocs=2)
    report["materialisation_gpt2_small"] = materialisation()
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["mean_wall_s"] = {
        name: mean_of(report[name], "wall_s") for name in ("torchrun_cold", "direct_cold", "warm_pool", "two_rank_cold")
    }
    report["mean_wall_s"]["warm_pool_after_first"] = mean_of(report["warm_pool"][1:], "wall_s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["mean_wall_s"], indent=2))
    print(f"wrote {args.out} in {time.process_time():.0f} s of CPU")


if __name__ == "__main__":
    main()
