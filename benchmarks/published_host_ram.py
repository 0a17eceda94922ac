"""The host-RAM model against published host outcomes of ZeRO-3 with CPU offload (published/host_points.json).

For each point: autotune's host RAM per node for exactly the stated config, with and without the cached
per-parameter pinned partitions of zero.Init (estimate/buffers.py zero_init_pinned_partitions, the component
these points were looked at for), beside the figure or the out-of-memory limit the source gives. A "G" in a
source is read both ways (GB and GiB), so each verdict is shown for both.

    python benchmarks/published_host_ram.py [--out results/published_host_ram.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autotune.core.ladder import Candidate
from autotune.core.units import GiB
from autotune.estimate import estimate
from autotune.hardware.specs import Target, generic_gpu
from autotune.infra.atomic import atomic_write_json
from published_accuracy import HERE, _environment, _model, _rung, _settings

POINTS = HERE / "published" / "host_points.json"
RESULTS = HERE / "results" / "published_host_ram.json"
COMPONENT = "zero_init_pinned_partitions"
READINGS = {"GB": 1e9, "GiB": float(GiB)}  # what a source's "G" may mean


def run_point(point: dict) -> dict:
    model = _model(point["model"])
    target = Target(
        generic_gpu(round(point["gpu_memory_gib"] * GiB)),
        gpus_per_node=point["gpus_per_node"],
        nodes=point["nodes"],
        free_memory_bytes=round(point["gpu_memory_gib"] * GiB),
    )
    candidate = Candidate(_rung(point), point["micro_batch"], grad_checkpointing=True)
    predicted = estimate(model, target, candidate, _settings(point, model))
    now = predicted.host_ram_bytes
    before = now - predicted.host_components.get(COMPONENT, 0)
    row = {
        "point_id": point["id"],
        "model": point["model"],
        "params": model.total_params,
        "gpus_per_node": point["gpus_per_node"],
        "predicted_gib": round(now / GiB, 1),
        "predicted_without_component_gib": round(before / GiB, 1),
        "component_gib": round(predicted.host_components.get(COMPONENT, 0) / GiB, 1),
        "host_components_gib": {name: round(value / GiB, 1) for name, value in predicted.host_components.items()},
        "measurement": point["measurement"],
        "by_reading": {},
    }
    measurement = point["measurement"]
    for unit, scale in READINGS.items():
        reading: dict = {}
        if "low_g" in measurement:
            low, high = measurement["low_g"] * scale, measurement["high_g"] * scale
            reading["measured_gib"] = [round(low / GiB, 1), round(high / GiB, 1)]
            for name, value in (("now", now), ("without_component", before)):
                inside = low <= value <= high
                gap = 0.0 if inside else (value - low if value < low else value - high) / (low if value < low else high)
                reading[f"error_to_range_{name}"] = round(gap, 3)
        for key in ("oom_g", "limit_g"):
            if key in measurement:
                limit = measurement[key] * scale
                reading["oom_at_gib"] = round(limit / GiB, 1)
                reading["fits_now"] = now <= limit
                reading["fits_without_component"] = before <= limit
        row["by_reading"][unit] = reading
    return row


COLUMNS = ("point", "GPUs", "published", "predicted now (component)", "without it",
           "verdict at the OOM limit: now / without")  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        m = row["measurement"]
        published = f"{m['low_g']}-{m['high_g']}G used" if "low_g" in m else ""
        limit = m.get("oom_g") or m.get("limit_g")
        published += f"{'; ' if published else ''}OOM with {limit}G" if limit else ""
        verdicts = []
        for unit, reading in row["by_reading"].items():
            if "fits_now" in reading:
                now = "fits" if reading["fits_now"] else "no fit"
                without = "fits" if reading["fits_without_component"] else "no fit"
                verdicts.append(f"{unit}: {now} / {without}")
        lines.append(
            f"| {row['point_id']} | {row['gpus_per_node']} | {published} | {row['predicted_gib']} GiB"
            f" ({row['component_gib']}) | {row['predicted_without_component_gib']} GiB | {'; '.join(verdicts)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    points = json.loads(POINTS.read_text())["points"]
    rows = [run_point(point) for point in points]
    atomic_write_json(args.out, {"environment": _environment("host RAM"), "outcomes": rows})
    print(table(rows))


if __name__ == "__main__":
    main()
