"""Tuning cost and quality, side by side in one run: autotune vs DeepSpeed Autotuning vs an exhaustive grid.

    python benchmarks/compare_tuners.py                      # CPU backend, about 15-20 minutes on 2 cores
    python benchmarks/compare_tuners.py --render-only benchmarks/results/compare_cpu.json
    python benchmarks/compare_tuners.py --device cuda --model gpt2-large --seq-len 512 \\
        --micro-batches 1,2,4,8 --emulate-gpu-gb 24 --tight-budget none   # GPU variant (needs a GPU)

On the same machine, in one run, the same model is tuned three ways over the grid all three can express
(ZeRO stages 0-3 without offload x the given micro-batches, at one global batch):
  1. exhaustive: every grid point as a real autotune trial; the best measured within the memory limit wins;
  2. autotune: tune(TuneRequest.of(...)) restricted to the same rungs and micro-batches;
  3. DeepSpeed Autotuning: `deepspeed --autotuning tune` in fast mode with the same stages and micro-batches.
Each method's wall time to a recommendation and its process launches are recorded; each chosen config is
then re-measured with one fixed trial so the throughputs compare. A second scenario gives autotune a
per-rank memory budget that binds (DeepSpeed's autotuner has no host-memory cap, so it sits that one out).
Finally the cache-hit latency of a repeated `autotune` invocation is timed.

Every figure in benchmarks/results/compare.md and the chart comes from the JSON this writes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="compare_tuners.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    parser.add_argument("--model", default="tiny-gpt2", help="autotune --model spec (default: tiny-gpt2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batches", default="1,16", help="comma list; each must divide the largest")
    parser.add_argument("--ranks", type=int, default=1, help="CPU processes or GPUs on this node")
    parser.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--headroom", type=float, default=0.9)
    parser.add_argument(
        "--memory-budget", default=None, help="scenario 1 per-rank budget, CPU only (default 8GiB: does not bind)"
    )
    parser.add_argument(
        "--tight-budget",
        default="auto",
        help="scenario 2 per-rank budget, CPU only: auto (from the grid), none, or a size",
    )
    parser.add_argument("--gpu-memory-fraction", type=float, default=None, help="GPU variant: emulate a smaller card")
    parser.add_argument("--emulate-gpu-gb", type=float, default=None, help="GPU variant: card size to emulate, GB")
    parser.add_argument(
        "--autotune-rungs", default="z0,z1,z2,z3", help="autotune's ladder (GPU variant: add offload rungs)"
    )
    parser.add_argument("--max-trials", type=int, default=12, help="autotune's trial budget (its default: 12)")
    parser.add_argument("--warmup", type=int, default=3, help="re-measurement warm-up steps")
    parser.add_argument("--steps", type=int, default=10, help="re-measurement measured steps (at most)")
    parser.add_argument("--repeats", type=int, default=5, help="re-measurement warm repeats per config")
    parser.add_argument("--launcher", choices=("local", "warm"), default="local", help="trial launcher for both")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/MKL threads in every trial process of all three methods (0: torch's default). On a shared"
        " host, two OpenMP threads wait on the core other jobs hold, which swamps the differences being measured",
    )
    parser.add_argument("--trial-timeout", type=float, default=900.0)
    parser.add_argument("--ds-timeout", type=float, default=1800.0)
    parser.add_argument("--skip-ds", action="store_true", help="leave DeepSpeed's autotuner out (debugging)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep trial and autotuner files here")
    parser.add_argument("--out-json", type=Path, default=None)
    parser.add_argument("--chart", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--render-only", type=Path, default=None, help="redraw chart and markdown from this JSON")
    return parser.parse_args(argv)


def _outputs(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    suffix = "cpu" if args.device == "cpu" else "gpu"
    return (
        args.out_json or RESULTS / f"compare_{suffix}.json",
        args.chart or RESULTS / f"compare_{suffix}.png",
        args.markdown or RESULTS / ("compare.md" if suffix == "cpu" else "compare_gpu.md"),
    )


def _settings(args: argparse.Namespace):
    from compare.environment import gpu_total_bytes
    from compare.settings import BenchSettings, Measurement, parse_ints, parse_rungs

    fraction = args.gpu_memory_fraction
    if args.emulate_gpu_gb is not None:
        fraction = min(1.0, args.emulate_gpu_gb * 1e9 / gpu_total_bytes())
    cpu = args.device == "cpu"
    settings = BenchSettings(
        model=args.model,
        device=args.device,
        seq_len=args.seq_len,
        micro_batches=parse_ints(args.micro_batches),
        ranks=args.ranks,
        precision=args.precision,
        headroom=args.headroom,
        memory_budget=(args.memory_budget or "8GiB") if cpu else None,
        tight_budget=args.tight_budget if cpu and args.tight_budget != "none" else None,
        gpu_memory_fraction=fraction,
        autotune_rungs=parse_rungs(args.autotune_rungs),
        max_trials=args.max_trials,
        trial_timeout_s=args.trial_timeout,
        ds_timeout_s=args.ds_timeout,
        measurement=Measurement(args.warmup, args.steps, args.repeats),
        launcher=args.launcher,
        threads=args.threads or None,
    )
    settings.check()
    return settings


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    json_path, chart_path, markdown_path = _outputs(args)
    from compare.output import write_chart, write_json, write_markdown
    from compare.pipeline import run_benchmark, say

    if args.render_only:
        data = json.loads(args.render_only.read_text())
    else:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="compare-tuners-"))
        data = run_benchmark(_settings(args), workdir, skip_ds=args.skip_ds)
        write_json(data, json_path)
        say(f"wrote {json_path}")
    write_chart(data, chart_path)
    write_markdown(
        data,
        markdown_path,
        chart_path.relative_to(REPO / "benchmarks").as_posix()
        if chart_path.is_relative_to(REPO / "benchmarks")
        else str(chart_path),
    )
    say(f"wrote {chart_path} and {markdown_path}")


if __name__ == "__main__":
    main()
