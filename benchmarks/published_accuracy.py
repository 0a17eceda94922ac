"""The memory model against published, measured DeepSpeed GPU runs (benchmarks/published/points.json).

    python benchmarks/published_accuracy.py            # writes results/published_accuracy.json, prints a table
    python benchmarks/published_accuracy.py --label X  # tag the run (e.g. the code version it ran on)

Each point is a run someone published with the figure they measured and the settings they stated; what
they did not state is listed under "assumed" in points.json. Three kinds of truth:
- "nvidia-smi": the device-level figure of a run that fitted. It shows the caching allocator's reserved
  high-water mark, which in a run with room to spare exceeds what the run needs (MemoryEstimate.
  gpu_unpressured_extra_bytes, estimate/runtime.py UNPRESSURED_OBSERVATIONS); near the card's size the allocator
  gives its cache back instead. So the figure is compared with min(peak + that extra, card memory); the error of
  the bare peak (what must fit) is reported next to it;
- "oom": the run did not fit the card: a "fits" verdict would be false;
- "ran": the run fit, no figure given: a "does not fit" verdict costs a true fit.
Every figure run also fit its card. Verdicts use the whole card (headroom 1.0): the margin must earn them.
DeepSpeed's estimator (model states only, its defaults) is run on the same points for comparison.
No GPU is needed: this runs the model, not the training.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from autotune.estimate import EstimateSettings, check_fit, estimate
from autotune.hardware import Target, generic_gpu
from autotune.ladder import Candidate, Rung
from autotune.models import ModelSummary, resolve_model, summarize
from autotune.units import GiB

HERE = Path(__file__).resolve().parent
POINTS = HERE / "published" / "points.json"
MODELS = HERE / "published" / "models"
RESULTS = HERE / "results" / "published_accuracy.json"

# How points.json names the optimizer -> the step-temporary kind in autotune.estimate.knobs.
OPTIMIZERS = {"adamw_torch": "torch_foreach", "adam_fused": "fused", "adamw_fused": "fused"}


@dataclass(frozen=True)
class Outcome:
    point_id: str
    kind: str
    measured_gib: float | None
    predicted_gib: float  # what nvidia-smi would show: min(peak + unpressured cache, card), at least the peak
    peak_gib: float
    margin_gib: float
    error: float | None  # (what nvidia-smi would show - measured) / measured
    peak_error: float | None  # (predicted peak - measured) / measured
    deepspeed_gib: float
    deepspeed_error: float | None
    fits: bool
    deepspeed_fits: bool
    truth_fits: bool
    components_gib: dict[str, float]


def _rung(point: dict) -> Rung:
    stage = point["stage"]
    value = f"z{stage}"
    if point.get("offload_optimizer"):
        value += "+offload_opt"
    if point.get("offload_param"):
        value += "+param"
    return Rung(value)


def _model(name: str) -> ModelSummary:
    local = MODELS / f"{name}.json"
    return summarize(resolve_model(str(local) if local.exists() else name))


def _settings(point: dict, model: ModelSummary) -> EstimateSettings:
    """The point's settings; on a checkout without ds_config knobs (before this benchmark) only the basics."""
    basics = {"seq_len": point["seq_len"], "precision": point["precision"], "attention": point.get("attention", "sdpa")}
    if "knobs" not in EstimateSettings.__dataclass_fields__:
        return EstimateSettings(**basics)
    from autotune.estimate.knobs import ZeroKnobs
    from autotune.estimate.runtime import RuntimeStack

    knobs = ZeroKnobs.from_ds_config(
        point.get("zero", {}),
        model.hidden_size,
        point["stage"],
        point.get("gradient_accumulation_steps", 1),
        OPTIMIZERS[point.get("optimizer", "adam_fused")],
        point.get("zero_init", True),
    )
    versions = point.get("stack_versions") or {}
    stack = RuntimeStack(
        torch_version=versions.get("torch"),
        cuda_version=versions.get("cuda"),
        nccl_version=versions.get("nccl"),
        compute_capability=versions.get("compute_capability"),
    )
    return EstimateSettings(**basics, knobs=knobs, stack=stack)


