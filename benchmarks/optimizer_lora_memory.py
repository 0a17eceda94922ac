"""Memory model vs measured CPU peak for LoRA (peft) and for each --optimizer.

    python benchmarks/optimizer_lora_memory.py            # CPU backend; writes results/optimizer_lora_cpu.json

Each point is one real trial through autotune.trial.run_trial (fresh process, DeepSpeed on the CPU backend,
glibc mmap threshold pinned as the tuner's CPU trials do), compared with autotune.estimate.estimate for the
same candidate, LoRA summary and optimizer. The measured figure is the rank's peak host RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.estimate import EstimateSettings, estimate
from autotune.hardware.specs import Target, generic_gpu
from autotune.infra.atomic import atomic_write_json
from autotune.models import resolve_model, summarize
from autotune.training.lora import LoraSettings, lora_summary
from autotune.trial import LocalLauncher, TrialSpec, run_trial
from estimate_accuracy import MALLOC_ENV, environment

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Point:
    model: str
    rung: str
    micro_batch: int
    seq_len: int
    optimizer: str = "adamw"
    lora_rank: int | None = None


# gpt2 (124M) so that the frozen base is a real share of the peak; short sequences keep bf16 CPU steps short.
POINTS = [
    Point("gpt2", "z0", 2, 64, lora_rank=8),
    Point("gpt2", "z2", 2, 64, lora_rank=8),
    Point("gpt2", "z3", 2, 64, lora_rank=8),
    Point("gpt2", "z0", 1, 32, optimizer="adamw"),
    Point("gpt2", "z0", 1, 32, optimizer="torch-adamw"),
    Point("gpt2", "z0", 1, 32, optimizer="adafactor"),
    Point("gpt2", "z2", 1, 32, optimizer="adafactor"),  # flat fp32 partition: not factored
]


def run_point(point: Point, precision: str = "bf16") -> dict:
    source = resolve_model(point.model)
    summary = summarize(source)
    lora = LoraSettings(point.lora_rank) if point.lora_rank else None
    if lora:
        summary = lora_summary(summary, lora)
    target = Target(generic_gpu(1024 * GiB), gpus_per_node=1, nodes=1, free_memory_bytes=1024 * GiB)
    candidate = Candidate(Rung(point.rung), point.micro_batch, False)
    settings = EstimateSettings(seq_len=point.seq_len, device="cpu", optimizer=point.optimizer, precision=precision)
    predicted = estimate(summary, target, candidate, settings)
    config = build_ds_config(
        candidate,
        TrainSettings(world_size=1, hidden_size=summary.hidden_size, optimizer=point.optimizer, precision=precision),
    )
    spec = TrialSpec(
        model_config=source.config,
        architecture=summary.architecture,
        family=summary.family,
        ds_config=config,
        seq_len=point.seq_len,
        device="cpu",
        warmup_steps=1,
        max_steps=2,
        timeout_s=1500,
        optimizer=point.optimizer,
        lora={**lora.to_dict(), "model_type": summary.model_type} if lora else None,
    )
    started = time.monotonic()
    result = run_trial(spec, LocalLauncher(env=MALLOC_ENV["mmap64k"]))
    measured = result.peak_memory_bytes
    row = {
        **point.__dict__,
        "precision": precision,
        "trainable_params": summary.trainable_params,
        "total_params": summary.total_params,
        "status": result.status,
        "error": result.error,
        "measured_bytes": measured,
        "predicted_bytes": predicted.gpu_peak_bytes,
        "predicted_components": predicted.gpu_components,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if measured:
        row["error_pct"] = round(100 * (predicted.gpu_peak_bytes - measured) / measured, 1)
    print(json.dumps({k: v for k, v in row.items() if k != "predicted_components"}), flush=True)
    return row


def repredict(path: Path) -> None:
    """Recompute every point's prediction with the current memory model (the measurements stay)."""
    data = json.loads(path.read_text())
    for row in data["points"]:
        point = Point(**{k: row[k] for k in Point.__dataclass_fields__})
        summary = summarize(resolve_model(point.model))
        if point.lora_rank:
            summary = lora_summary(summary, LoraSettings(point.lora_rank))
        target = Target(generic_gpu(1024 * GiB), gpus_per_node=1, nodes=1, free_memory_bytes=1024 * GiB)
        settings = EstimateSettings(
            seq_len=point.seq_len, device="cpu", optimizer=point.optimizer, precision=row["precision"]
        )
        predicted = estimate(summary, target, Candidate(Rung(point.rung), point.micro_batch, False), settings)
        row["predicted_bytes"], row["predicted_components"] = predicted.gpu_peak_bytes, predicted.gpu_components
        if row.get("measured_bytes"):
            row["error_pct"] = round(
                100 * (predicted.gpu_peak_bytes - row["measured_bytes"]) / row["measured_bytes"], 1
            )
    atomic_write_json(path, data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma-separated point indices")
    parser.add_argument("--precision", default="bf16", help="bf16 (default) or fp32 (much faster on CPUs without bf16)")
    parser.add_argument("--repredict", action="store_true", help="only recompute predictions in the results file")
    args = parser.parse_args()
    if args.repredict:
        repredict(RESULTS / f"optimizer_lora_cpu_{args.precision}.json")
        return
    chosen = [POINTS[int(i)] for i in args.only.split(",")] if args.only else POINTS
    out = RESULTS / f"optimizer_lora_cpu_{args.precision}.json"
    rows = json.loads(out.read_text())["points"] if args.only and out.exists() else []  # --only appends
    for point in chosen:  # written after every point, so an interrupted run keeps what it measured
        rows.append(run_point(point, args.precision))
        atomic_write_json(out, {"environment": environment("cpu"), "points": rows})


if __name__ == "__main__":
    main()
