"""The memory model against published, measured DeepSpeed GPU runs (benchmarks/published/points.json).

    python benchmarks/published_accuracy.py            # writes results/published_accuracy.json, prints a table
    python benchmarks/published_accuracy.py --label X  # tag the run (e.g. the code version it ran on)

Each point is a run someone published with the figure they measured and the settings they stated; what
they did not state is listed under "assumed" in points.json. Kinds of truth:
- "nvidia-smi": the device-level figure of a run that fitted. It shows the caching allocator's reserved
  high-water mark, which in a run with room to spare exceeds what the run needs (MemoryEstimate.
  gpu_unpressured_extra_bytes, estimate/runtime.py UNPRESSURED_OBSERVATIONS); near the card's size the allocator
  gives its cache back instead. So the figure is compared with min(peak + that extra, card memory); the error of
  the bare peak (what must fit) is reported next to it;
- "oom": the run did not fit the card: a "fits" verdict would be false;
- "max_memory_allocated": torch.cuda.max_memory_allocated() of a run that fitted (DeepSpeed's
  "MaxMemAllocated" log line, HF's memory metrics): tensors only, so it is compared with the predicted tensor
  peak, i.e. the peak less the allocator's slack, the CUDA context and NCCL (none of which torch counts);
- "max_memory_reserved": torch.cuda.max_memory_reserved() of a run that fitted: the tensor peak plus the
  allocator's reserve and unpressured cache, without context or NCCL;
- "ran": the run fit, no figure given: a "does not fit" verdict costs a true fit.
Every figure run also fit its card. Verdicts use the whole card (headroom 1.0): the margin must earn them.
DeepSpeed's estimator (model states only, its defaults) is run on the same points for comparison.
No GPU is needed: this runs the model, not the training.

Subsets (summary["subsets"]): "all"; "in_sample", the points the model was tuned while looking at;
"held_out", points added after the model was frozen (points.json "held_out": true, frozen at commit 80def53);
"fully_specified", points whose "unspecified" list is empty, i.e. the source itself states the sequence length
each sample reaches, the micro-batch, the ZeRO stage and offload, the precision, activation checkpointing and
the model (FULLY_SPECIFIED_SETTINGS). The list is filled from each point's stated/assumed entries, never from
its error.
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

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB
from autotune.estimate import EstimateSettings, check_fit, estimate
from autotune.hardware.specs import Target, generic_gpu
from autotune.models import ModelSummary, resolve_model, summarize

HERE = Path(__file__).resolve().parent
POINTS = HERE / "published" / "points.json"
MODELS = HERE / "published" / "models"
RESULTS = HERE / "results" / "published_accuracy.json"

# The settings a point's source must state itself for the point to count as fully specified (points.json
# "unspecified" lists those it does not; dynamic padding to an unknown length leaves "seq_len" unspecified).
FULLY_SPECIFIED_SETTINGS = ("seq_len", "micro_batch", "stage_offload", "precision", "grad_checkpointing", "model")
# Measurement kinds and what each counts: the device (nvidia-smi), torch's tensors (allocated), torch's cache.
FIGURE_KINDS = ("nvidia-smi", "max_memory_allocated", "max_memory_reserved")
MEASUREMENT_KINDS = (*FIGURE_KINDS, "oom", "ran")
# Components torch.cuda.max_memory_allocated() does not see (estimate/peak.py names them).
OUTSIDE_TORCH = ("cuda_context", "nccl_buffers", "nccl_nvls_buffers")
NOT_ALLOCATED = (*OUTSIDE_TORCH, "allocator_slack", "calibration_offset")

# How points.json names the optimizer -> the step-temporary kind in autotune.estimate.knobs.
OPTIMIZERS = {"adamw_torch": "torch_foreach", "adam_fused": "fused", "adamw_fused": "fused"}


@dataclass(frozen=True)
class Outcome:
    point_id: str
    kind: str
    measured_gib: float | None
    predicted_gib: float  # what the point's measurement would show (see _shown), at least the tensor peak
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
    held_out: bool = False
    fully_specified: bool = False


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
        optimizer=OPTIMIZERS[point.get("optimizer", "adam_fused")],
        zero_init=point.get("zero_init", True),
    )
    versions = point.get("stack_versions") or {}
    stack = RuntimeStack(
        torch_version=versions.get("torch"),
        cuda_version=versions.get("cuda"),
        nccl_version=versions.get("nccl"),
        compute_capability=versions.get("compute_capability"),
        transformers_version=versions.get("transformers"),  # the loss path and eager attention depend on it
        deepspeed_version=versions.get("deepspeed"),  # the offload path's gradient check depends on it
    )
    kernels = {"kernels": point["kernels"]} if "kernels" in point else {}  # fused kernels the run stated
    return EstimateSettings(**basics, knobs=knobs, stack=stack, **kernels)


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
    if measurement["kind"] not in MEASUREMENT_KINDS:
        raise ValueError(f"{point['id']}: unknown measurement kind {measurement['kind']!r}")
    measured = measurement.get("value_gib")
    measured_bytes = measured * GiB if measured is not None else None
    deepspeed = predicted.deepspeed_estimate_bytes
    shown = _shown(predicted, measurement["kind"], memory)
    return Outcome(
        point_id=point["id"],
        kind=measurement["kind"],
        measured_gib=measured,
        predicted_gib=shown / GiB,
        peak_gib=predicted.gpu_peak_bytes / GiB,
        margin_gib=getattr(predicted, "gpu_margin_bytes", 0) / GiB,
        error=(shown - measured_bytes) / measured_bytes if measured_bytes else None,
        peak_error=(_compared_peak(predicted, measurement["kind"]) - measured_bytes) / measured_bytes
        if measured_bytes
        else None,
        deepspeed_gib=deepspeed / GiB,
        deepspeed_error=(deepspeed - measured_bytes) / measured_bytes if measured_bytes else None,
        fits=check_fit(predicted, target, headroom=1.0).fits,
        deepspeed_fits=deepspeed <= memory,
        truth_fits=measurement["kind"] != "oom",
        components_gib={name: round(value / GiB, 3) for name, value in predicted.gpu_components.items()},
        held_out=bool(point.get("held_out", False)),
        fully_specified=is_fully_specified(point),
    )


def is_fully_specified(point: dict) -> bool:
    """The rule of the "fully_specified" subset: the source states every setting in FULLY_SPECIFIED_SETTINGS."""
    unspecified = point.get("unspecified")
    if unspecified is None:
        return False  # not classified: never counted as fully specified
    unknown = set(unspecified) - set(FULLY_SPECIFIED_SETTINGS)
    if unknown:
        raise ValueError(f"{point['id']}: unknown setting(s) in 'unspecified': {sorted(unknown)}")
    return not unspecified


def _tensor_peak(predicted) -> int:
    """What torch.cuda.max_memory_allocated() counts: the peak less what lives outside torch's tensors."""
    return predicted.gpu_peak_bytes - sum(predicted.gpu_components.get(name, 0) for name in NOT_ALLOCATED)


