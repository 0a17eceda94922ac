"""Does one launch give two points of a group's memory line? (CPU backend, the README demo's model)

    python benchmarks/memory_line_one_launch.py [--out FILE.json]

Every trial also times half its micro-batch in the same process, and measures the forward/backward's own peak at
each (trial/worker/memory.py MemoryTracker.phase). The trial's peak less the difference between the two is the
peak it implies at the half micro-batch (TrialResult.smaller_peak_point): what the search draws its group's line
through after one trial instead of two. This runs micro-batch m and 2m of the same rung, each in a fresh process,
and puts the point implied by the 2m trial beside the peak the m trial measured, both ways a trial builds its second
point (trial/worker/train_steps.py timed_steps): `whole`, whole steps at the half (the demo has no fixed global
batch, so the default), and `parts`, plain micro-steps at both micro-batches (what a fixed global batch gets,
forced here through TrialSpec.fixed_global_batch on the same config). The peaks of the two ways differ where the
plain micro-steps hold something a job without accumulation never holds; the model's fp32 gradient size is written
beside them to compare.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import MiB
from autotune.infra.atomic import atomic_write_json
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.trial import LocalLauncher, run_trial
from autotune.trial.launch.ops import prebuild_ops
from autotune.trial.trial_types import TrialSpec

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "memory_line_one_launch_cpu.json"
PAIRS = ((Rung.Z0, 8), (Rung.Z0, 16), (Rung.Z2, 8), (Rung.Z3, 8))  # (rung, m): trials at m and 2m
TUNER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # what tuner._launcher_for gives CPU trials


def demo_context() -> TuneContext:
    request = TuneRequest.of(
        model="gpt2-small-demo", device="cpu", memory_budget="8GiB", seq_len=128, precision="fp32", out="unused.json"
    )
    return TuneContext.build(request, outputs=False)


WAYS = {"whole": False, "parts": True}  # way -> TrialSpec.fixed_global_batch


def measure(ctx: TuneContext, rung: Rung, micro_batch: int, way: str) -> dict:
    def spec(m: int) -> TrialSpec:
        return dataclasses.replace(ctx.spec(Candidate(rung, m, False)), fixed_global_batch=WAYS[way])

    small = run_trial(spec(micro_batch), LocalLauncher(env=TUNER_ENV))
    large = run_trial(spec(2 * micro_batch), LocalLauncher(env=TUNER_ENV))
    implied = large.smaller_peak_point
    row = {
        "rung": rung.value,
        "micro_batch": micro_batch,
        "way": way,
        "status": [small.status, large.status],
        "measured_peak_bytes": small.peak_memory_bytes,
        "large_peak_bytes": large.peak_memory_bytes,
        "implied_micro_batch": implied[0] if implied else None,
        "implied_peak_bytes": implied[1] if implied else None,
    }
    if implied and small.peak_memory_bytes:
        row["implied_minus_measured_bytes"] = implied[1] - small.peak_memory_bytes
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    prebuild_ops("cpu")
    ctx = demo_context()
    rows = [measure(ctx, rung, m, way) for rung, m in PAIRS for way in WAYS]
    from compare.environment import (  # benchmarks/ is the script directory, so on sys.path
        git_revision,
        load_average,
        now_utc,
    )
    from estimate_accuracy import environment

    data = {
        "rows": rows,
        "fp32_gradient_bytes": 4 * ctx.model.total_params,  # one fp32 gradient of every parameter
        "environment": {**environment("cpu"), **git_revision(HERE.parent), "date": now_utc(), "load": load_average()},
    }
    atomic_write_json(args.out, data)
    print(f"fp32 gradients of the model: {data['fp32_gradient_bytes'] / MiB:.1f} MiB")
    print("| rung | m | way | measured peak at m | implied by the 2m trial | implied - measured | peak at 2m |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        diff = r.get("implied_minus_measured_bytes")
        print(
            f"| {r['rung']} | {r['micro_batch']} | {r['way']} | {(r['measured_peak_bytes'] or 0) / MiB:.1f} MiB |"
            f" {(r['implied_peak_bytes'] or 0) / MiB:.1f} MiB | {'-' if diff is None else f'{diff / MiB:+.1f} MiB'} |"
            f" {(r['large_peak_bytes'] or 0) / MiB:.1f} MiB |"
        )


if __name__ == "__main__":
    main()