def run_point(point: dict) -> Outcome:
    model = _model(point["model"])
    memory = round(point["gpu_memory_gib"] * GiB)
    target = Target(
        gpu=generic_gpu(memory),
        gpus_per_node=point["gpus_per_node"],
        nodes=point.get("nodes", 1),
        free_memory_bytes=memory,
    )
    settings = _settings(point, model)
    candidate = Candidate(_rung(point), point["micro_batch"], point.get("grad_checkpointing", False))
    predicted = estimate(model, target, candidate, settings)
    measurement = point["measurement"]
    measured = measurement.get("value_gib")
    measured_bytes = measured * GiB if measured is not None else None
    deepspeed = predicted.deepspeed_estimate_bytes
    extra = getattr(predicted, "gpu_unpressured_extra_bytes", 0)
    shown = max(predicted.gpu_peak_bytes, min(predicted.gpu_peak_bytes + extra, memory))
    return Outcome(
        point_id=point["id"],
        kind=measurement["kind"],
        measured_gib=measured,
        predicted_gib=shown / GiB,
        peak_gib=predicted.gpu_peak_bytes / GiB,
        margin_gib=getattr(predicted, "gpu_margin_bytes", 0) / GiB,
        error=(shown - measured_bytes) / measured_bytes if measured_bytes else None,
        peak_error=(predicted.gpu_peak_bytes - measured_bytes) / measured_bytes if measured_bytes else None,
        deepspeed_gib=deepspeed / GiB,
        deepspeed_error=(deepspeed - measured_bytes) / measured_bytes if measured_bytes else None,
        fits=check_fit(predicted, target, headroom=1.0).fits,
        deepspeed_fits=deepspeed <= memory,
        truth_fits=measurement["kind"] != "oom",
        components_gib={name: round(value / GiB, 3) for name, value in predicted.gpu_components.items()},
    )


def summarise(outcomes: list[Outcome]) -> dict:
    errors = [abs(o.error) for o in outcomes if o.error is not None]
    peak_errors = [abs(o.peak_error) for o in outcomes if o.peak_error is not None]
    ds_errors = [abs(o.deepspeed_error) for o in outcomes if o.deepspeed_error is not None]
    signed = [o.error for o in outcomes if o.error is not None]
    return {
        "points": len(outcomes),
        "figures": len(errors),
        "median_abs_error": statistics.median(errors),
        "worst_abs_error": max(errors),
        "median_signed_error": statistics.median(signed),
        "peak_median_abs_error": statistics.median(peak_errors),
        "peak_worst_abs_error": max(peak_errors),
        "deepspeed_median_abs_error": statistics.median(ds_errors),
        "deepspeed_worst_abs_error": max(ds_errors),
        "false_fits": [o.point_id for o in outcomes if o.fits and not o.truth_fits],
        "missed_fits": [o.point_id for o in outcomes if not o.fits and o.truth_fits],
        "deepspeed_false_fits": [o.point_id for o in outcomes if o.deepspeed_fits and not o.truth_fits],
        "true_fits": sum(o.truth_fits for o in outcomes),
        "fits_without_margin_lost": [
            o.point_id for o in outcomes if o.truth_fits and not o.fits and o.peak_gib <= _card(o)
        ],
    }


_CARDS: dict[str, float] = {}


def _card(outcome: Outcome) -> float:
    return _CARDS[outcome.point_id]


def _environment(label: str) -> dict:
    return {
        "label": label,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "deepspeed": metadata.version("deepspeed"),
        "note": "the model is evaluated on a CPU machine; the figures are the published GPU measurements",
    }


def table(outcomes: list[Outcome], points: dict[str, dict]) -> str:
    lines = [
        "| point | model | ZeRO | GPUs | mb | seq | measured | autotune shown / peak (+margin) | error (peak) |"
        " DeepSpeed est. | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        p = points[o.point_id]
        rung = _rung(p).value
        measured = f"{o.measured_gib:.1f} GiB" if o.measured_gib is not None else o.kind.upper()
        error = f"{o.error:+.0%} ({o.peak_error:+.0%})" if o.error is not None and o.peak_error is not None else ""
        ds = f"{o.deepspeed_gib:.1f} GiB" + (f" ({o.deepspeed_error:+.0%})" if o.deepspeed_error is not None else "")
        verdict = "fits" if o.fits else "no fit"
        if o.fits != o.truth_fits:
            verdict += " (FALSE FIT)" if o.fits else " (true fit lost)"
        gpus = f"{p['gpus_per_node']}x{p['gpu_memory_gib']:g}G"
        lines.append(
            f"| {o.point_id} | {p['model']} | {rung} | {gpus} | {p['micro_batch']} | {p['seq_len']} | {measured} |"
            f" {o.predicted_gib:.1f} / {o.peak_gib:.1f} (+{o.margin_gib:.1f}) | {error} | {ds} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="autotune", help="tag stored with the results")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    points = json.loads(POINTS.read_text())["points"]
    by_id = {p["id"]: p for p in points}
    outcomes = []
    for point in points:
        _CARDS[point["id"]] = point["gpu_memory_gib"]
        outcomes.append(run_point(point))
    summary = summarise(outcomes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "environment": _environment(args.label),
                "summary": summary,
                "outcomes": [o.__dict__ for o in outcomes],
            },
            indent=1,
        )
    )
    tmp.replace(args.out)
    print(table(outcomes, by_id))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