def _compared_peak(predicted, kind: str) -> int:
    """The bare prediction for a measurement kind (no unpressured cache): the peak, or the tensor peak."""
    if kind == "max_memory_allocated":
        return _tensor_peak(predicted)
    if kind == "max_memory_reserved":
        return predicted.gpu_peak_bytes - sum(predicted.gpu_components.get(name, 0) for name in OUTSIDE_TORCH)
    return predicted.gpu_peak_bytes


def _shown(predicted, kind: str, card_bytes: int) -> int:
    """What the measurement would read if the model were right.

    nvidia-smi (and the OOM / ran rows, shown for reading only): the peak plus the unpressured cache, capped by
    the card (near the card the allocator gives its cache back); max_memory_reserved: the same without context
    and NCCL; max_memory_allocated: tensors only.
    """
    extra = getattr(predicted, "gpu_unpressured_extra_bytes", 0)
    if kind == "max_memory_allocated":
        return _tensor_peak(predicted)
    torch_only = kind == "max_memory_reserved"  # nvidia-smi, and the OOM / ran verdict rows, see the device
    outside = sum(predicted.gpu_components.get(name, 0) for name in OUTSIDE_TORCH) if torch_only else 0
    peak = predicted.gpu_peak_bytes - outside
    return max(peak, min(peak + extra, card_bytes - outside))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _worst(values: list[float]) -> float | None:
    return max(values) if values else None


