"""The dry run's tune driven by the GPU default's launchers on the CPU backend: trials in warm workers, then the
pick in a fresh process once they stop (tuning/trials.py launcher_for does this on GPUs only), so the lease's dry
run exercises the tune's fresh confirmation and its time, as the GPU lease will.

    python3 benchmarks/gpu/gpu_default_tune.py --model tiny-llama --seq-len 64 --memory-budget 3GiB \
        --rungs z0,z3 --max-trials 2 --micro-batches 1,4 --time-budget 60 --out DIR/ds_config.json

Prints the report as `autotune tune --json` does; progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from autotune import tune
from autotune.core.ladder import Rung
from autotune.search.records import SearchEvent
from autotune.trial import FreshAfterWarm, LocalLauncher, WarmWorkerPool
from autotune.trial.launch.chooser import TrialLaunchers
from autotune.tuner import TuneRequest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--memory-budget", required=True)
    parser.add_argument("--rungs", required=True)
    parser.add_argument("--max-trials", type=int, required=True)
    parser.add_argument("--micro-batches", required=True)
    parser.add_argument("--time-budget", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    request = TuneRequest.of(
        model=args.model, device="cpu", memory_budget=args.memory_budget, seq_len=args.seq_len,
        rungs=tuple(Rung(r) for r in args.rungs.split(",")), max_trials=args.max_trials,
        micro_batches=tuple(int(m) for m in args.micro_batches.split(",")), time_budget_s=args.time_budget,
        out=args.out, use_cache=False,
    )  # fmt: skip

    def say(event: SearchEvent) -> None:
        print(f"[tune] {event.kind} {event.candidate.key if event.candidate else ''} {event.message or ''}",
              file=sys.stderr, flush=True)  # fmt: skip

    env = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # as launcher_for sets it for CPU trials
    with WarmWorkerPool(env=env) as pool:
        confirm = FreshAfterWarm(pool, LocalLauncher(env=env))
        result = tune(request, launcher=TrialLaunchers(pool, confirm), observe=say)
    print(json.dumps(result.report.to_json() if result.report else {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
