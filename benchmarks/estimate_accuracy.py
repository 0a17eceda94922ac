"""How right is the memory model? Real DeepSpeed steps vs autotune's prediction, DeepSpeed's estimator alone,
and `accelerate estimate-memory`.

    python benchmarks/estimate_accuracy.py                  # CPU backend (DS_ACCELERATOR=cpu, gloo)
    python benchmarks/estimate_accuracy.py --device cuda    # on a GPU machine
    python benchmarks/estimate_accuracy.py --baseline       # measure the CPU process baseline constant
    python benchmarks/estimate_accuracy.py --rungs z3,z3+offload_opt --merge
        # re-measure only those rungs; every other row keeps its measurement and is re-predicted by the current
        # model (predictions are deterministic), so a model change is checked without re-running every trial

Each point is one trial through autotune.trial.run_trial (fresh processes, a few optimizer steps). On the
CPU backend the measured figure is each rank's peak host RSS (VmHWM), which is what the CPU-mode
prediction targets; it is not a GPU quantity. On CUDA it is NVML's device-used peak (context and NCCL
included), falling back to torch's max reserved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from autotune.core.ladder import Candidate, Mode, Rung
from autotune.core.units import GiB
from autotune.dsconfig.build_config import TrainSettings, build_ds_config
from autotune.estimate import EstimateSettings, estimate
from autotune.estimate.ds_estimators import deepspeed_estimators
from autotune.estimate.estimate_types import MemoryEstimate
from autotune.estimate.knobs import ZeroKnobs
from autotune.estimate.runtime import RuntimeStack
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.models.architecture import build_model
from autotune.models.profiles import find_profile
from autotune.modes.applies import ratio_mode
from autotune.trial import LocalLauncher, TrialSpec, run_trial

RESULTS = Path(__file__).resolve().parent / "results"


# glibc keeps freed heap memory (its mmap threshold rises to 32 MiB as large blocks are freed), so a CPU
# rank's peak RSS grows with allocation churn and keeps growing over steps. "mmap64k" pins the threshold
# (MALLOC_MMAP_THRESHOLD_=65536): freed tensors go back to the OS and RSS tracks live memory, which is
# what the model predicts. "default" is what the tuner's CPU trials see today.
MALLOC_ENV = {"default": {}, "mmap64k": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


@dataclass(frozen=True)
class Point:
    model: str
    rung: Rung
    micro_batch: int
    seq_len: int
    grad_checkpointing: bool = False
    ranks: int = 1
    malloc: str = "mmap64k"
    offload_ratio: float = 1.0  # partial optimizer offload (a modern mode, modes.applies); 1.0 = the classic rung

    @property
    def candidate(self) -> Candidate:
        mode = ratio_mode(self.offload_ratio) if self.offload_ratio != 1.0 else Mode()
        return Candidate(self.rung, self.micro_batch, self.grad_checkpointing, mode)


def _points(malloc: str, *rows: tuple) -> list[Point]:
    return [Point(m, Rung(r), mb, s, ck, n, malloc) for m, r, mb, s, ck, n in rows]


# Partial optimizer offload (a modern mode) between ZeRO-3 and ZeRO-3 + offload, ratios 0 and 0.5 beside the classic
# z3+offload_opt rows above (ratio 1). On the CPU backend the "GPU" and the host are one process, so the ratio
# moves bytes within the same RSS; what these rows check is that the memory model's mode terms keep the sum right.
# gpt2 (124M) on 2 ranks was tried too (2026-11-23) and hit the 600 s trial timeout on the shared machine (load 8).
PARTIAL_OFFLOAD_POINTS = [
    Point("gpt2-small-demo", Rung.Z3_OFFLOAD_OPT, 4, 256, False, 1, "mmap64k", ratio) for ratio in (0.0, 0.5, 1.0)
]


# About 20 trials: 10-15 minutes on two (shared) cores.
CPU_POINTS = (
    _points(
        "mmap64k",
        ("tiny-gpt2", "z0", 1, 128, False, 1),
        ("gpt2-small-demo", "z0", 8, 256, False, 1),
        ("gpt2-small-demo", "z0", 8, 256, True, 1),
        ("gpt2-small-demo", "z1", 4, 256, False, 2),
        ("gpt2-small-demo", "z2", 4, 256, False, 2),
        ("gpt2-small-demo", "z2+offload_opt", 4, 256, False, 1),
        ("gpt2-small-demo", "z3", 4, 256, False, 2),
        ("gpt2-small-demo", "z3+offload_opt+param", 4, 256, True, 1),
        ("tiny-llama", "z0", 8, 256, False, 1),
        ("tiny-t5", "z2", 8, 256, True, 1),
        ("gpt2", "z0", 4, 128, False, 1),
        ("gpt2", "z2", 2, 128, False, 2),
        ("gpt2", "z3+offload_opt", 2, 128, True, 2),
    )
    + _points(
        "default",
        ("tiny-t5", "z0", 4, 128, False, 1),
        ("gpt2-small-demo", "z0", 8, 256, True, 1),
        ("gpt2-small-demo", "z3+offload_opt+param", 4, 256, True, 1),
        ("gpt2", "z0", 4, 128, False, 1),
        ("gpt2", "z3+offload_opt", 2, 128, True, 2),
    )
    + PARTIAL_OFFLOAD_POINTS
)
CUDA_POINTS = _points(
    "default",
    ("gpt2", "z0", 8, 1024, False, 1),
    ("gpt2", "z0", 16, 1024, True, 1),
    ("gpt2-medium", "z2", 8, 1024, False, 1),
    ("gpt2-large", "z3", 4, 1024, True, 1),
    ("opt-1.3b", "z2+offload_opt", 4, 2048, True, 1),
    ("t5-base", "z2", 8, 512, False, 1),
    ("tiny-llama", "z0", 64, 256, False, 1),
)
BASELINE_POINT = Point("tiny-gpt2", Rung.Z0, 1, 128, malloc="default")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(device: str) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total},
        "versions": {p: _version(p) for p in ("torch", "deepspeed", "transformers", "accelerate", "autotune")}
        | {"python": platform.python_version()},
    }


def _target(ranks: int, device: str) -> Target:
    """Per-rank budget large enough that nothing is refused: we compare predictions, not verdicts."""
    return Target(generic_gpu(1024 * GiB), gpus_per_node=ranks, nodes=1, free_memory_bytes=1024 * GiB)


def deepspeed_alone(summary: ModelSummary, target: Target, rung: Rung) -> int:
    """What DeepSpeed's estimator (its defaults, additional_buffer_factor 1.5) says one rank needs.

    Stages 0 and 1 have no estimator; the stage-2 one is the closest it offers. On the CPU backend the
    offloaded share lives in the same process, so its CPU figure per rank is added.
    """
    ds = deepspeed_estimators()
    params = summary.total_params
    if rung.stage < 3:
        cpu, gpu = ds.zero2(params, target.gpus_per_node, target.nodes, rung.offload_optimizer is not None)
        return gpu + (cpu // target.world_size if rung.offload_optimizer else 0)
    cpu, gpu, _ = ds.zero3(
        params,
        summary.largest_layer_params,
        target.gpus_per_node,
        target.nodes,
        rung.offload_optimizer is not None,
        rung.offload_param is not None,
    )
    return gpu + (cpu // target.gpus_per_node if rung.offload_optimizer else 0)


def accelerate_estimate(summary: ModelSummary, hf_id: str | None) -> dict:
    """accelerate's 'Training using Adam' figure, from its own functions on our meta-device model.

    The CLI itself needs the Hub (it loads the config by repo id), which this machine cannot reach; the
    numbers below are what the CLI computes once it has the model.
    """
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    model, _ = build_model(summary.config, summary.architecture, "meta")
    total_size, _ = calculate_maximum_sizes(model)
    usage = estimate_training_usage(total_size, "bfloat16")
    result = {"training_bytes": max(usage.values()), "cli": "not run: synthetic model, no hub id"}
    if hf_id:
        result["cli"] = _accelerate_cli(hf_id)
    return result


def _accelerate_cli(hf_id: str) -> str:
    try:
        run = subprocess.run(
            ["accelerate", "estimate-memory", hf_id, "--dtypes", "float16"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"failed: {error}"
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    return f"exit {run.returncode}: {lines[-1][:200] if lines else ''}"


def predicted_trial(
    model: str,
    candidate: Candidate,
    seq_len: int,
    target: Target,
    device: str,
    precision: str,
    zero_init: bool = True,
    stack: RuntimeStack | None = None,
    optimizer: str = "adamw",
    **trial: object,
) -> tuple[ModelSummary, MemoryEstimate, TrialSpec]:
    """The prediction for one config and the trial that measures exactly that config (one node).

    `trial` sets the TrialSpec's measurement fields (steps, timeout, memory caps); the GPU kit uses this too.
    `zero_init`: ZeRO-3 builds under deepspeed.zero.Init (False: the whole model first), predicted alike.
    `optimizer`: an autotune.training.optimizers name (torch-adamw needs no DeepSpeed op), predicted alike.
    `stack`: the torch/CUDA/NCCL stack the trial runs with, as the tuner passes it (context.runtime_stack); None
    leaves it unknown, which widens the margin and, on a GPU, guesses the loss path and NCCL's buffers.
    """
    source = resolve_model(model)
    summary = summarize(source)
    knobs = ZeroKnobs(zero_init=zero_init)
    settings = EstimateSettings(
        seq_len=seq_len, precision=precision, device=device, knobs=knobs, stack=stack or RuntimeStack(),
        optimizer=optimizer,
    )  # fmt: skip
    predicted = estimate(summary, target, candidate, settings)
    train = TrainSettings(
        world_size=target.gpus_per_node,
        precision=precision,
        hidden_size=summary.hidden_size,
        trainable_params=summary.trainable_params,  # sizes sub_group_size for an offload ratio (autotune.modes.applies)
        optimizer=optimizer,
    )
    spec = TrialSpec(
        model_config=source.config,
        architecture=summary.architecture,
        family=summary.family,
        ds_config=build_ds_config(candidate, train),
        seq_len=seq_len,
        grad_checkpointing=candidate.grad_checkpointing,
        device=device,  # type: ignore[arg-type]
        nprocs_per_node=target.gpus_per_node,
        zero_init=zero_init,
        optimizer=optimizer,
        **trial,  # type: ignore[arg-type]
    )
    return summary, predicted, spec


def run_point(point: Point, device: str, precision: str) -> dict:
    target = _target(point.ranks, device)
    candidate = point.candidate
    summary, predicted, spec = predicted_trial(
        point.model, candidate, point.seq_len, target, device, precision, warmup_steps=1, max_steps=3, timeout_s=600
    )
    started = time.monotonic()
    result = run_trial(spec, LocalLauncher(env=MALLOC_ENV[point.malloc]) if device == "cpu" else None)
    measured = result.peak_memory_bytes
    profile = find_profile(point.model)
    row = {
        "model": point.model,
        "params": summary.total_params,
        "rung": point.rung.value,
        "micro_batch": point.micro_batch,
        "seq_len": point.seq_len,
        "grad_checkpointing": point.grad_checkpointing,
        "ranks": point.ranks,
        "malloc": point.malloc,
        "offload_ratio": point.offload_ratio,
        "status": result.status,
        "error": result.error,
        "measured_bytes": measured,
        "predicted_bytes": predicted.gpu_peak_bytes,
        "predicted_components": predicted.gpu_components,
        "deepspeed_alone_bytes": deepspeed_alone(summary, target, point.rung),
        "accelerate": accelerate_estimate(summary, profile.hf_id if profile else None),
        "wall_s": round(time.monotonic() - started, 1),
        "step_times_s": result.step_times_s,
        "engine_facts": result.engine_facts,
    }
    if measured:
        for key in ("predicted", "deepspeed_alone"):
            row[f"{key}_error_pct"] = round(100 * (row[f"{key}_bytes"] - measured) / measured, 1)
        row["accelerate_error_pct"] = round(100 * (row["accelerate"]["training_bytes"] - measured) / measured, 1)
    return row


def repredict(row: dict, device: str, precision: str) -> dict:
    """The row's stored measurement against the current model's prediction for the same point."""
    summary = summarize(resolve_model(row["model"]))
    target = _target(row["ranks"], device)
    ratio = row.get("offload_ratio", 1.0)
    mode = ratio_mode(ratio) if ratio != 1.0 else Mode()
    candidate = Candidate(Rung(row["rung"]), row["micro_batch"], row["grad_checkpointing"], mode)
    settings = EstimateSettings(seq_len=row["seq_len"], precision=precision, device=device)
    predicted = estimate(summary, target, candidate, settings)
    updated = dict(row, predicted_bytes=predicted.gpu_peak_bytes, predicted_components=predicted.gpu_components)
    if row.get("measured_bytes"):
        measured = row["measured_bytes"]
        updated["predicted_error_pct"] = round(100 * (predicted.gpu_peak_bytes - measured) / measured, 1)
    return updated


def _row_key(row: dict) -> tuple:
    keys = ("model", "rung", "micro_batch", "seq_len", "grad_checkpointing", "ranks", "malloc")
    return (*(row[k] for k in keys), row.get("offload_ratio", 1.0))


def _dynamic_error_pct(row: dict) -> float | None:
    """Error on what the model adds above the process baseline (which dominates tiny models on CPU)."""
    baseline = row["predicted_components"].get("process_baseline", 0)
    above = row["measured_bytes"] - baseline
    if not baseline or above <= 0:
        return None
    return round(100 * (row["predicted_bytes"] - baseline - above) / above, 1)


def _stats(errors: list[float]) -> dict:
    return {
        "median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 1),
        "worst_abs_error_pct": round(max(abs(e) for e in errors), 1),
        "median_signed_error_pct": round(statistics.median(errors), 1),
    }


def _errors(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("measured_bytes")]
    out: dict = {"points": len(rows), "measured": len(ok)}
    for key in ("predicted", "deepspeed_alone", "accelerate"):
        errors = [r[f"{key}_error_pct"] for r in ok]
        if errors:
            out[key] = _stats(errors)
    dynamic = [e for e in (_dynamic_error_pct(r) for r in ok if r.get("predicted_components")) if e is not None]
    if dynamic:
        out["predicted_above_baseline"] = _stats(dynamic)
    return out


def _summary(rows: list[dict]) -> dict:
    """Per allocator setting: the prediction targets live memory, so 'mmap64k' is the like-for-like figure."""
    return {
        malloc: _errors([r for r in rows if r.get("malloc") == malloc])
        for malloc in sorted({r.get("malloc") for r in rows})
    }


def measure_baseline(repeats: int, precision: str) -> dict:
    """Peak RSS of a rank training a 0.2M-parameter model, minus everything the model predicts besides the baseline."""
    runs = []
    for _ in range(repeats):
        row = run_point(BASELINE_POINT, "cpu", precision)
        if not row["measured_bytes"]:
            raise SystemExit(f"baseline trial failed: {row['status']}: {row['error']}")
        model_part = row["predicted_bytes"] - row["predicted_components"].get("process_baseline", 0)
        runs.append(
            {
                "measured_bytes": row["measured_bytes"],
                "model_part_bytes": model_part,
                "baseline_bytes": row["measured_bytes"] - model_part,
            }
        )
    return {"runs": runs, "median_baseline_bytes": int(statistics.median(r["baseline_bytes"] for r in runs))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON results (default: results/estimate_accuracy_<device>.json)"
    )
    parser.add_argument("--only", default=None, help="comma-separated model names to keep")
    parser.add_argument("--baseline", action="store_true", help="measure the CPU process baseline and exit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rungs", default=None, help="comma-separated rungs to keep (e.g. z3,z3+offload_opt)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="merge into the existing results: re-predict kept rows, replace re-measured ones",
    )
    parser.add_argument(
        "--partial-offload", action="store_true", help="only the partial optimizer offload points (a modern mode)"
    )
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    if args.baseline:
        data = environment("cpu") | {
            "baseline": measure_baseline(args.repeats, args.precision),
            "point": asdict(BASELINE_POINT) | {"rung": BASELINE_POINT.rung.value},
        }
        print(json.dumps(data, indent=2))
        return
    points = CPU_POINTS if args.device == "cpu" else CUDA_POINTS
    if args.only:
        keep = set(args.only.split(","))
        points = [p for p in points if p.model in keep]
    if args.partial_offload:
        points = [p for p in points if p in PARTIAL_OFFLOAD_POINTS]
    if args.rungs:
        rungs = set(args.rungs.split(","))
        points = [p for p in points if p.rung.value in rungs]
    out = args.out or RESULTS / f"estimate_accuracy_{args.device}.json"
    previous = json.loads(out.read_text()) if args.merge and out.exists() else None
    measure_base = args.device == "cpu" and previous is None
    baseline = measure_baseline(args.repeats, args.precision) if measure_base else None
    rows = []
    for point in points:
        row = run_point(point, args.device, args.precision)
        rows.append(row)
        print(_line(row), flush=True)
    remeasured = [_row_key(r) for r in rows]
    if previous is not None:
        kept = [repredict(r, args.device, args.precision) for r in previous["rows"] if _row_key(r) not in remeasured]
        order = {_row_key(r): i for i, r in enumerate(previous["rows"])}
        rows = sorted(kept + rows, key=lambda r: order.get(_row_key(r), len(order)))
    data = environment(args.device) | {
        "precision": args.precision,
        "measured_quantity": "peak host RSS per rank (VmHWM)" if args.device == "cpu" else "NVML device-used peak",
        "summary": _summary(rows),
        "rows": rows,
    }
    if previous is not None:
        data["merged"] = {
            "remeasured_rows": [list(k) for k in remeasured],
            # a re-prediction keeps the measurement date it found, not the date of the last merge
            "kept_rows_measured_on": previous.get("merged", {}).get("kept_rows_measured_on") or previous.get("date"),
            "kept_rows": "measurements kept, predictions recomputed by this code",
        }
        if "cpu_process_baseline_measurement" in previous:
            data["cpu_process_baseline_measurement"] = previous["cpu_process_baseline_measurement"]
    if baseline:
        data["cpu_process_baseline_measurement"] = baseline
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data["summary"], indent=2))
    print(f"wrote {out}")


def _line(row: dict) -> str:
    def mib(value: int | None) -> str:
        return f"{value / 2**20:8.1f}" if value else "       -"

    head = (
        f"{row['model']:16s} {row['rung']:22s} mb{row['micro_batch']:<3d} s{row['seq_len']:<5d} "
        f"{'ckpt' if row['grad_checkpointing'] else '    '} x{row['ranks']}"
    )
    if row.get("offload_ratio", 1.0) != 1.0:
        head += f" ratio {row['offload_ratio']:g}"
    return (
        f"{head} {row['status']:6s} measured {mib(row['measured_bytes'])} MiB  predicted "
        f"{mib(row['predicted_bytes'])} ({row.get('predicted_error_pct', '-')}%)"
        f"  DS {mib(row['deepspeed_alone_bytes'])}"
        f"  accel {mib(row['accelerate']['training_bytes'])}  [{row['wall_s']} s]"
    )


if __name__ == "__main__":
    main()
