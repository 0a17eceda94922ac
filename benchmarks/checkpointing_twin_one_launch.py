"""Could one launch measure a rung both without and with gradient checkpointing? (CPU backend, the README demo's model)

    python benchmarks/checkpointing_twin_one_launch.py [--out FILE.json]

A measurement, not a feature: the search's launch breakdown (`search_quality.py`, `launch_breakdown`) counts 30 of
its 216 simulated fresh launches as a checkpointed group's first trial where the same rung without checkpointing had
already run. Those could share that launch's process if the engine it built could also be timed with checkpointing
switched on (HF's `gradient_checkpointing_enable` sets a flag the layers read at each forward; DeepSpeed's engine
does not depend on it). This checks whether such a "twin" point agrees with a fresh trial of the same config:

- in one fresh process, the tuner's trial of (rung, m, no checkpointing), exactly as `run_rank` runs it; then, in the
  same engine, checkpointing switched on and plain micro-steps at micro-batch c timed in their own memory phase
  (`MemoryTracker.phase`); the twin's peak is implied as `TrialResult.smaller_peak_point` implies one: the trial's
  peak less the drop from the trial's micro-steps to the twin's;
- a fresh trial of (rung, c, checkpointing) through `run_trial`, as the tuner launches it.

It prints both peaks and micro-step times side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import MiB
from autotune.infra.atomic import atomic_write_json
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.trial import LocalLauncher, run_trial
from autotune.trial.launch.ops import prebuild_ops

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "checkpointing_twin_one_launch_cpu.json"
CASES = ((Rung.Z0, 8, 16), (Rung.Z2, 8, 16))  # (rung, m without checkpointing, c with it)
TUNER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # what tuner._launcher_for gives CPU trials
TWIN_STEPS = 5  # plain micro-steps timed at the twin point (the trial's parts use PART_STEPS = 3)


def demo_context() -> TuneContext:
    request = TuneRequest.of(
        model="gpt2-small-demo", device="cpu", memory_budget="8GiB", seq_len=128, precision="fp32", out="unused.json"
    )
    return TuneContext.build(request, outputs=False)


def twin_worker(spec_path: Path, twin_micro_batch: int, out: Path) -> None:
    """One process: the trial as run_rank runs it, then the twin point in the same engine."""
    import torch

    from autotune.trial.trial_types import TrialSpec
    from autotune.trial.worker import train_steps as training
    from autotune.trial.worker.memory import MemoryTracker

    spec = TrialSpec(**json.loads(spec_path.read_text()))
    placement = training.Placement(0, 0, 1)
    training.import_runtime(spec.device, spec.architecture)
    memory = MemoryTracker(spec.device, 0)
    training.init_distributed(spec.device, 0)
    memory.reset()
    clock = training.PhaseClock(time.time())
    device = torch.device("cpu")
    model = training.build_trial_model(spec, device)
    engine = training.initialize_engine(model, spec.ds_config, spec.optimizer)
    engine.train()
    micro_batch = engine.train_micro_batch_size_per_gpu()
    batch = training.synthetic_batch(
        model, spec.family, micro_batch, spec.seq_len, device=device, seed=0, decoder_seq_len=spec.decoder_seq_len
    )
    smaller = None
    if spec.smaller_micro_batch and spec.smaller_micro_batch < micro_batch:  # as run_rank: the trial's two points
        smaller = training.synthetic_batch(
            model,
            spec.family,
            spec.smaller_micro_batch,
            spec.seq_len,
            device=device,
            seed=0,
            decoder_seq_len=spec.decoder_seq_len,
        )
    times = training.timed_steps(engine, batch, spec, placement, memory=memory, clock=clock, smaller_batch=smaller)
    twin_batch = training.synthetic_batch(
        model, spec.family, twin_micro_batch, spec.seq_len, device=device, seed=0, decoder_seq_len=spec.decoder_seq_len
    )
    training.enable_grad_checkpointing(model)
    with memory.phase("twin"):
        training._micro_step(engine, twin_batch, False)  # untimed: the first step with checkpointing switched on
        twin = training._timed(
            lambda: training._micro_step(engine, twin_batch, False), placement, device, memory, steps=TWIN_STEPS
        )
    metrics = memory.metrics(0)
    result = {
        "trial_peak_bytes": metrics.host_rss_peak_bytes,
        "trial_micro_peak_bytes": metrics.micro_peak_bytes,
        "twin_phase_peak_bytes": memory._phase_peaks.get("twin"),
        "trial_micro_step_s": times.micro_step_s,
        "trial_step_times_s": times.step_times_s,
        "twin_micro_step_s": statistics.median(twin),
        "twin_micro_step_times_s": twin,
    }
    out.write_text(json.dumps(result))
    os._exit(0)  # as the trial worker leaves: no process group teardown race at exit


def run_twin(ctx: TuneContext, rung: Rung, micro_batch: int, twin_micro_batch: int) -> dict:
    spec = ctx.spec(Candidate(rung, micro_batch, False))
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out = Path(tmp) / "spec.json", Path(tmp) / "twin.json"
        spec_path.write_text(json.dumps(spec.to_dict()))
        env = {**os.environ, **TUNER_ENV, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
        subprocess.run(
            [sys.executable, __file__, "--worker", str(spec_path), str(twin_micro_batch), str(out)], env=env, check=True
        )
        return json.loads(out.read_text())


def measure(ctx: TuneContext, rung: Rung, micro_batch: int, twin_micro_batch: int) -> dict:
    twin = run_twin(ctx, rung, micro_batch, twin_micro_batch)
    fresh = run_trial(ctx.spec(Candidate(rung, twin_micro_batch, True)), LocalLauncher(env=TUNER_ENV))
    implied = None
    if twin["trial_micro_peak_bytes"] is not None and twin["twin_phase_peak_bytes"] is not None:
        implied = twin["trial_peak_bytes"] - (twin["trial_micro_peak_bytes"] - twin["twin_phase_peak_bytes"])
    return {
        "rung": rung.value,
        "micro_batch": micro_batch,
        "twin_micro_batch": twin_micro_batch,
        "twin": twin,
        "twin_implied_peak_bytes": implied,
        "fresh_status": fresh.status,
        "fresh_peak_bytes": fresh.peak_memory_bytes,
        "fresh_micro_step_s": fresh.micro_step_s,
        "fresh_step_times_s": fresh.step_times_s,
    }


def _seconds(value: float | None) -> str:
    """A trial times its plain micro-step only where it accumulates or builds its second point from parts
    (trial/worker/train_steps.py timed_steps); elsewhere there is none to show."""
    return "?" if value is None else f"{value:.3f} s"


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        twin_worker(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    prebuild_ops("cpu")
    ctx = demo_context()
    from compare.environment import git_revision, load_average, now_utc  # benchmarks/ is on sys.path
    from estimate_accuracy import environment

    load_before = load_average()
    rows = [measure(ctx, rung, m, c) for rung, m, c in CASES]
    data = {
        "rows": rows,
        "environment": {
            **environment("cpu"),
            **git_revision(HERE.parent),
            "date": now_utc(),
            "load_before": load_before,
            "load": load_average(),
        },
    }
    atomic_write_json(args.out, data)
    header = ("rung", "no-ckpt m", "ckpt c", "twin implied peak", "fresh ckpt peak", "twin - fresh", "twin micro-step")
    print("| " + " | ".join(header) + " | fresh micro-step |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        implied, fresh = r["twin_implied_peak_bytes"], r["fresh_peak_bytes"]
        diff = f"{(implied - fresh) / MiB:+.1f} MiB" if implied is not None and fresh else "?"
        print(
            f"| {r['rung']} | {r['micro_batch']} | {r['twin_micro_batch']} | {(implied or 0) / MiB:.0f} MiB"
            f" | {(fresh or 0) / MiB:.0f} MiB | {diff} | {r['twin']['twin_micro_step_s']:.3f} s"
            f" | {_seconds(r['fresh_micro_step_s'])} |"
        )


if __name__ == "__main__":
    main()
