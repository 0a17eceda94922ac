"""Does a warm worker measure what a fresh process would? The README demo's trials, warm and cold (CPU backend).

    python benchmarks/warm_workers.py [--out FILE.json] [--label TEXT]

`autotune` runs its CPU trials in warm workers (trial/launch/warm.py): one process serves trial after trial. What a
trial
measures must be what the user's job, a fresh process, would peak at; whatever an earlier trial left in the worker
is counted on top. This runs the trial order of the README demo (`autotune --model gpt2-small-demo --device cpu
--memory-budget 2GiB --seq-len 128 --precision fp32`) in one warm pool, as the tuner does (host-memory cap and
glibc setting included), then every trial again in a fresh process, and writes both peaks, the worker's RSS after
each trial and how often the pool replaced its workers. Point PYTHONPATH at another checkout's src/ to measure
that version (the workers inherit it).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import psutil

from autotune.core.ladder import Candidate, Rung
from autotune.core.units import GiB, MiB
from autotune.infra.atomic import atomic_write_json
from autotune.request.context import TuneContext
from autotune.request.tune_request import TuneRequest
from autotune.trial import LocalLauncher, TrialResult, WarmWorkerPool, run_trial
from autotune.trial.launch.ops import prebuild_ops

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "warm_workers_cpu.json"
# The order a fresh README demo tried them in (2026-11-24, benchmarks/README.md): every rung, checkpointing, both
# offloads, and a smaller micro-batch after a stop.
DEMO_ORDER = (
    ("z0", 32, False),
    ("z1", 32, False),
    ("z2", 32, False),
    ("z3", 32, False),
    ("z3", 64, True),
    ("z3+offload_opt", 32, False),
    ("z3+offload_opt+param", 32, False),
    ("z3+offload_opt+param", 16, False),
)
TUNER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # what tuner._launcher_for gives CPU trials


def demo_context() -> TuneContext:
    request = TuneRequest.of(
        model="gpt2-small-demo", device="cpu", memory_budget="2GiB", seq_len=128, precision="fp32", out="unused.json"
    )
    return TuneContext.build(request, outputs=False)


def _worker_rss(pool: WarmWorkerPool) -> list[int]:
    """The pool's worker processes' RSS now (between trials, so after the last one freed its memory)."""
    rss = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "autotune.trial.worker.main" in " ".join(child.cmdline()):
                rss.append(int(child.memory_info().rss))
        except psutil.Error:
            continue
    return rss


def _peak(result: TrialResult) -> int | None:
    peaks = [r.host_rss_peak_bytes for r in result.ranks if r.host_rss_peak_bytes]
    return max(peaks) if peaks else None


def _row(key: str, result: TrialResult) -> dict:
    return {"trial": key, "status": result.status, "error": result.error, "peak_bytes": _peak(result)}


def run(ctx: TuneContext) -> dict:
    candidates = [Candidate(Rung(rung), mb, ckpt) for rung, mb, ckpt in DEMO_ORDER]
    warm = []
    with WarmWorkerPool(env=TUNER_ENV) as pool:
        for candidate in candidates:
            result = run_trial(ctx.spec(candidate), pool)
            warm.append({**_row(candidate.key, result), "worker_rss_after_bytes": _worker_rss(pool)})
        restarts, recycled = pool.restarts, list(getattr(pool, "recycled", []))
    cold = [_row(c.key, run_trial(ctx.spec(c), LocalLauncher(env=TUNER_ENV))) for c in candidates]
    for row, fresh in zip(warm, cold, strict=True):
        row["cold_status"], row["cold_peak_bytes"] = fresh["status"], fresh["peak_bytes"]
        both = row["peak_bytes"] is not None and fresh["peak_bytes"] is not None
        row["warm_minus_cold_bytes"] = row["peak_bytes"] - fresh["peak_bytes"] if both else None
    return {"trials": warm, "pool_restarts": restarts, "recycled_growth_bytes": recycled}


def table(data: dict) -> str:
    lines = [
        "| trial | warm: status | warm peak | cold peak | warm - cold | worker RSS after |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["trials"]:
        after = ", ".join(f"{value / GiB:.3f}" for value in row["worker_rss_after_bytes"]) or "-"
        diff = row["warm_minus_cold_bytes"]
        lines.append(
            f"| {row['trial']} | {row['status']} | {_gib(row['peak_bytes'])} | {_gib(row['cold_peak_bytes'])} | "
            f"{'-' if diff is None else f'{diff / MiB:+.0f} MiB'} | {after} GiB |"
        )
    return "\n".join(lines)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.3f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--label", default=None, help="what code this measured (default: the checkout's commit)")
    args = parser.parse_args()
    prebuild_ops("cpu")
    ctx = demo_context()
    data = run(ctx)
    from compare.environment import git_revision, now_utc  # benchmarks/ is the script's directory, so on sys.path
    from estimate_accuracy import environment

    data["environment"] = {
        **environment("cpu"),
        "label": args.label or git_revision(HERE.parent)["commit"],
        "pythonpath": os.environ.get("PYTHONPATH"),
        "date": now_utc(),
    }
    atomic_write_json(args.out, data)
    print(table(data))
    print(f"pool restarts {data['pool_restarts']}, replaced on growth: {data['recycled_growth_bytes']}")


if __name__ == "__main__":
    main()