def summarise(outcomes: list[Outcome]) -> dict:
    errors = [abs(o.error) for o in outcomes if o.error is not None]
    peak_errors = [abs(o.peak_error) for o in outcomes if o.peak_error is not None]
    ds_errors = [abs(o.deepspeed_error) for o in outcomes if o.deepspeed_error is not None]
    signed = [o.error for o in outcomes if o.error is not None]
    worst = max((o for o in outcomes if o.error is not None), key=lambda o: abs(o.error), default=None)
    return {
        "points": len(outcomes),
        "figures": len(errors),
        "figures_by_kind": {kind: sum(o.kind == kind for o in outcomes) for kind in FIGURE_KINDS},
        "median_abs_error": _median(errors),
        "worst_abs_error": _worst(errors),
        "worst_point": worst.point_id if worst else None,
        "median_signed_error": _median(signed),
        "peak_median_abs_error": _median(peak_errors),
        "peak_worst_abs_error": _worst(peak_errors),
        "deepspeed_median_abs_error": _median(ds_errors),
        "deepspeed_worst_abs_error": _worst(ds_errors),
        "oom_points": sum(not o.truth_fits for o in outcomes),
        "false_fits": [o.point_id for o in outcomes if o.fits and not o.truth_fits],
        "missed_fits": [o.point_id for o in outcomes if not o.fits and o.truth_fits],
        "deepspeed_false_fits": [o.point_id for o in outcomes if o.deepspeed_fits and not o.truth_fits],
        "true_fits": sum(o.truth_fits for o in outcomes),
        "fits_without_margin_lost": [
            o.point_id for o in outcomes if o.truth_fits and not o.fits and o.peak_gib <= _card(o)
        ],
    }


SUBSETS = {
    "all": lambda o: True,
    "in_sample": lambda o: not o.held_out,
    "held_out": lambda o: o.held_out,
    "fully_specified": lambda o: o.fully_specified,
}


def summarise_subsets(outcomes: list[Outcome]) -> dict[str, dict]:
    return {name: summarise([o for o in outcomes if keep(o)]) for name, keep in SUBSETS.items()}


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
        "| point | set | model | ZeRO | GPUs | mb | seq | measured | autotune shown / peak (+margin) | error (peak) |"
        " DeepSpeed est. | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        p = points[o.point_id]
        rung = _rung(p).value
        measured = f"{o.measured_gib:.1f} GiB" if o.measured_gib is not None else o.kind.upper()
        if o.kind in ("max_memory_allocated", "max_memory_reserved"):
            measured += " (alloc)" if o.kind == "max_memory_allocated" else " (reserved)"
        subset = ("held-out" if o.held_out else "in-sample") + (", full" if o.fully_specified else "")
        error = f"{o.error:+.0%} ({o.peak_error:+.0%})" if o.error is not None and o.peak_error is not None else ""
        ds = f"{o.deepspeed_gib:.1f} GiB" + (f" ({o.deepspeed_error:+.0%})" if o.deepspeed_error is not None else "")
        verdict = "fits" if o.fits else "no fit"
        if o.fits != o.truth_fits:
            verdict += " (FALSE FIT)" if o.fits else " (true fit lost)"
        gpus = f"{p['gpus_per_node']}x{p['gpu_memory_gib']:g}G"
        lines.append(
            f"| {o.point_id} | {subset} | {p['model']} | {rung} | {gpus} | {p['micro_batch']} | {p['seq_len']} |"
            f" {measured} |"
            f" {o.predicted_gib:.1f} / {o.peak_gib:.1f} (+{o.margin_gib:.1f}) | {error} | {ds} | {verdict} |"
        )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def subset_table(subsets: dict[str, dict]) -> str:
    """One row per subset: our errors next to DeepSpeed's estimator's, false fits and true fits lost."""
    lines = [
        "| subset | points (figures / OOM) | autotune median / worst \\|error\\| (worst point) |"
        " DeepSpeed est. median / worst | false fits (ours / DeepSpeed's) | true fits lost (to the margin) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in subsets.items():
        lost = len(s["missed_fits"])
        lines.append(
            f"| {name} | {s['points']} ({s['figures']} / {s['oom_points']}) |"
            f" {_percent(s['median_abs_error'])} / {_percent(s['worst_abs_error'])} ({s['worst_point'] or '-'}) |"
            f" {_percent(s['deepspeed_median_abs_error'])} / {_percent(s['deepspeed_worst_abs_error'])} |"
            f" {len(s['false_fits'])} / {len(s['deepspeed_false_fits'])} |"
            f" {lost} of {s['true_fits']} ({len(s['fits_without_margin_lost'])}) |"
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
    summary["subsets"] = summarise_subsets(outcomes)
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
    print()
    print(subset_table(summary["subsets"]))
    print(json.dumps({k: v for k, v in summary.items() if k != "subsets"}, indent=1))


if __name__ == "__main__":
    main()
